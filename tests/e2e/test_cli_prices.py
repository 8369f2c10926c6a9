"""End-to-end: ``polyloop run --price-in/--price-out`` price a run (and are stored with it, so a
resume prices the same way), and a budget that cannot be measured says so on stderr and in the
run's detail, against a fake OpenAI-compatible server on 127.0.0.1."""

# The fixtures cli, fake and workspace are test_cli's, imported: the tests' parameters name them.
# ruff: noqa: F811

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli import CLI, Live, cli, fake, run_args, run_id_of, workspace  # noqa: F401
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    completion,
    completion_stream,
    hang,
    tool_call,
)

pytest.importorskip("typer")
pytest.importorskip("openai")


def read_call(n: int, usage: tuple[int, int] | None = (82, 17)) -> dict[str, object]:
    return {
        "tool_calls": [tool_call("read_file", json.dumps({"path": "notes.txt"}), id=f"c{n}")],
        "id": f"chatcmpl-{n}",
        "usage": usage,
    }


def run_row(cwd: Path, run_id: str) -> tuple[object, ...]:
    with sqlite3.connect(cwd / "j.db") as db:
        row = db.execute(
            "SELECT stop_reason, cost_usd, usage_missing, stop_detail FROM runs WHERE run_id = ?",
            (run_id,),
        ).fetchone()
    assert row is not None
    return tuple(row)


def test_price_flags_price_the_run_and_a_resume_prices_it_the_same_way(
    cli: CLI, fake: FakeOpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    # 1M input + 1M output tokens a call at $1 and $2 per million: $3 a call.
    fake.script(completion(**read_call(1, (1_000_000, 1_000_000))), hang())  # type: ignore[arg-type]
    prices = ("--price-in", "1", "--price-out", "2", "--max-cost", "100")
    proc = Live(cli, *run_args(fake, workspace, *prices))
    try:
        proc.wait_for(r"^step +0 ")
        deadline = time.monotonic() + 20
        while len(fake.requests) < 2:  # step 1's model call is in flight
            assert time.monotonic() < deadline, proc.out()
            time.sleep(0.02)
    finally:
        proc.kill()  # SIGKILL: the resume rebuilds the model from the stored config
    run_id = run_id_of(proc.out())
    with FakeOpenAIServer() as other:
        other.script(completion("All read.", usage=(1_000_000, 1_000_000)))
        again = cli("resume", run_id, "--journal", "j.db", "--base-url", other.url)
    assert again.code == 0, again
    assert run_row(tmp_path, run_id)[:3] == ("agent_finished", 6.0, 0), again


def test_price_flags_go_together_and_take_dollars_per_million(
    cli: CLI, fake: FakeOpenAIServer, workspace: Path
) -> None:
    alone = cli(*run_args(fake, workspace, "--price-in", "1"))
    assert alone.code == 1 and "--price-in and --price-out go together" in alone.err, alone
    negative = cli(*run_args(fake, workspace, "--price-in", "-1", "--price-out", "1"))
    assert negative.code == 1 and "--price-in" in negative.err, negative
    assert "Traceback" not in alone.err + negative.err
    assert not fake.requests  # nothing started
    shown = cli("run", "--help")
    assert "--price-in" in shown.out and "--price-out" in shown.out
    assert "--price-in" in cli("batch", "--help").out


def test_a_cost_budget_without_a_price_says_it_cannot_be_measured(
    cli: CLI, fake: FakeOpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    # openai:test-model is in no price table, and the server reports no cost.
    fake.script(*(completion(**read_call(n)) for n in (1, 2)))  # type: ignore[arg-type]
    done = cli(*run_args(fake, workspace, "--max-cost", "0.01", "--max-steps", "2"))
    assert done.code == 3, done
    run_id = run_id_of(done.out)
    stop_reason, cost, missing, detail = run_row(tmp_path, run_id)
    assert (stop_reason, cost, missing) == ("step_budget", 0.0, 2)
    assert isinstance(detail, str) and "max_cost cannot be measured" in detail
    assert "'openai:test-model' has no price" in detail and "--price-in" in detail
    assert done.err.count("max_cost cannot be measured") == 1, done  # warned once
    assert "detail: max_cost cannot be measured" in done.out, done


def test_a_token_budget_against_a_stream_without_usage_says_it_cannot_be_measured(
    cli: CLI, fake: FakeOpenAIServer, workspace: Path, tmp_path: Path
) -> None:
    # llama-cpp-python's server streams no usage: the token budget could never stop the run.
    fake.script(*(completion_stream(**read_call(n, None)) for n in (1, 2)))  # type: ignore[arg-type]
    flags = ("--stream", "--max-tokens", "100", "--max-steps", "2")
    done = cli(*run_args(fake, workspace, *flags))
    assert done.code == 3, done
    run_id = run_id_of(done.out)
    stop_reason, _, missing, detail = run_row(tmp_path, run_id)
    assert (stop_reason, missing) == ("step_budget", 2)
    assert isinstance(detail, str) and detail.startswith("max_tokens cannot be measured")
    assert done.err.count("max_tokens cannot be measured") == 1, done
