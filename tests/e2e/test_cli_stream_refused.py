"""End-to-end: ``polyloop run --stream`` against a server that refuses to stream a reply, as
llama-cpp-python's does for a tool call under ``tool_choice`` "auto" (the fake sends the bytes
recorded from it: :func:`tests.fakes.openai_server.stream_refused`). The run goes on with whole
replies, the command says so once, and the journal records the refused attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import test_cli as base
from tests.e2e.test_cli import CLI, SlowableServer, read_call, run_args, sql
from tests.fakes.openai_server import completion, stream_refused

pytest.importorskip("typer")
pytest.importorskip("openai")

# The fixtures of the CLI tests.
cli, fake, workspace = base.cli, base.fake, base.workspace


def test_run_stream_against_a_server_that_refuses_to_stream_goes_on_with_whole_replies(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(stream_refused(), read_call(), completion("The notes hold a launch code."))
    done = cli(*run_args(fake, workspace, "--stream"))
    assert done.code == 0, done
    assert "agent_finished after 2 steps" in done.out, done
    said = [line for line in done.err.splitlines() if "refused to stream" in line]
    assert len(said) == 1 and said[0].startswith("polyloop: warning: "), done
    assert f"{fake.url}/ (model 'test-model') refused to stream" in said[0], done
    assert [r.body.get("stream") for r in fake.requests] == [True, None, None]
    assert fake.requests[1].body["messages"] == fake.requests[0].body["messages"]
    rows = sql(
        cli.cwd / "j.db",
        "SELECT step_idx, attempt, state, error FROM model_calls ORDER BY step_idx, attempt",
    )
    assert [row[:3] for row in rows] == [(0, 1, "retried"), (0, 2, "ok"), (1, 1, "ok")]
    assert "ended before its first event" in rows[0][3], rows
    assert "[kind=stream_refused, retryable=True]" in rows[0][3], rows
    assert rows[1][3] is None and rows[2][3] is None
