"""``SQLiteJournal(writer="process")``: the appends are committed by a child process, which
lives exactly as long as the journal object (or the process holding it), survives a Ctrl-C,
and whose death fails the appends clearly instead of stranding them. (The whole journal
contract and the crash-injection proof run against it too: the ``sqlite-process`` store.)"""

from __future__ import annotations

import asyncio
import enum
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polyloop import ConfigError, JournalError, Limits, Loop, ModelReply, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.journal._sqlite_process import _plain_dumps
from polyloop.testing import FunctionModel
from polyloop.types import ModelIntent, RunEnd, RunSpec
from tests.durability.journals import REPO

CHILD = "polyloop-journal-writer"  # the first argument of every writer process


def _writer_pids(path: Path) -> list[int]:
    """The live (not zombie) writer processes of the journal file ``path``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if CHILD.encode() in argv and str(path).encode() in argv and state != "Z":
            pids.append(int(entry.name))
    return pids


def _wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _spec(run_id: str) -> RunSpec:
    return RunSpec(run_id, "g", Limits(), 0.0, ({"role": "user", "content": "hi"},), None)


def _sql(path: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(query).fetchall()


def _loop(journal: SQLiteJournal) -> Loop:
    def reply(request: object) -> ModelReply:
        return ModelReply(text="done")

    return Loop(FunctionModel(reply), journal=journal)


async def test_the_appends_are_committed_by_a_child_that_ends_with_the_journal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path, writer="process")
    try:
        [pid] = _writer_pids(path)
        assert pid != os.getpid()
        result = await _loop(journal).run("g", limits=Limits(max_steps=3))
        assert result.stop_reason is StopReason.agent_finished
        _, records = await journal.read(result.run_id)
        assert [r.kind for r in records][-1] == "end"
        assert journal.commits >= 2  # its create (here) and its appends (in the child)
    finally:
        await journal.aclose()
    assert _wait_gone(pid, 0.0), "the writer process outlived close()"
    # A journal opened afterwards reads what the child committed.
    async with SQLiteJournal(path, read_only=True) as reader:
        [summary] = await reader.list_runs()
        assert summary["stop_reason"] == "agent_finished"


async def test_a_killed_writer_process_fails_every_later_append_clearly(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path, writer="process") as journal:
        await _loop(journal).run("g")
        [pid] = _writer_pids(path)
        os.kill(pid, signal.SIGKILL)
        assert _wait_gone(pid)
        for _ in range(2):  # the append that finds it dead, and every later one
            with pytest.raises(JournalError, match=r"writer process \(pid \d+\) ended with exit"):
                await _loop(journal).run("g")
    assert not _writer_pids(path)


def test_a_bad_writer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="writer must be 'thread' or 'process'"):
        SQLiteJournal(tmp_path / "j.db", writer="fork")  # type: ignore[arg-type]


_HOLDER = """
import asyncio, sys
from polyloop import Loop, ModelReply
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel

async def main():
    journal = SQLiteJournal(sys.argv[1], writer="process")
    await Loop(FunctionModel(lambda r: ModelReply(text="done")), journal=journal).run("g")
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def test_the_writer_ignores_ctrl_c_and_ends_when_the_journal_process_dies(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        [pid] = _writer_pids(path)
        os.kill(pid, signal.SIGINT)  # as a Ctrl-C sends it to the whole process group
        os.kill(pid, signal.SIGTERM)
        assert not _wait_gone(pid, 0.5), "the writer process ended on SIGINT/SIGTERM"
        holder.kill()
        holder.wait()
        assert _wait_gone(pid), "the writer process outlived the process holding the journal"
    finally:
        holder.kill()
        holder.wait()


async def test_values_of_the_callers_own_types_go_as_their_plain_values_and_alone(
    tmp_path: Path,
) -> None:
    """A ``str`` enum or subclass the child could never import (defined here, in a function)
    is stored as its plain value, as the writer thread stores it; a batch-mate is untouched."""

    class Detail(str, enum.Enum):  # noqa: UP042 (str() of it is "Detail.HIGH", not its value)
        HIGH = "high"

    class Answer(str):
        pass

    path = tmp_path / "j.db"
    async with SQLiteJournal(path, writer="process") as journal:
        a = await journal.create(_spec("a"), ttl_s=60)
        b = await journal.create(_spec("b"), ttl_s=60)
        end = RunEnd(StopReason.stopped, Detail.HIGH, Answer("42"), 0, 0, 1.0)
        await asyncio.gather(  # one turn of the event loop: one batch
            journal.append(a, [end]), journal.append(b, [ModelIntent(0, "i", 1)])
        )
        [(detail, answer)] = _sql(
            path, "SELECT stop_detail, final_answer FROM runs WHERE run_id = 'a'"
        )
        assert (detail, answer) == ("high", "42")
        assert _sql(path, "SELECT kind FROM journal WHERE run_id = 'b'") == [("model_intent",)]


def test_only_sql_values_are_handed_to_the_child() -> None:
    class Count(int):
        pass

    sent = pickle.loads(_plain_dumps(("a", Count(3), [2.5, None, b"x"], (True,))))
    assert sent == ("a", 3, [2.5, None, b"x"], (True,))
    assert type(sent[1]) is int
    with pytest.raises(TypeError, match="SQL values only, not object objects"):
        _plain_dumps(("a", [object()]))


async def test_the_writer_runs_in_a_session_of_its_own(tmp_path: Path) -> None:
    """So a Ctrl-C at the terminal never reaches it, not even while it starts."""
    async with SQLiteJournal(tmp_path / "j.db", writer="process"):
        [pid] = _writer_pids(tmp_path / "j.db")
        assert os.getsid(pid) == pid != os.getsid(0)


def test_a_forked_copy_of_the_process_does_not_keep_the_writer_alive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path, writer="process")
    asyncio.run(_loop(journal).run("g"))
    [pid] = _writer_pids(path)
    forked = os.fork()
    if forked == 0:  # the copy: it holds on, never touching the journal
        time.sleep(30)
        os._exit(0)
    try:
        journal.close()
        assert _wait_gone(pid)
        # It ended on its own (the end of its pipe), not killed by close() after waiting 30 s
        # for a copy that still held the pipe open.
        assert "exited with code" not in caplog.text
        assert os.waitpid(forked, os.WNOHANG) == (0, 0)  # the copy is still there
    finally:
        os.kill(forked, signal.SIGKILL)
        os.waitpid(forked, 0)
