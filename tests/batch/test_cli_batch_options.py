# ruff: noqa: F811  (the fixtures of tests/e2e/test_cli.py, imported by name)
"""``polyloop batch`` takes every option ``polyloop run`` takes, and each takes effect: what the
local OpenAI-compatible server receives, what is stored with each run, how a run ends; its MCP
servers; the run ids it derives."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from polyloop import Limits
from polyloop.batch import Goal, goal_run_id
from polyloop.journal import SQLiteJournal
from polyloop.types import RunSpec
from tests.batch.world import wait_for
from tests.e2e.test_cli import (  # noqa: F401  (fixtures)
    CLI,
    Live,
    SlowableServer,
    assert_one_line_error,
    cli,
    fake,
    workspace,
)
from tests.fakes.openai_server import completion, completion_stream, tool_call
from tests.mcp.conftest import TIME, faulty_argv, read_log

pytest.importorskip("typer")
pytest.importorskip("openai")


def goals(cli: CLI, *texts: str) -> None:
    lines = "".join(json.dumps({"goal": t}) + "\n" for t in texts)
    (cli.cwd / "goals.jsonl").write_text(lines, encoding="utf-8")


def batch(fake: SlowableServer, workspace: Path, *extra: str) -> tuple[str, ...]:
    model = ("--model", "openai:test-model", "--base-url", fake.url)
    where = ("--workspace", str(workspace), "--tools", "files", "--journal", "j.db")
    return ("batch", "goals.jsonl", *model, *where, *extra)


async def specs(path: Path) -> list[RunSpec]:
    async with SQLiteJournal(path) as journal:
        return [(await journal.read(row["run_id"]))[0] for row in await journal.list_runs()]


def stored(cli: CLI) -> list[RunSpec]:
    return asyncio.run(specs(cli.cwd / "j.db"))


def test_batch_sends_runs_sampling_and_timeout_and_stores_its_budgets_and_guard(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals(cli, "say a")
    fake.script(completion("done"))
    budgets = ("--max-tokens", "5000", "--max-cost", "2", "--max-seconds", "600")
    sampling = ("--temperature", "0.25", "--max-output-tokens", "64", "--timeout", "7.5")
    done = cli(*batch(fake, workspace, *budgets, *sampling))
    assert done.code == 0, done
    body = fake.requests[0].body
    assert (body["temperature"], body["max_tokens"]) == (0.25, 64)
    assert fake.requests[0].headers["x-stainless-read-timeout"] == "7.5"
    (spec,) = stored(cli)
    # run's defaults: the failure guard on, with the baseline
    assert spec.limits == Limits(
        same_failure_limit=2, baseline=True, max_tokens=5000, max_cost=2.0, max_seconds=600.0
    )
    config = dict((spec.metadata or {})["cli"])
    assert (config["temperature"], config["max_output_tokens"]) == (0.25, 64)
    assert config["timeout_s"] == 7.5


def test_sampling_options_are_checked_at_the_boundary_in_one_line(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals(cli, "say a")
    bad = cli(*batch(fake, workspace, "--temperature", "-1"))
    assert_one_line_error(bad)
    assert "--temperature must be >= 0, got -1.0" in bad.err
    bad = cli(*batch(fake, workspace, "--max-output-tokens", "0"))
    assert_one_line_error(bad)
    assert "--max-output-tokens must be > 0, got 0" in bad.err
    bad = cli(*batch(fake, workspace, "--temperature", "nan"))
    assert_one_line_error(bad, code=2)
    assert not (cli.cwd / "j.db").exists() and fake.requests == []


def test_batch_max_tokens_ends_a_run_token_budget(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals(cli, "read notes")
    read = tool_call("read_file", '{"path": "notes.txt"}')
    fake.script(completion(tool_calls=[read], usage=(400, 200)), completion("unreachable"))
    done = cli(*batch(fake, workspace, "--max-tokens", "500"))
    assert done.code == 0, done
    assert "1 runs: 1 ended (token_budget 1)" in done.out, done
    assert len(fake.requests) == 1


def test_batch_stream_streams_each_reply(cli: CLI, fake: SlowableServer, workspace: Path) -> None:
    goals(cli, "say a")
    fake.script(completion_stream("streamed answer"))
    done = cli(*batch(fake, workspace, "--stream"))
    assert done.code == 0, done
    assert "agent_finished 1" in done.out, done
    assert fake.requests[0].body["stream"] is True
    (spec,) = stored(cli)
    assert (spec.metadata or {})["cli"]["stream"] is True


def test_batch_with_an_mcp_server_shares_it_between_its_runs(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals(cli, "time in Paris", "time in Tokyo")
    ask = tool_call("get_current_time", '{"timezone": "Europe/Paris"}')
    fake.script(
        completion(tool_calls=[ask]),
        completion(tool_calls=[ask], id="c2"),
        completion("late", id="c3"),
        completion("late", id="c4"),
    )
    done = cli(*batch(fake, workspace, "--mcp", shlex.join(TIME), "--concurrency", "2"))
    assert done.code == 0, done
    assert "2 runs: 2 ended (agent_finished 2)" in done.out, done
    names = {t["function"]["name"] for t in fake.requests[0].body["tools"]}
    assert {"read_file", "get_current_time", "convert_time"} <= names
    answers = [
        m["content"] for r in fake.requests for m in r.body["messages"] if m["role"] == "tool"
    ]
    assert answers and all('"timezone": "Europe/Paris"' in a for a in answers), answers
    for spec in stored(cli):
        config = (spec.metadata or {})["cli"]
        assert config["mcp"] == [shlex.join(TIME)]
        assert config["mcp_store"] == str((cli.cwd / "j.db").resolve()) + ".mcp-files"
        # an MCP tool's error is no failure of the goal: it never counts
        assert spec.limits.known_failures == ("MCPToolError",)
    ray = cli(*batch(fake, workspace, "--mcp", shlex.join(TIME), "--backend", "ray"))
    assert_one_line_error(ray)
    assert "--mcp works with --backend local only" in ray.err


def test_recover_rebuilds_a_killed_batch_run_with_its_mcp_server(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    log = tmp_path / "faulty.log"
    cli.env["FAULTY_LOG"] = str(log)
    goals(cli, "look it up")
    fake.script(
        completion(tool_calls=[tool_call("slow_lookup", '{"seconds": 8}')]),
        completion("looked it up", id="c2"),
    )
    live = Live(cli, *batch(fake, workspace, "--mcp", shlex.join(faulty_argv())))
    try:
        wait_for(lambda: bool(read_log(log)) or live.proc.poll() is not None, timeout=120)
        assert live.proc.poll() is None, live.finish()
        live.proc.send_signal(signal.SIGKILL)
    finally:
        live.proc.wait()
    fake.script(completion("looked it up", id="c3"))
    done = cli("recover", "--journal", "j.db", "--older-than", "0")
    assert done.code == 0, done
    assert "1 runs: 1 ended (agent_finished 1)" in done.out, done
    calls = [e for e in read_log(log) if e["event"] == "slow_lookup"]
    assert len(calls) == 2 and calls[0]["op_id"] == calls[1]["op_id"]  # replayed on the server


def test_batch_run_ids_depend_on_what_defines_the_run_not_on_the_guard_or_transport(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals(cli, "say a")
    fake.script(completion("done"))
    done = cli(*batch(fake, workspace, "--max-steps", "7"))
    assert done.code == 0, done
    # The id batch derived before run and batch shared their options (its config then held
    # no failure guard): re-running such a command finds its runs.
    before = {
        "model": "openai:test-model",
        "base_url": fake.url,
        "workspace": str(workspace.resolve()),
        "tools": ["files"],
        "limits": Limits(max_steps=7).to_dict(),
    }
    source = str((cli.cwd / "goals.jsonl").resolve())
    expected = goal_run_id(Goal("say a", metadata={"cli": before}, source=source))
    assert [s.run_id for s in stored(cli)] == [expected]
    again = cli(*batch(fake, workspace, "--max-steps", "7", "--same-failure-limit", "3",
                       "--timeout", "9", "--no-baseline"))  # fmt: skip
    assert again.code == 0 and "1 of them before this batch" in again.out, again
    other = cli(*batch(fake, workspace, "--max-steps", "7", "--temperature", "0"))
    assert other.code == 0 and len(stored(cli)) == 2, other  # sampling: another run


def run_args(fake: SlowableServer, workspace: Path, *extra: str) -> tuple[str, ...]:
    model = ("--model", "openai:test-model", "--base-url", fake.url)
    where = ("--workspace", str(workspace), "--journal", "j.db")
    return ("run", "do it", *model, *where, *extra)


def test_run_sampling_is_stored_and_a_resume_sends_it_again(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    from tests.e2e.test_cli import read_call, run_id_of, slow

    fake.script(slow(read_call(), 2.0), completion("done", id="c2"))
    live = Live(cli, *run_args(fake, workspace, "--tools", "files", "--temperature", "1.5",
                               "--max-output-tokens", "99"))  # fmt: skip
    live.wait_for(r"^run \S+  model ")
    wait_for(lambda: len(fake.requests) >= 1, what="the first model call")
    live.interrupt()  # detaches at the end of the step
    first = live.finish()
    assert first.code == 130, first
    resumed = cli("resume", run_id_of(first.out), "--journal", "j.db")
    assert resumed.code == 0, resumed
    assert [(r.body["temperature"], r.body["max_tokens"]) for r in fake.requests] == [
        (1.5, 99),
        (1.5, 99),
    ]


def test_two_identical_mcp_tool_errors_do_not_end_a_run(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    wrong = tool_call("get_current_time", '{"timezone": "Not/AZone"}')
    fake.script(
        completion(tool_calls=[wrong]),
        completion(tool_calls=[wrong], id="c2"),
        completion(tool_calls=[wrong], id="c3"),
        completion("I cannot tell the time there.", id="c4"),
    )
    done = cli(*run_args(fake, workspace, "--tools", "files", "--mcp", shlex.join(TIME)))
    assert done.code == 0, done
    assert "agent_finished" in done.out, done
    errors = [m for m in fake.requests[-1].body["messages"] if m["role"] == "tool"]
    assert len(errors) == 3 and all("Not/AZone" in m["content"] for m in errors), errors


def calc(cli: CLI, workspace: Path, body: str) -> None:
    """``calc.py`` (``add`` returning ``body``) and its test in ``workspace``; ``python`` (this
    one) on the command's PATH, for the shell tool."""
    (workspace / "calc.py").write_text(f"def add(a, b):\n    return {body}\n")
    (workspace / "test_calc.py").write_text(
        "import unittest\n\nfrom calc import add\n\n\nclass C(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(1, 2), 3)\n"
    )
    cli.env["PATH"] = f"{Path(sys.executable).parent}:{cli.env.get('PATH', '')}"


def unittest_call(n: int) -> Any:
    command = json.dumps({"command": "python -m unittest -q test_other test_calc"})
    return completion(tool_calls=[tool_call("shell", command, id=f"t{n}")], id=f"r{n}")


def test_a_test_red_before_the_run_does_not_end_a_fix_loop(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    (workspace / "test_other.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n"
        "    def test_unrelated(self):\n        self.assertEqual('a', 'b')\n"
    )
    calc(cli, workspace, "a - b")
    fix = json.dumps({"path": "calc.py", "content": "def add(a, b):\n    return a + b\n"})
    fake.script(
        unittest_call(1),
        completion(tool_calls=[tool_call("write_file", fix, id="w")], id="rw"),
        unittest_call(2),
        unittest_call(3),
        completion("calc fixed; test_other fails for another reason", id="r4"),
    )
    done = cli(*run_args(fake, workspace, "--tools", "files,shell"))
    assert done.code == 0, done
    assert "agent_finished" in done.out, done
    assert len(fake.requests) == 5


def test_a_batch_whose_mcp_server_cannot_start_is_one_line_and_writes_nothing(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals(cli, "say a")
    done = cli(*batch(fake, workspace, "--mcp", "polyloop-no-such-server --x"))
    assert_one_line_error(done)
    assert "cannot start the MCP server" in done.err, done
    assert fake.requests == [] and not (cli.cwd / "j.db").exists()


def test_the_failure_guard_ends_a_batch_run_stuck_on_a_failure_it_changed(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    calc(cli, workspace, "a + b")
    (workspace / "test_other.py").write_text("")
    broke = json.dumps({"path": "calc.py", "content": "def add(a, b):\n    return a * b\n"})
    goals(cli, "make add faster")
    fake.script(
        completion(tool_calls=[tool_call("write_file", broke, id="w")], id="rw"),
        unittest_call(1),
        unittest_call(2),
        completion("unreachable", id="r3"),
    )
    done = cli(*batch(fake, workspace, "--tools", "files,shell"))
    assert done.code == 0, done
    assert "1 runs: 1 ended (repeated_failure 1)" in done.out, done
