"""``SQLiteJournal(path, read_only=True)``: reading a journal without write access to it or its
folder, never writing or creating anything; and a writable journal refused, in one line saying
why, where it could not be written.

The read-only folders and files are real (chmod), and the journals that meet them run in a
child process that permission bits apply to, also as root (tests/read_only.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from pathlib import Path

import pytest

from polyloop import JournalError, Loop, ModelReply
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelIntent, ModelRequest
from tests.conftest import call, make_tools
from tests.durability.journals import spec
from tests.read_only import python, read_only

READ_ONLY = r"opened read-only \(read_only=True\): it is never written to"

# Opens the journal at argv[1] writable (expecting a refusal), then read-only: what it read,
# and what each write said, as JSON on stdout.
CHILD = """
import asyncio, json, sys
from polyloop import JournalError
from polyloop.journal import SQLiteJournal
from tests.durability.journals import spec

async def main(path):
    out = {}
    try:
        SQLiteJournal(path).close()
        out["writable"] = "opened"
    except JournalError as exc:
        out["writable"] = str(exc)
    try:
        journal = SQLiteJournal(path, read_only=True)
    except JournalError as exc:
        out["read_only"] = str(exc)
        print(json.dumps(out))
        return
    async with journal:
        out["immutable"] = journal.immutable
        out["runs"] = [r["run_id"] for r in await journal.list_runs()]
        out["records"] = len((await journal.read("r0"))[1])
        out["steps"] = len(await journal.steps("r0"))
        try:
            await journal.create(spec("new"), ttl_s=60)
            out["create"] = "created"
        except JournalError as exc:
            out["create"] = str(exc)
    print(json.dumps(out))

asyncio.run(main(sys.argv[1]))
"""


def open_in_child(path: Path) -> dict[str, object]:
    done = python(CHILD, str(path))
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


async def write_runs(path: Path, n: int = 2) -> None:
    def fn(req: ModelRequest) -> ModelReply:
        return call("noop") if req.step_idx == 0 else ModelReply("done")

    async with SQLiteJournal(path) as journal:
        loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
        for i in range(n):
            await loop.run("g", run_id=f"r{i}")


async def count_of(path: Path) -> tuple[int, int]:
    """Run r0's records and steps, as a writable journal reads them."""
    async with SQLiteJournal(path) as journal:
        return len((await journal.read("r0"))[1]), len(await journal.steps("r0"))


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# -- a read-only folder -----------------------------------------------------------------------


def test_a_journal_in_a_read_only_folder_is_read_and_never_written(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "j.db"
    asyncio.run(write_runs(path))
    before = files_of(folder)
    assert list(before) == ["j.db"]  # closed cleanly: no -wal, no -shm
    records = asyncio.run(count_of(path))

    with read_only(folder):
        out = open_in_child(path)

    assert out["writable"] == (
        f"cannot write the journal {path}: the directory {folder} is not writable (SQLite "
        "needs to create j.db-wal and j.db-shm next to the journal); make it writable or move "
        "the journal (reading it needs no write access: SQLiteJournal(path, read_only=True), "
        "or the polyloop commands runs, show, stats, export, view, report and check)"
    )
    assert out["immutable"] is True  # no -shm file could be made: read as it is
    assert out["runs"] == ["r0", "r1"]
    assert (out["records"], out["steps"]) == records
    assert "opened read-only (read_only=True): it is never written to" in str(out["create"])
    assert files_of(folder) == before


def test_a_read_only_file_in_a_writable_folder_is_read_with_mode_ro(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    asyncio.run(write_runs(path))
    with read_only(path):
        out = open_in_child(path)
        assert out["writable"] == (
            f"cannot write the journal {path}: the file is not writable; make it writable "
            "(chmod u+w) (reading it needs no write access: SQLiteJournal(path, "
            "read_only=True), or the polyloop commands runs, show, stats, export, view, report "
            "and check)"
        )
    assert out["immutable"] is False  # the -shm file could be made: every commit is seen
    assert out["runs"] == ["r0", "r1"]


def test_commits_left_in_the_wal_of_a_read_only_folder_are_not_silently_skipped(
    tmp_path: Path,
) -> None:
    source, folder = tmp_path / "src", tmp_path / "ro"
    source.mkdir()
    folder.mkdir()

    async def write_and_copy() -> None:
        async with SQLiteJournal(source / "j.db") as journal:
            await journal.create(spec("a"), ttl_s=60)  # in j.db-wal until checkpointed
            for name in ("j.db", "j.db-wal"):  # as a crashed writer leaves them, without -shm
                shutil.copyfile(source / name, folder / name)

    asyncio.run(write_and_copy())
    assert (folder / "j.db-wal").stat().st_size > 0
    with read_only(folder):
        out = open_in_child(folder / "j.db")
    assert str(out["read_only"]).startswith(
        f"cannot read the journal {folder / 'j.db'}: {folder / 'j.db'}-wal holds commits not "
        "yet in the file"
    ), out


# -- read-only, in a writable folder ----------------------------------------------------------


async def test_a_read_only_journal_sees_what_a_writer_commits_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as writer:
        lease = await writer.create(spec("a"), ttl_s=60)
        async with SQLiteJournal(path, read_only=True) as reader:
            assert not reader.immutable
            writers = [t for t in threading.enumerate() if t.name.endswith(f":{path}")]
            assert len(writers) == 1  # the writer's only: a read-only journal starts none
            assert [r["run_id"] for r in await reader.list_runs()] == ["a"]
            await writer.append(lease, [ModelIntent(0, "i", 1)])
            await writer.create(spec("b"), ttl_s=60)
            assert [r["run_id"] for r in await reader.list_runs()] == ["a", "b"]
            assert len((await reader.read("a"))[1]) == 1


async def test_a_read_only_journal_refuses_every_write_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as writer:
        lease = await writer.create(spec("a"), ttl_s=60)
    before = path.read_bytes()
    async with SQLiteJournal(path, read_only=True) as journal:
        assert repr(journal) == f"SQLiteJournal({str(path)!r}, read_only=True)"
        attempts = [
            journal.create(spec("b"), ttl_s=60),
            journal.acquire("a", ttl_s=60),
            journal.append(lease, [ModelIntent(0, "i", 1)]),
            journal.renew(lease, ttl_s=60),
            journal.release(lease),
        ]
        for attempt in attempts:
            with pytest.raises(JournalError, match=READ_ONLY):
                await attempt
        assert journal.commits == 0
    assert path.read_bytes() == before
    # What a SQLite reader leaves in a writable folder: its -shm, and a -wal that stays empty.
    assert files_of(tmp_path)["j.db-wal"] == b""


def test_a_read_only_journal_never_creates_a_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.db"
    with pytest.raises(JournalError, match=r"no journal at .*nope\.db \(a journal opened read-on"):
        SQLiteJournal(path, read_only=True)
    assert list(tmp_path.iterdir()) == []
    path.touch()
    with pytest.raises(JournalError, match="is an empty database, not a PolyLoop journal yet"):
        SQLiteJournal(path, read_only=True)
    assert [p.name for p in tmp_path.iterdir()] == ["nope.db"]
    assert path.read_bytes() == b""
