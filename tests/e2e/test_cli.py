"""End-to-end: the ``polyloop`` command as a subprocess, against a fake OpenAI-compatible server.

Every command runs as ``python -m polyloop.cli ...`` in a temporary directory, with an
environment that holds no ``OPENAI_*`` / ``POLYLOOP_*`` variables, and is judged by its output
and exit code only. The model is the real ``openai`` SDK talking to
:class:`tests.fakes.openai_server.FakeOpenAIServer` on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from polyloop import ApprovalRequired, Limits, Loop, StepRecord, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import RunSpec
from tests.fakes._server import cut
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    Received,
    Reply,
    completion,
    completion_stream,
    hang,
    tool_call,
    unauthorized,
)

pytest.importorskip("typer")
pytest.importorskip("rich")
pytest.importorskip("openai")

SECRET = "the-launch-code-is-7731"
TIMEOUT_S = 60


# --- running the command ---------------------------------------------------------------------


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "POLYLOOP_")) and k not in ("COLUMNS", "LINES")
    }
    env["TMPDIR"] = str(tmp_path)  # the demo's mkdtemp lands here, and is cleaned up with it
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclasses.dataclass
class Done:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


class CLI:
    """Runs ``polyloop`` in ``cwd`` with a clean environment."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = clean_env(cwd)

    def argv(self, args: Sequence[str]) -> list[str]:
        return [sys.executable, "-m", "polyloop.cli", *args]

    def __call__(self, *args: str) -> Done:
        proc = subprocess.run(
            self.argv(args),
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        return Done(proc.returncode, proc.stdout, proc.stderr)

    def many(self, *commands: Sequence[str]) -> list[Done]:
        """Run independent commands side by side (read-only ones: inspection, bad input)."""
        procs = [
            subprocess.Popen(
                self.argv(args),
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for args in commands
        ]
        done = []
        for p in procs:
            out, err = p.communicate(timeout=TIMEOUT_S)
            done.append(Done(p.returncode, out, err))
        return done


class Live:
    """A ``polyloop`` process in the background; its output goes to files we can poll."""

    def __init__(self, cli: CLI, *args: str) -> None:
        self.out_path = cli.cwd / f"live-{id(self)}.out"
        self.err_path = cli.cwd / f"live-{id(self)}.err"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                cli.argv(args), cwd=cli.cwd, env=cli.env, stdout=out, stderr=err
            )

    def out(self) -> str:
        return self.out_path.read_text(encoding="utf-8")

    def wait_for(self, pattern: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.out(), re.MULTILINE):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"no {pattern!r} in the output (exit {self.proc.returncode}):\n{self.out()}\n"
                    + self.err_path.read_text(encoding="utf-8")
                )
            time.sleep(0.02)

    def interrupt(self) -> None:
        self.proc.send_signal(signal.SIGINT)

    def finish(self) -> Done:
        code = self.proc.wait(timeout=TIMEOUT_S)
        return Done(code, self.out(), self.err_path.read_text(encoding="utf-8"))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- the fake server -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Delayed(Reply):
    """A reply sent only after ``delay_s`` (a slow model call)."""

    delay_s: float = 0.0


class SlowableServer(FakeOpenAIServer):
    """FakeOpenAIServer that also serves :class:`Delayed` replies (held in the handler
    thread; stopping the server cuts the wait short)."""

    def _take(self, received: Received) -> Reply:
        reply = super()._take(received)
        if isinstance(reply, Delayed):
            self._stopping.wait(reply.delay_s)
        return reply


def slow(reply: Reply, delay_s: float) -> Delayed:
    return Delayed(reply.status, reply.body, reply.headers, reply.mode, delay_s)


def read_call(path: str = "notes.txt", n: int = 1) -> Reply:
    return completion(
        tool_calls=[tool_call("read_file", json.dumps({"path": path}), id=f"call_{n}")],
        id=f"chatcmpl-{n}",
    )


@pytest.fixture
def fake() -> Iterator[SlowableServer]:
    server = SlowableServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(tmp_path)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text(f"{SECRET}\n", encoding="utf-8")
    return ws


@pytest.fixture
def live() -> Iterator[list[Live]]:
    """Background processes started by a test; killed if the test leaves one running."""
    started: list[Live] = []
    yield started
    for proc in started:
        proc.kill()


def run_args(
    fake: FakeOpenAIServer, workspace: Path, *extra: str, journal: str = "j.db"
) -> tuple[str, ...]:
    """``polyloop run`` against the fake server, with the files tools only."""
    model = ("--model", "openai:test-model", "--base-url", fake.url)
    where = ("--workspace", str(workspace), "--journal", journal, "--tools", "files")
    return ("run", "read notes", *model, *where, *extra)


def run_id_of(out: str) -> str:
    match = re.search(r"^run (\S+)  model ", out, re.MULTILINE)
    assert match, out
    return match.group(1)


def runs_rows(out: str) -> dict[str, dict[str, str]]:
    """``polyloop runs`` plain output (not a TTY): a title, a header, tab-separated rows."""
    lines = out.splitlines()
    header_at = next(i for i, line in enumerate(lines) if line.startswith("run_id\t"))
    cols = lines[header_at].split("\t")
    rows = [dict(zip(cols, line.split("\t"), strict=True)) for line in lines[header_at + 1 :]]
    return {r["run_id"]: r for r in rows}


async def empty_journal(path: Path) -> None:
    journal = SQLiteJournal(path)
    try:
        assert await journal.list_runs() == []
    finally:
        await journal.aclose()


def sql(path: Path, query: str) -> list[tuple[Any, ...]]:
    """A query on a journal file, with plain sqlite3 (as downstream SQL reads it)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(query).fetchall()


def assert_one_line_error(done: Done, code: int = 1) -> None:
    """Exit ``code`` (1: bad input, 2: a usage error) with one ``polyloop: ...`` line on
    stderr and no traceback."""
    assert done.code == code, done
    assert "Traceback" not in done.err, done
    assert "Traceback" not in done.out, done
    lines = done.err.strip().splitlines()
    assert len(lines) == 1, done
    assert lines[0].startswith("polyloop: "), done


# --- the demo --------------------------------------------------------------------------------


def test_demo_runs_both_scenes_and_its_inspect_commands_work(cli: CLI, tmp_path: Path) -> None:
    done = cli("demo")
    assert done.code == 0, done
    assert "Traceback" not in done.err, done
    out = done.out
    assert "Scene 1" in out and "Scene 2" in out and "Scene 3" in out, out
    # the third scene's report names the two tests that trade places, and what to decide
    assert "**Rounds**" in out and "**Candidate directions**" in out, out
    assert re.search(r"Left for you to decide:\*\* `\S+shipped\S+` and `\S+stock` trade", out), out
    assert out.count("-> task_completed") >= 2, out  # scene 1, and scene 2 once resumed
    assert re.search(r"child pid \d+ killed while its test run was in flight", out), out
    assert "action intent for step 2" in out, out
    assert "Look inside:" in out, out

    runs_cmd = re.search(r"^\s+polyloop (runs --journal \S+)$", out, re.MULTILINE)
    show_cmd = re.search(r"^\s+polyloop (show (\S+) --journal (\S+))$", out, re.MULTILINE)
    assert runs_cmd and show_cmd, out
    run_id, journal = show_cmd.group(2), Path(show_cmd.group(3))
    assert journal.is_relative_to(tmp_path) and journal.is_file(), journal
    assert "sqlite3 " in out and "SELECT stop_reason, count(*) FROM runs" in out, out

    crashed = re.search(r"^  run (demo-crash-\d+): task_completed$", out, re.MULTILINE)
    assert crashed, out

    listed, shown = cli.many(shlex.split(runs_cmd.group(1)), shlex.split(show_cmd.group(1)))
    assert listed.code == 0, listed
    rows = runs_rows(listed.out)
    assert rows[run_id]["stop_reason"] == "task_completed", listed
    assert rows[crashed.group(1)]["stop_reason"] == "task_completed", listed  # resumed
    assert {r["state"] for r in rows.values()} == {"ended"}, listed

    assert shown.code == 0, shown
    assert f"run {run_id}  ended  task_completed" in shown.out, shown
    for tool in ("list_files", "read_file", "run_tests", "edit_file", "submit"):
        assert tool in shown.out, shown


def test_demo_real_without_the_model_says_in_one_line_how_to_install_it(
    cli: CLI, tmp_path: Path
) -> None:
    cli.env["POLYLOOP_CACHE"] = str(tmp_path / "empty-cache")  # nothing installed there
    done = cli("demo", "--real")
    assert done.code == 1, done
    assert done.out == "", done
    (line,) = done.err.splitlines()
    assert line.startswith("polyloop: demo --real: the real model's server's Python is not")
    assert "bash .ci/real_model.sh" in line and "POLYLOOP_REAL_MODEL_PY" in line, line


# --- a run against the fake server, then every inspection command ----------------------------


def test_run_against_fake_server_then_inspect(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(read_call(), completion(f"The note says {SECRET}.", id="chatcmpl-2"))
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    run_id = run_id_of(done.out)
    assert re.search(r"^step +0  read_file\(.*executed", done.out, re.MULTILINE), done
    assert "stopped: agent_finished" in done.out, done
    assert f"run {run_id}: agent_finished after 2 steps, 1 actions" in done.out, done
    assert "journal j.db" in done.out, done
    assert done.err == "", done

    # what the model was sent: the tools, one tool call per turn, the tool's result
    assert len(fake.requests) == 2
    for req in fake.requests:
        assert req.path == "/v1/chat/completions"
        assert req.body["model"] == "test-model"
        assert req.body["parallel_tool_calls"] is False
        names = {t["function"]["name"] for t in req.body["tools"]}
        assert {"read_file", "write_file", "edit_file", "list_files", "grep"} <= names
        assert "shell" not in names  # --tools files
    tool_msgs = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert tool_msgs == [{"role": "tool", "tool_call_id": "call_1", "content": f"{SECRET}\n"}]

    j = ("--journal", "j.db")
    finished, budget, table, as_json, stats, export, redacted = cli.many(
        ("runs", *j, "--stop-reason", "agent_finished"),
        ("runs", *j, "--stop-reason", "step_budget"),
        ("show", run_id, *j),
        ("show", run_id, *j, "--json"),
        ("stats", *j),
        ("export", *j, "--format", "jsonl"),
        ("export", *j, "--format", "jsonl", "--redact"),
    )
    for d in (finished, budget, table, as_json, stats, export, redacted):
        assert d.code == 0, d
        assert "Traceback" not in d.err, d

    assert list(runs_rows(finished.out)) == [run_id], finished
    row = runs_rows(finished.out)[run_id]
    assert (row["state"], row["stop_reason"], row["steps"], row["actions"]) == (
        "ended",
        "agent_finished",
        "2",
        "1",
    )
    assert row["goal"] == "read notes"
    assert runs_rows(budget.out) == {}, budget

    assert f"run {run_id}  ended  agent_finished" in table.out, table
    assert re.search(r"^0\tread_file\(.*\texecuted\t" + SECRET, table.out, re.MULTILINE), table
    assert re.search(r"^1\t\(final answer\)\t", table.out, re.MULTILINE), table
    assert f"answer: The note says {SECRET}." in table.out, table

    data = json.loads(as_json.out)
    assert data["run"]["run_id"] == run_id
    assert data["run"]["stop_reason"] == "agent_finished"
    assert data["run"]["metadata"]["cli"]["model"] == "openai:test-model"
    step_fields = {f.name for f in dataclasses.fields(StepRecord)}
    assert [s["step_idx"] for s in data["steps"]] == [0, 1]
    for step in data["steps"]:
        assert set(step) == step_fields
    assert data["steps"][0]["tool_name"] == "read_file"
    assert data["steps"][0]["observation"] == f"{SECRET}\n"
    assert data["steps"][0]["llm_call_id"] == "chatcmpl-1"
    assert data["steps"][1]["raw_response"] == f"The note says {SECRET}."

    assert "1 ended runs (0 not ended)" in stats.out, stats
    assert re.search(r"^agent_finished\t1\t100\.0%$", stats.out, re.MULTILINE), stats
    assert "steps per run: p50 2" in stats.out, stats

    lines = export.out.splitlines()
    assert len(lines) == 2, export
    rows = [json.loads(line) for line in lines]
    assert [(r["run_id"], r["step_idx"]) for r in rows] == [(run_id, 0), (run_id, 1)]
    for r in rows:
        assert step_fields <= set(r)
        assert r["stop_reason"] == "agent_finished"
    assert SECRET in export.out and "notes.txt" in export.out

    lines = redacted.out.splitlines()
    assert len(lines) == 2, redacted
    rows = [json.loads(line) for line in lines]
    assert SECRET not in redacted.out, redacted
    assert "notes.txt" not in redacted.out, redacted
    assert "read notes" not in redacted.out, redacted  # the goal is a prompt too
    assert rows[0]["tool_name"] == "read_file"
    assert json.loads(rows[0]["tool_args_json"]) == {"path": "[redacted]"}
    assert rows[0]["observation"] == "[redacted]"
    assert rows[0]["action_status"] == "executed"
    assert rows[1]["raw_response"] == "[redacted]"


# --- exit codes ------------------------------------------------------------------------------


def test_step_budget_exits_3(cli: CLI, fake: SlowableServer, workspace: Path) -> None:
    fake.script(*(read_call(n=i) for i in range(1, 4)))
    done = cli(*run_args(fake, workspace, "--max-steps", "1"))
    assert done.code == 3, done
    run_id = run_id_of(done.out)
    assert f"run {run_id}: step_budget after 1 steps, 1 actions" in done.out, done
    assert len(fake.requests) == 1


def test_token_budget_exits_3_and_a_bad_budget_is_one_line(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    # Each stub reply reports 82 + 17 tokens: two steps spend 198 of 150.
    fake.script(*(read_call(n=i) for i in range(1, 5)))
    done = cli(*run_args(fake, workspace, "--max-tokens", "150"))
    assert done.code == 3, done
    run_id = run_id_of(done.out)
    assert f"run {run_id}: token_budget after 2 steps, 2 actions" in done.out, done
    shown = cli("runs", "--journal", "j.db", "--stop-reason", "token_budget")
    assert run_id in shown.out, shown
    bad = cli(*run_args(fake, workspace, "--max-cost", "0"))
    assert bad.code == 1 and "--max-cost must be > 0" in bad.err, bad  # in CLI words
    assert "Traceback" not in bad.err, bad


def test_auth_error_exits_4_with_one_line_detail(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(unauthorized())
    done = cli(*run_args(fake, workspace))
    assert done.code == 4, done
    assert "Traceback" not in done.err + done.out, done
    run_id = run_id_of(done.out)
    lines = done.out.splitlines()
    # the result line, then the detail, which is the last line: one line, naming the cause
    assert lines[-2] == f"run {run_id}: llm_error after 1 steps, 0 actions", done
    assert lines[-1].startswith("detail: "), done
    assert "401" in lines[-1] or "AuthenticationError" in lines[-1], done
    assert "kind=auth" in lines[-1], done
    assert len(fake.requests) == 1  # not retried
    # show names the step what the progress line named it: a failed call, not an answer
    assert "(model call failed)" in done.out, done
    shown = cli("show", run_id, "--journal", "j.db")
    row = shown.out.splitlines()[-1].split("\t")
    assert row[:3] == ["0", "(model call failed)", "invalid"], shown


def test_bad_input_is_one_line_and_exit_1(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    asyncio.run(empty_journal(tmp_path / "j.db"))
    (tmp_path / "junk.db").write_bytes(bytes(range(256)) * 16)  # not SQLite at all
    missing = str(tmp_path / "no-such-dir")

    cases = {
        "unknown model prefix": ("run", "g", "--model", "nosuch:x", "--workspace", "ws"),
        "missing workspace": ("run", "g", "--model", "openai:x", "--workspace", missing),
        "unknown run for show": ("show", "no-such-run", "--journal", "j.db"),
        "unknown run for resume": ("resume", "no-such-run", "--journal", "j.db"),
        "no journal for resume": ("resume", "no-such-run", "--journal", "nope.db"),
        "bad --since date": ("runs", "--journal", "j.db", "--since", "2026-13-45"),
        "export into a missing folder": ("export", "--journal", "j.db", "-o", f"{missing}/x"),
        "junk journal: runs": ("runs", "--journal", "junk.db"),
        "junk journal: run": run_args(fake, workspace, journal="junk.db"),
    }
    results = dict(zip(cases, cli.many(*cases.values()), strict=True))
    for name, done in results.items():
        try:
            assert_one_line_error(done)
        except AssertionError:
            raise AssertionError(f"{name}: {cases[name]}\n{done}") from None

    err = {name: d.err for name, d in results.items()}
    assert "unknown model provider 'nosuch'" in err["unknown model prefix"]
    assert "no-such-dir does not exist" in err["missing workspace"]
    assert "no run 'no-such-run'" in err["unknown run for show"]
    assert "no run 'no-such-run'" in err["unknown run for resume"]
    assert "no journal at nope.db" in err["no journal for resume"]
    for name in err:
        if name.startswith("junk journal"):
            assert "junk.db is not a SQLite database" in err[name], name
    assert (tmp_path / "junk.db").read_bytes() == bytes(range(256)) * 16  # left untouched
    assert not (tmp_path / "nope.db").exists()  # a typo does not create a journal
    assert fake.requests == []  # none of the bad commands reached the model


def test_unknown_values_of_enumerated_options_are_usage_errors_listing_the_known_ones(
    cli: CLI, tmp_path: Path
) -> None:
    asyncio.run(empty_journal(tmp_path / "j.db"))
    reason, fmt, option = cli.many(
        ("runs", "--journal", "j.db", "--stop-reason", "bogus"),
        ("export", "--journal", "j.db", "--format", "csv"),
        ("runs", "--journal", "j.db", "--bogus"),
    )
    for done in (reason, fmt, option):
        assert_one_line_error(done, code=2)
    known = ", ".join(repr(str(r)) for r in StopReason)  # every member, in their order
    assert f"'--stop-reason': 'bogus' is not one of {known}." in reason.err, reason
    assert reason.err.rstrip().endswith("(see polyloop runs --help)"), reason
    assert (
        "'--format': 'csv' is not one of 'jsonl', 'parquet', 'chat', 'chat-parquet'." in fmt.err
    ), fmt
    assert "No such option: --bogus" in option.err, option


def test_a_run_that_cannot_start_leaves_no_journal_file(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    remote = ("--model", "openai:gpt-x", "--base-url", "https://models.example.invalid/v1")
    where = ("--workspace", str(workspace), "--tools", "files")
    cases = {
        "no API key for a remote server": (("run", "g", *remote, *where, "--journal", "a.db"), 1),
        "a journal in a missing folder": (run_args(fake, workspace, journal="no-dir/b.db"), 1),
        "a timeout that is not positive": (run_args(fake, workspace, "--timeout", "0"), 1),
        "a usage error": (run_args(fake, workspace, "--max-steps", "many"), 2),
    }
    results = dict(zip(cases, cli.many(*(args for args, _ in cases.values())), strict=True))
    for name, done in results.items():
        try:
            assert_one_line_error(done, code=cases[name][1])
        except AssertionError:
            raise AssertionError(f"{name}: {cases[name]}\n{done}") from None
    assert "has no API key" in results["no API key for a remote server"].err
    assert "the folder no-dir does not exist" in results["a journal in a missing folder"].err
    assert "--timeout takes seconds > 0" in results["a timeout that is not positive"].err
    assert "'--max-steps'" in results["a usage error"].err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["ws"], left  # no journal file, no folder
    assert fake.requests == []


# --- Ctrl-C ----------------------------------------------------------------------------------


def test_ctrl_c_detaches_and_the_run_resumes(
    cli: CLI, fake: SlowableServer, workspace: Path, live: list[Live]
) -> None:
    # step 0 is quick; step 1's model call takes a while, so Ctrl-C lands in the middle of it
    fake.script(read_call(n=1), slow(read_call(n=2), 1.0))
    proc = Live(cli, *run_args(fake, workspace))
    live.append(proc)
    proc.wait_for(r"^step +0 ")
    proc.interrupt()
    done = proc.finish()
    assert done.code == 130, done
    assert "Traceback" not in done.err, done
    run_id = run_id_of(done.out)
    assert "Ctrl-C: detaching at the end of this step" in done.out, done
    assert re.search(r"^step +1  read_file\(", done.out, re.MULTILINE), done  # step 1 finished
    resume_cmd = re.search(r"polyloop (resume \S+ --journal \S+)$", done.out, re.MULTILINE)
    assert resume_cmd, done
    assert resume_cmd.group(1) == f"resume {run_id} --journal j.db"

    listed = cli("runs", "--journal", "j.db")
    assert listed.code == 0, listed
    row = runs_rows(listed.out)[run_id]
    assert row["state"] == "detached" and row["stop_reason"] == "", listed  # no end record
    assert (row["steps"], row["actions"]) == ("2", "2"), listed
    counted = sql(cli.cwd / "j.db", "SELECT status, owner, steps_used, actions_executed FROM runs")
    assert counted == [("running", None, 2, 2)]  # the counters are current in SQL too

    fake.script(completion("All read.", id="chatcmpl-3"))
    resumed = cli(*shlex.split(resume_cmd.group(1)))
    assert resumed.code == 0, resumed
    assert f"run {run_id}: agent_finished after 3 steps, 2 actions" in resumed.out, resumed
    assert "answer: All read." in resumed.out, resumed
    assert len(fake.requests) == 3
    # the resumed model call saw the whole history, including step 1's observation
    tool_msgs = [m for m in fake.requests[2].body["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_1", "call_2"]


def test_ctrl_c_twice_cancels(
    cli: CLI, fake: SlowableServer, workspace: Path, live: list[Live]
) -> None:
    fake.script(read_call(n=1), hang())  # step 1's model call never returns
    proc = Live(cli, *run_args(fake, workspace))
    live.append(proc)
    proc.wait_for(r"^step +0 ")
    proc.interrupt()
    proc.wait_for(r"^Ctrl-C: detaching")
    proc.interrupt()
    done = proc.finish()
    assert done.code == 130, done
    assert "Traceback" not in done.err, done
    run_id = run_id_of(done.out)
    assert "cancelled" in done.out.splitlines()[-1], done

    listed = cli("runs", "--journal", "j.db", "--stop-reason", "cancelled")
    assert listed.code == 0, listed
    row = runs_rows(listed.out)[run_id]
    assert row["state"] == "ended" and row["stop_reason"] == "cancelled", listed


def has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux: its /proc fd links)."""
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                if Path(os.readlink(fd)) == path.resolve():
                    return True
    return False


def cli_config(fake: FakeOpenAIServer, workspace: Path) -> dict[str, Any]:
    """The config ``polyloop run`` stores with a run (in its metadata, under "cli")."""
    return {
        "model": "openai:test-model",
        "base_url": fake.url,
        "workspace": str(workspace.resolve()),
        "tools": ["files"],
        "limits": Limits().to_dict(),
    }


async def detached_run(path: Path, run_id: str, config: dict[str, Any]) -> None:
    """A run as ``polyloop run`` would create it, then given up with no step and no end."""
    async with SQLiteJournal(path) as journal:
        spec = RunSpec(run_id, "read notes", Limits(), time.time(), (), {"cli": config})
        await journal.release(await journal.create(spec, ttl_s=60))


async def list_runs(path: Path) -> list[dict[str, Any]]:
    async with SQLiteJournal(path) as journal:
        return await journal.list_runs()


@pytest.mark.parametrize("case", ["run", "resume"])
def test_ctrl_c_before_the_handler_is_installed_says_what_the_journal_holds(
    case: str, cli: CLI, fake: SlowableServer, workspace: Path, live: list[Live]
) -> None:
    path = cli.cwd / "j.db"
    if case == "resume":
        asyncio.run(detached_run(path, "r1", cli_config(fake, workspace)))
        args: tuple[str, ...] = ("resume", "r1", "--journal", "j.db")
    else:
        args = run_args(fake, workspace)
    # The journal is locked (rollback mode, exclusive), so the command waits in opening it,
    # before any run starts and before its Ctrl-C handler is installed.
    lock = sqlite3.connect(path, isolation_level=None)
    try:
        lock.execute("PRAGMA journal_mode = DELETE")
        lock.execute("BEGIN EXCLUSIVE")
        proc = Live(cli, *args)
        live.append(proc)
        deadline = time.monotonic() + 30
        while not has_open(proc.proc.pid, path):
            assert proc.proc.poll() is None and time.monotonic() < deadline, proc.finish()
            time.sleep(0.02)
        proc.interrupt()
    finally:
        lock.close()
    done = proc.finish()
    assert done.code == 130, done
    assert "Traceback" not in done.err + done.out, done
    last = done.out.splitlines()[-1]
    assert "end record says" not in done.out, done  # no end record was written
    runs = asyncio.run(list_runs(path))
    if case == "run":
        match = re.fullmatch(r"interrupted before run (\S+) was created: nothing was written", last)
        assert match, done
        assert runs == [], runs
    else:
        expected = "interrupted: run r1 has no end record; it stays resumable: "
        assert last == expected + "polyloop resume r1 --journal j.db", done
        assert [(r["run_id"], r["status"], r["state"]) for r in runs] == [
            ("r1", "running", "detached")
        ]
    assert fake.requests == []


# --- what a run shows: each step's own time, the run's state --------------------------------------


def test_progress_and_show_give_each_steps_own_time_in_labelled_columns(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(read_call(n=1), read_call(n=2), completion("Read twice.", id="chatcmpl-3"))
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    run_id = run_id_of(done.out)
    steps = asyncio.run(steps_of(cli.cwd / "j.db", run_id))
    assert len(steps) == 3
    lines = done.out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert lines[header].split() == ["step", "action", "status", "step", "time"], done
    shown = [
        re.fullmatch(r"step +(\d+)  .*  (\S+) +([\d.]+) ms", line)
        for line in lines[header + 1 : header + 4]
    ]
    assert all(shown), done
    for match, step in zip(shown, steps, strict=True):
        assert match is not None
        assert int(match.group(1)) == step.step_idx
        assert match.group(3) == f"{step.step_wall_ms:.1f}", (done, step.step_wall_ms)

    table = cli("show", run_id, "--journal", "j.db")
    assert table.code == 0, table
    cols = "step\taction\tstatus\tobservation\tprompt (chars)\ttime (ms)"
    rows = table.out.split(cols + "\n", 1)[1].splitlines()[:3]
    for row, step in zip(rows, steps, strict=True):
        cells = row.split("\t")
        assert (cells[0], cells[4], cells[5]) == (
            str(step.step_idx),
            str(step.prompt_chars),
            f"{step.step_wall_ms:.0f}",
        ), table


def test_run_and_show_name_an_edit_that_deleted_an_assertion(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    (workspace / "tests").mkdir()
    test = "def test_notes():\n    assert read() == 'x'\n    assert read() != ''\n"
    (workspace / "tests" / "test_notes.py").write_text(test)
    edit = {"path": "tests/test_notes.py", "old": "    assert read() == 'x'\n", "new": ""}
    fake.script(
        completion(tool_calls=[tool_call("edit_file", json.dumps(edit))], id="chatcmpl-1"),
        completion("Done: the test passes now.", id="chatcmpl-2"),
    )
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    assert "test files edited:\n  tests/test_notes.py (assertion_deleted) at step 0" in done.out
    shown = cli("show", run_id_of(done.out), "--journal", "j.db")
    assert "tests/test_notes.py (assertion_deleted) at step 0" in shown.out, shown
    as_json = json.loads(cli("show", run_id_of(done.out), "--journal", "j.db", "--json").out)
    assert as_json["test_edits"] == [
        {"step_idx": 0, "path": "tests/test_notes.py", "tampering": ["assertion_deleted"]}
    ]


def test_run_stream_prints_the_reply_as_it_arrives_and_journals_it_whole(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    answer = "The notes say to water the plants."
    streamed = completion_stream(answer, id="chatcmpl-2")
    call = [tool_call("read_file", json.dumps({"path": "notes.txt"}), id="call_1")]
    fake.script(
        completion_stream(tool_calls=call, id="chatcmpl-1"),
        cut(streamed, len(streamed.events) // 2),  # cut off: retried
        streamed,
    )
    done = cli(*run_args(fake, workspace, "--stream"))
    assert done.code == 0, done
    lines = done.out.splitlines()
    shown = lines.index(answer)  # the streamed text, on a line of its own
    assert lines[shown - 1].startswith("(that reply was cut off"), done
    assert answer.startswith(lines[shown - 2]) and lines[shown - 2] != answer, done
    assert re.match(r"step +1  final answer: ", lines[shown + 1]), done
    assert all(r.body["stream"] is True for r in fake.requests), fake.requests
    run_id = run_id_of(done.out)
    steps = asyncio.run(steps_of(cli.cwd / "j.db", run_id))
    assert [s.raw_response for s in steps][1] == answer
    # The run keeps streaming when resumed: the option is stored with it.
    spec = asyncio.run(spec_of(cli.cwd / "j.db", run_id))
    assert (spec.metadata or {})["cli"]["stream"] is True


async def spec_of(path: Path, run_id: str) -> RunSpec:
    async with SQLiteJournal(path) as journal:
        spec, _ = await journal.read(run_id)
        return spec


async def steps_of(path: Path, run_id: str) -> list[StepRecord]:
    async with SQLiteJournal(path) as journal:
        return await journal.steps(run_id)


# --- the journal file: damaged, read-only ----------------------------------------------------


def test_check_tells_a_sound_journal_from_a_damaged_one(cli: CLI, tmp_path: Path) -> None:
    from tests.durability.test_sqlite_damage import overwrite_page, table_leaves, write_runs

    asyncio.run(write_runs(tmp_path / "j.db", 40))
    sound = cli("check", "--journal", "j.db")
    assert (sound.code, sound.out, sound.err) == (
        0,
        "j.db: sound (integrity_check ok, 40 runs)\n",
        "",
    )

    leaves = table_leaves(tmp_path / "j.db", "steps")
    overwrite_page(tmp_path / "j.db", leaves[len(leaves) // 2])
    before = (tmp_path / "j.db").read_bytes()
    damaged, missing, postgres = cli.many(
        ("check", "--journal", "j.db"),
        ("check", "--journal", "nope.db"),
        ("check", "--journal", "postgresql://127.0.0.1:1/db"),
    )
    assert damaged.code == 8, damaged
    assert damaged.err == "" and len(damaged.out.splitlines()) == 1, damaged
    assert damaged.out.startswith("j.db: DAMAGED: "), damaged
    assert "`sqlite3 j.db .recover | sqlite3 recovered.db`" in damaged.out, damaged
    assert (tmp_path / "j.db").read_bytes() == before  # checked read-only
    assert_one_line_error(missing)
    assert "no journal at nope.db" in missing.err, missing
    assert not (tmp_path / "nope.db").exists()
    assert_one_line_error(postgres)
    assert "SQLite journal files" in postgres.err, postgres


def test_reading_commands_work_in_a_read_only_folder_and_writing_ones_say_why(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    from tests.read_only import read_only, run_unprivileged, unprivileged_view

    folder = tmp_path / "ro"
    folder.mkdir()
    fake.script(read_call(), completion("Read it.", id="chatcmpl-2"))
    done = cli(*run_args(fake, workspace, journal="ro/j.db"))
    assert done.code == 0, done
    run_id = run_id_of(done.out)
    (tmp_path / "goals.jsonl").write_text('{"goal": "g"}\n', encoding="utf-8")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    def unprivileged(*args: str) -> Done:
        proc = run_unprivileged(cli.argv(args), cwd=cli.cwd, env=cli.env)
        return Done(proc.returncode, proc.stdout, proc.stderr)

    j = ("--journal", "ro/j.db")
    model = ("--model", "openai:test-model", "--base-url", fake.url, "--workspace", "ws")
    with read_only(folder):
        reading = {
            "runs": unprivileged("runs", *j),
            "show": unprivileged("show", run_id, *j),
            "stats": unprivileged("stats", *j),
            "export": unprivileged("export", *j),
            "report": unprivileged("report", run_id, *j, "-o", "run.html"),
            "check": unprivileged("check", *j),
        }
        page = unprivileged_view(cli.argv(("view", *j, "--port", "0")), cwd=cli.cwd, env=cli.env)
        writing = {
            "run": unprivileged(*run_args(fake, workspace, journal="ro/j.db")),
            "resume": unprivileged("resume", run_id, *j),
            "batch": unprivileged("batch", "goals.jsonl", *model, *j),
            "recover": unprivileged("recover", *j),
        }
    for name, d in reading.items():
        assert d.code == 0, f"{name}: {d}"
        assert "Traceback" not in d.err, f"{name}: {d}"
    assert run_id in runs_rows(reading["runs"].out), reading["runs"]
    assert f"run {run_id}  ended  agent_finished" in reading["show"].out, reading["show"]
    assert len(reading["export"].out.splitlines()) == 2, reading["export"]
    assert (tmp_path / "run.html").is_file()
    assert f'data-run="{run_id}"' in page
    assert reading["check"].out.startswith("ro/j.db: sound (integrity_check ok, 1 runs"), reading
    for name, d in writing.items():
        try:
            assert_one_line_error(d)
        except AssertionError:
            raise AssertionError(f"{name}: {d}") from None
        assert f"cannot write the journal ro/j.db: the directory {folder} is not writable" in (
            d.err
        ), f"{name}: {d}"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert len(fake.requests) == 2  # only the first run's: no writing command reached the model


# --- text that is not valid Unicode ----------------------------------------------------------


def test_a_reply_with_lone_surrogate_escapes_ends_normally_in_one_line(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    # The server's JSON holds "\udfff" escapes (json.dumps writes a lone surrogate so): in the
    # text, the reasoning, the ids, and inside the tool call's argument string.
    arguments = json.dumps({"path": "notes\udfff.txt"})
    fake.script(
        completion(
            "let me look \udfff",
            tool_calls=[tool_call("read_file", arguments, id="call_\udfff")],
            reasoning_content="hm \udfff",
            id="chatcmpl-\udfff",
        ),
        completion("The note is gone \udfff.", id="chatcmpl-2"),
    )
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    assert "Traceback" not in done.err + done.out, done
    assert done.err == "", done
    run_id = run_id_of(done.out)
    outcome = [line for line in done.out.splitlines() if line.startswith(f"run {run_id}: ")]
    assert len(outcome) == 1 and "agent_finished after 2 steps" in outcome[0], done
    steps = asyncio.run(steps_of(tmp_path / "j.db", run_id))
    assert [s.step_idx for s in steps] == [0, 1]
    assert steps[0].llm_call_id == "chatcmpl-\ufffd" and steps[0].tool_name == "read_file"
    assert steps[0].replaced_chars > 0 and steps[1].replaced_chars == 1
    assert steps[1].raw_response == "The note is gone \ufffd."


def test_a_killed_run_is_listed_stale_and_resumes_with_another_base_url_and_timeout(
    cli: CLI, fake: SlowableServer, workspace: Path, live: list[Live]
) -> None:
    fake.script(read_call(n=1), hang())  # step 1's model call never returns
    proc = Live(cli, *run_args(fake, workspace, "--timeout", "7.5"))
    live.append(proc)
    proc.wait_for(r"^step +0 ")
    deadline = time.monotonic() + 20
    while len(fake.requests) < 2:  # step 1's model call is in flight
        assert time.monotonic() < deadline, proc.out()
        time.sleep(0.02)
    proc.kill()  # SIGKILL: it dies holding the lease
    run_id = run_id_of(proc.out())
    assert fake.requests[0].headers["x-stainless-read-timeout"] == "7.5"

    listed = cli("runs", "--journal", "j.db")
    assert listed.code == 0, listed
    row = runs_rows(listed.out)[run_id]
    assert (row["state"], row["steps"], row["actions"]) == ("stale", "1", "1"), listed

    other = SlowableServer().start()
    try:
        other.script(completion("All read.", id="chatcmpl-9"))
        resumed = cli(
            "resume", run_id, "--journal", "j.db", "--base-url", other.url, "--timeout", "3"
        )
        assert resumed.code == 0, resumed
        assert f"for this execution only: --base-url {other.url} --timeout 3.0" in resumed.out
        assert f"run {run_id}: agent_finished after 2 steps, 1 actions" in resumed.out, resumed
        assert [r.headers["x-stainless-read-timeout"] for r in other.requests] == ["3.0"]
    finally:
        other.stop()
    assert len(fake.requests) == 2  # the first server saw nothing of the resumed execution
    shown = json.loads(cli("show", run_id, "--journal", "j.db", "--json").out)
    stored = shown["run"]["metadata"]["cli"]
    assert (stored["base_url"], stored["timeout_s"]) == (fake.url, 7.5)  # kept as started
    assert shown["run"]["state"] == "ended"


# --- stop and cancel from another terminal ----------------------------------------------------


def test_stop_from_another_terminal_ends_a_live_run_stopped_and_it_exits_130(
    cli: CLI, fake: SlowableServer, workspace: Path, live: list[Live]
) -> None:
    # Every model call takes 0.3 s; the run's heartbeat (every 10 s: lease_ttl_s=30) brings
    # the request, and the run stops at the step boundary after it.
    fake.script(*(slow(read_call(n=i), 0.3) for i in range(200)))
    proc = Live(cli, *run_args(fake, workspace, "--max-steps", "200"))
    live.append(proc)
    proc.wait_for(r"^step +0 ")
    run_id = run_id_of(proc.out())
    asked = cli("stop", run_id, "--reason", "enough reading", "--by", "ops", "--journal", "j.db")
    assert asked.code == 0, asked
    assert asked.out.startswith(f"run {run_id}: stop request written; the execution"), asked
    done = proc.finish()
    assert done.code == 130, done  # the exit code of a stopped run
    assert re.search(rf"^run {run_id}: stopped after \d+ steps", done.out, re.M), done
    assert "detail: enough reading" in done.out, done
    listed = cli("runs", "--journal", "j.db", "--stop-reason", "stopped")
    row = runs_rows(listed.out)[run_id]
    assert (row["state"], row["stop_reason"], row["request"]) == ("ended", "stopped", "stop")
    shown = cli("show", run_id, "--journal", "j.db")
    assert re.search(r"^request: stop by ops at [-\d: ]+: enough reading$", shown.out, re.M), shown
    again = cli("cancel", run_id, "--journal", "j.db")
    assert again.code == 0, again
    assert again.out.startswith(f"run {run_id} had already ended stopped, nothing changed")


def test_stop_and_cancel_of_a_run_nobody_advances_end_it_at_once(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    asyncio.run(detached_run(cli.cwd / "j.db", "queued", cli_config(fake, workspace)))
    done = cli("cancel", "queued", "--reason", "withdrawn", "--journal", "j.db")
    assert done.code == 0, done
    assert done.out.startswith("run queued ended cancelled now: nobody was advancing it"), done
    assert sql(cli.cwd / "j.db", "SELECT stop_reason, stop_detail, request FROM runs") == [
        ("cancelled", "withdrawn", "cancel")
    ]
    late = cli("stop", "queued", "--reason", "late", "--journal", "j.db")
    assert late.code == 0 and "had already ended cancelled, nothing changed" in late.out, late
    assert "cancel requested by" in late.out  # who came first
    assert_one_line_error(cli("stop", "nope", "--reason", "x", "--journal", "j.db"))
    assert_one_line_error(cli("stop", "queued", "--reason", " ", "--journal", "j.db"))
    assert cli("stop", "queued", "--journal", "j.db").code == 2  # --reason is required


# --- help and documentation ------------------------------------------------------------------

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _commands() -> list[tuple[list[str], Any]]:
    from typer.main import get_command

    from polyloop.cli.app import app

    root = get_command(app)
    return [([], root), *(([name], cmd) for name, cmd in root.commands.items())]  # type: ignore[attr-defined]


def _help(args: list[str]) -> str:
    from typer.testing import CliRunner

    from polyloop.cli.app import app

    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def test_every_help_text_shows_its_brackets_and_install_hints_as_written() -> None:
    seen: set[str] = set()
    for args, command in _commands():
        texts = [command.help or "", command.epilog or ""]
        texts += [getattr(p, "help", None) or "" for p in command.params]
        bracketed = {" ".join(m.split()) for t in texts for m in re.findall(r"\S*\[[^\]]*\]\S*", t)}
        shown = " ".join(_help(args).split())
        for text in bracketed:
            assert text in shown, (args, text, shown)
        seen |= bracketed
    assert {"'polyloop[ray]').", "'polyloop[parquet]')."} <= seen  # not vacuous
    assert "pip install 'polyloop[ray]'" in " ".join(_help(["batch"]).split())


def test_the_readme_and_help_list_every_exit_code_the_command_uses() -> None:
    from polyloop.cli._exit import EXIT_BY_REASON, MEANINGS, ExitCode

    section = README.split("Exit codes", 1)[1].split("\n\n", 2)[1]
    documented = dict(re.findall(r"^\| `(\d+)` \| (.+?) \|$", section, flags=re.M))
    assert documented == {str(int(code)): MEANINGS[code] for code in ExitCode}
    assert set(EXIT_BY_REASON) == {str(r) for r in StopReason}  # every stop reason has one
    shown = _help([])
    for code in ExitCode:
        assert f"{int(code):>3}  {MEANINGS[code]}" in shown


def test_the_readme_gives_the_sql_of_a_runs_state_as_the_journals_document_it() -> None:
    from polyloop.journal import _state

    tested = re.search(r"(SELECT run_id,.*?FROM runs)", _state.__doc__ or "", re.S)
    assert tested is not None  # tests/durability/test_journal_contract.py runs this one
    assert " ".join(tested.group(1).split()) in " ".join(README.split())


def test_every_command_is_documented_in_the_readme_and_has_help_with_an_example() -> None:
    for args, command in _commands()[1:]:
        name = args[0]
        assert f"polyloop {name}" in README, name
        assert f"Example: polyloop {name}" in (command.help or ""), name


def test_a_run_completed_after_editing_test_files_is_told_to_check_them() -> None:
    from polyloop.cli._render import test_edit_lines
    from polyloop.types import TestEdit

    edits = [TestEdit(3, "tests/t.py", ("skip_added",)), TestEdit(5, "tests/u.py")]
    assert test_edit_lines(edits, "task_completed") == [
        "completed after editing test files: check that no test was weakened:",
        "  tests/t.py (skip_added) at step 3",
        "  tests/u.py at step 5",
    ]
    assert test_edit_lines(edits, "step_budget")[0] == "test files edited:"
    assert test_edit_lines([], "task_completed") == []


async def limits_of(path: Path, run_id: str) -> Limits:
    async with SQLiteJournal(path) as journal:
        spec, _ = await journal.read(run_id)
        return spec.limits


def test_run_turns_the_failure_guard_on_and_its_options_are_stored_with_the_run(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(completion("Nothing to do.", id="chatcmpl-1"))
    done = cli(*run_args(fake, workspace, "--run-id", "d"))
    assert done.code == 0, done
    assert asyncio.run(limits_of(cli.cwd / "j.db", "d")) == Limits(
        same_failure_limit=2, baseline=True
    )
    fake.script(completion("Nothing to do.", id="chatcmpl-2"))
    chosen = ("--same-failure-limit", "0", "--no-progress-rounds", "3", "--spreading-rounds", "2")
    known = ("--known-failure", "tests/t.py::test_a", "--known-failure", "b", "--baseline")
    done = cli(*run_args(fake, workspace, "--run-id", "o", *chosen, *known))
    assert done.code == 0, done
    assert asyncio.run(limits_of(cli.cwd / "j.db", "o")) == Limits(
        no_progress_rounds=3,
        spreading_rounds=2,
        known_failures=("tests/t.py::test_a", "b"),
        baseline=True,
    )
    bad = cli(*run_args(fake, workspace, "--same-failure-limit", "-1"))
    assert bad.code == 1 and bad.err.strip() == (
        "polyloop: --same-failure-limit takes a count >= 0 (0 turns it off), got -1"
    ), bad


def test_a_run_stuck_on_one_failing_test_stops_repeated_failure_with_exit_code_5(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    (workspace / "test_calc.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(1 + 1, 3)\n"
    )
    tests = json.dumps({"command": f"{sys.executable} -m unittest -q test_calc"})
    fake.script(
        *(
            completion(tool_calls=[tool_call("shell", tests, id=f"c{n}")], id=f"r{n}")
            for n in (1, 2)
        ),
        completion("unreachable", id="r3"),
    )
    model = ("--model", "openai:test-model", "--base-url", fake.url)
    done = cli("run", "fix calc", *model, "--workspace", str(workspace), "--journal", "j.db",
               "--tools", "files,shell", "--no-baseline")  # fmt: skip
    assert done.code == 5, done
    assert "run_id" not in done.err and "repeated_failure after 2 steps" in done.out, done
    shown = cli("show", run_id_of(done.out), "--journal", "j.db")
    assert "**Pattern:** unchanged." in shown.out, shown
    assert "`test_calc.T.test_add` keeps failing the same way" in shown.out, shown


async def test_pending_approve_and_deny_decide_a_parked_run_once(cli: CLI, tmp_path: Path) -> None:
    from tests.contract.test_approval import Mailer, mail_then_answer

    db = tmp_path / "polyloop.db"
    world = Mailer()
    async with SQLiteJournal(db) as journal:
        loop = Loop(FunctionModel(mail_then_answer), tools=world.tools, journal=journal)
        with pytest.raises(ApprovalRequired) as info:
            await loop.run("mail", run_id="parked")
    op = info.value.op_id
    listed = cli("pending", "--journal", str(db))
    assert listed.code == 0, listed
    assert f"parked  step 0  op_id {op}  send_email " in listed.out and "requested " in listed.out
    bad = cli("deny", "parked", op, "--reason", " ", "--journal", str(db))
    assert bad.code == 1 and "must not be empty" in bad.err and "Traceback" not in bad.err
    ok = cli("approve", "parked", op, "--by", "alice", "--journal", str(db))
    assert ok.code == 0, ok
    assert (
        ok.out.startswith("run parked: approved by alice at ")
        and "loop.resume('parked')" in ok.out  # a run started from Python: its code resumes it
    )
    late = cli("deny", "parked", op, "--reason", "no", "--by", "bob", "--journal", str(db))
    assert late.code == 1 and "already approved by alice" in late.err, late
    assert "Traceback" not in late.err
    assert cli("pending", "--journal", str(db)).out.strip() == "no action awaits approval"
    missing = cli("approve", "nope", op, "--journal", str(db))
    assert missing.code == 1 and "no run 'nope'" in missing.err
