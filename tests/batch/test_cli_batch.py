"""``polyloop batch`` and ``polyloop recover`` as subprocesses, against the fake OpenAI server
(the same harness as tests/e2e/test_cli.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batch.checks import sql
from tests.batch.world import wait_for
from tests.e2e.test_cli import CLI, Live, assert_one_line_error
from tests.fakes.openai_server import FakeOpenAIServer, completion, hang

pytest.importorskip("typer")
pytest.importorskip("openai")


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    (tmp_path / "ws").mkdir()
    return CLI(tmp_path)


def write_goals(path: Path, *goals: str) -> Path:
    path.write_text("".join(json.dumps({"goal": g}) + "\n" for g in goals), encoding="utf-8")
    return path


def batch_args(fake: FakeOpenAIServer, *extra: str) -> tuple[str, ...]:
    model = ("--model", "openai:test-model", "--base-url", fake.url)
    return ("batch", "goals.jsonl", *model, "--workspace", "ws", "--tools", "files", *extra)


def test_batch_runs_each_line_once_and_a_rerun_skips_the_ended_runs(
    cli: CLI, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    write_goals(tmp_path / "goals.jsonl", "say a", "say b", "say c")
    fake.script(*(completion(f"answer {i}") for i in range(3)))
    done = cli(*batch_args(fake, "--journal", "j.db", "--concurrency", "2"))
    assert done.code == 0, done
    assert "3 runs: 3 ended (agent_finished 3)" in done.out, done
    assert "done 3/3" in done.out, done  # plain progress lines (not a TTY)
    assert len(fake.requests) == 3
    again = cli(*batch_args(fake, "--journal", "j.db"))
    assert again.code == 0, again
    assert "3 of them before this batch" in again.out, again
    assert len(fake.requests) == 3, "no model call for ended runs"
    rows = sql(tmp_path / "j.db", "SELECT count(*), count(DISTINCT run_id) FROM runs")
    assert rows == [(3, 3)]


def test_batch_names_the_bad_line_and_writes_nothing(
    cli: CLI, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    (tmp_path / "goals.jsonl").write_text('{"goal": "a"}\n{"goal": "b",}\n', encoding="utf-8")
    done = cli(*batch_args(fake, "--journal", "j.db"))
    assert_one_line_error(done)
    assert "goals.jsonl, line 2: not valid JSON" in done.err, done
    assert not (tmp_path / "j.db").exists()
    write_goals(tmp_path / "goals.jsonl", "a")
    bad = cli(*batch_args(fake, "--backend", "spark"))
    assert_one_line_error(bad, code=2)  # a usage error
    assert "'--backend': 'spark' is not one of 'local', 'ray'." in bad.err


def test_recover_finishes_the_runs_of_a_killed_batch(
    cli: CLI, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    write_goals(tmp_path / "goals.jsonl", "say a", "say b", "say c")
    fake.script(completion("answer 0"), hang())  # the second run hangs in its model call
    live = Live(cli, *batch_args(fake, "--journal", "j.db", "--concurrency", "1"))
    try:
        live.wait_for(r"^done 1/3", timeout=30)
        wait_for(lambda: len(fake.requests) >= 2, what="the second model call")
        live.proc.send_signal(signal.SIGKILL)
    finally:
        live.proc.wait()
    dry = cli("recover", "--journal", "j.db", "--older-than", "0", "--dry-run")
    assert dry.code == 0, dry
    assert "found 2 runs not ended (1 stale, 1 detached)" in dry.out, dry  # as `runs` says
    fake.script(completion("answer 1"), completion("answer 2"))
    done = cli("recover", "--journal", "j.db", "--older-than", "0")
    assert done.code == 0, done
    assert "2 runs: 2 ended (agent_finished 2)" in done.out, done
    ends = sql(tmp_path / "j.db", "SELECT count(*) FROM journal WHERE kind = 'end'")
    assert ends == [(3,)]


def test_batch_loop_option_is_checked_before_anything_is_written(cli: CLI, tmp_path: Path) -> None:
    write_goals(tmp_path / "goals.jsonl", "a")
    bad = cli("batch", "goals.jsonl", "--loop", "no_such_module:make", "--journal", "j.db")
    assert_one_line_error(bad)
    assert "cannot load make_loop 'no_such_module:make'" in bad.err, bad
    both = cli(
        "batch", "goals.jsonl", "--loop", "bench.scale_soak:make_loop", "--model", "openai:m"
    )
    assert_one_line_error(both)
    assert "pass --model (with --workspace, --tools) or --loop module:function" in both.err
    assert not (tmp_path / "j.db").exists()


def test_batch_loop_takes_the_limit_flags_and_metadata_and_names_the_others(
    cli: CLI, tmp_path: Path
) -> None:
    write_goals(tmp_path / "goals.jsonl", "a")
    limits = [
        *("--max-steps", "5", "--max-actions", "3", "--max-prompt-chars", "9000"),
        *("--max-tokens", "100", "--max-cost", "1", "--max-seconds", "60"),
        *("--same-failure-limit", "3", "--no-progress-rounds", "1", "--spreading-rounds", "1"),
        *("--known-failure", "test_x", "--no-baseline", "--metadata", "team=a"),
    ]
    taken = cli("batch", "goals.jsonl", "--loop", "no_such_module:make", *limits)
    assert_one_line_error(taken)  # past the flags, to the factory
    assert "cannot load make_loop 'no_such_module:make'" in taken.err, taken
    others = cli(
        "batch", "goals.jsonl", "--loop", "no_such_module:make", *limits,
        *("--tools", "files", "--stream", "--temperature", "0.5", "--read-only"),
    )  # fmt: skip
    assert_one_line_error(others)
    assert "--tools, --temperature, --stream, --read-only: not with --loop" in others.err, others
    assert not (tmp_path / "j.db").exists()
