"""End-to-end: numbers the ``polyloop`` command cannot trust, from a provider (a negative token
count) or from its own flags (NaN, infinity), never switch a budget off."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e import test_cli as base
from tests.e2e.test_cli import CLI, SlowableServer, read_call, run_args, run_id_of
from tests.fakes.openai_server import completion, tool_call

pytest.importorskip("typer")
pytest.importorskip("openai")

# The fixtures of the CLI tests.
cli, fake, workspace = base.cli, base.fake, base.workspace


def test_a_negative_prompt_count_does_not_let_the_run_sail_past_its_token_budget(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    # The first reply reports -100000 prompt tokens; trusted, the 99 tokens of each later
    # reply would take a thousand steps to reach 500. Refused, the seventh step reaches it.
    first = completion(
        tool_calls=[tool_call("read_file", '{"path": "notes.txt"}', id="call_0")],
        usage=(-100_000, 17),
    )
    fake.script(first, *(read_call(n=i) for i in range(1, 12)))
    done = cli(*run_args(fake, workspace, "--max-tokens", "500", "--max-steps", "12"))
    assert done.code == 3, done
    run_id = run_id_of(done.out)
    assert f"run {run_id}: token_budget after 7 steps, 7 actions" in done.out, done
    assert "refused the reported usage" in done.err, done


@pytest.mark.parametrize(
    "flag", [("--max-seconds", "nan"), ("--max-cost", "inf"), ("--timeout", "nan")]
)
def test_a_flag_that_is_not_a_finite_number_is_a_one_line_usage_error(
    cli: CLI, fake: SlowableServer, workspace: Path, flag: tuple[str, str]
) -> None:
    done = cli(*run_args(fake, workspace, *flag))
    assert done.code == 2, done
    lines = done.err.strip().splitlines()
    assert len(lines) == 1 and flag[0] in lines[0] and "finite" in lines[0], done
    assert not fake.requests  # nothing started
