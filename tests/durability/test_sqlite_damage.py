"""A SQLite journal that SQLite reports damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``) on any
read or write is never written to again by that journal object: every later call raises
``JournalError`` saying what to do, a write in flight fails with it, and the file's bytes stay
as they were.

The damage is real: random bytes over one page of the file, a page chosen by walking the
table's b-tree (so the test does not depend on SQLite's optional ``dbstat`` table), and
``PRAGMA integrity_check`` confirms the file is malformed before the journal is opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import sqlite3
import sys
from pathlib import Path
from typing import Literal

import pytest

from polyloop import JournalError, Loop, ModelReply
from polyloop.journal import SQLiteJournal
from polyloop.journal._sqlite_writer import _Writer
from polyloop.testing import FunctionModel
from polyloop.types import ModelIntent, ModelRequest
from tests.conftest import call, make_tools
from tests.durability.journals import spec

DAMAGED = r"is damaged \(SQLite: .*\); nothing more is written to it\. Run `polyloop check"


# -- damaging a file --------------------------------------------------------------------------


def _page_size(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA page_size").fetchone()[0])


def _root_page(path: Path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        row = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,))
        return int(row.fetchone()[0])


def table_leaves(path: Path, table: str) -> list[int]:
    """The leaf pages of ``table``'s b-tree, in rowid order (file format: sqlite.org/fileformat)."""
    data, size = path.read_bytes(), _page_size(path)
    leaves: list[int] = []

    def walk(page: int) -> None:
        base = (page - 1) * size
        header = base + (100 if page == 1 else 0)
        kind = data[header]
        if kind == 0x0D:  # a table leaf
            leaves.append(page)
            return
        assert kind == 0x05, f"page {page} of {table} has type {kind:#x}"
        cells = int.from_bytes(data[header + 3 : header + 5], "big")
        for i in range(cells):
            at = base + int.from_bytes(data[header + 12 + 2 * i : header + 14 + 2 * i], "big")
            walk(int.from_bytes(data[at : at + 4], "big"))
        walk(int.from_bytes(data[header + 8 : header + 12], "big"))  # the right-most child

    walk(_root_page(path, table))
    return leaves


def overwrite_page(path: Path, page: int, seed: int = 15) -> None:
    """Random bytes (from ``seed``) over the whole of ``page``."""
    size = _page_size(path)
    with path.open("r+b") as f:
        f.seek((page - 1) * size)
        f.write(random.Random(seed).randbytes(size))


def integrity_problems(path: Path) -> list[str]:
    """What ``PRAGMA integrity_check`` finds (SQLite may also fail the check itself)."""
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        try:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        except sqlite3.DatabaseError as exc:
            return [str(exc)]
    return [] if rows == ["ok"] else rows


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def write_runs(path: Path, n: int) -> list[str]:
    """``n`` finished runs of three tool steps each, through the real Loop; their ids."""

    def fn(req: ModelRequest) -> ModelReply:
        return call("noop") if req.step_idx < 3 else ModelReply(f"done {req.run_id} " * 20)

    ids = [f"run-{i:03}" for i in range(n)]
    async with SQLiteJournal(path) as journal:
        loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
        await asyncio.gather(*(loop.run("a goal " * 20, run_id=i) for i in ids))
    return ids


async def read_failures(journal: SQLiteJournal, ids: list[str]) -> list[str]:
    """Read every run; what each read that failed said."""
    failures = []
    for run_id in ids:
        try:
            await journal.read(run_id)
        except JournalError as exc:
            failures.append(str(exc))
    return failures


async def writer_waits_for_the_lock(journal: SQLiteJournal) -> None:
    """Until the writer thread is inside ``BEGIN IMMEDIATE``, waiting for another connection's
    lock: past its check of the journal's health before the batch."""
    writer = journal._writer
    assert isinstance(writer, _Writer)
    for _ in range(1_000_000):
        frame = sys._current_frames().get(writer._thread.ident or -1)
        if frame is not None and frame.f_code.co_name == "_begin":
            return
        await asyncio.sleep(0)
    raise AssertionError("the writer never began its transaction")


# -- the tests --------------------------------------------------------------------------------


async def test_a_journal_found_damaged_by_a_read_is_never_written_again(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    ids = await write_runs(path, 40)
    leaves = table_leaves(path, "journal")
    assert len(leaves) > 10
    overwrite_page(path, leaves[len(leaves) // 2])  # records in the middle of the history
    assert integrity_problems(path), "the damage must be one SQLite itself reports"
    before = digest(path)

    def fn(req: ModelRequest) -> ModelReply:
        return ModelReply("new answer")

    journal = SQLiteJournal(path)  # opening does not read the table pages
    try:
        failures = await read_failures(journal, ids)
        # The run whose records are on the page fails, and so does every read after it.
        assert failures and len(failures) < len(ids), failures
        assert all(f.startswith(f"{path} is damaged (SQLite: ") for f in failures), failures
        assert f"polyloop check --journal {path}" in failures[0]
        assert ".recover" in failures[0]
        with pytest.raises(JournalError, match=DAMAGED):
            await Loop(FunctionModel(fn), journal=journal).run("a new run", run_id="new")
        with pytest.raises(JournalError, match=DAMAGED):
            await journal.list_runs()
        with pytest.raises(JournalError, match=DAMAGED):
            await journal.create(spec("another"), ttl_s=60)
    finally:
        await journal.aclose()
    assert digest(path) == before


@pytest.mark.parametrize("writer", ["thread", "process"])
async def test_a_write_that_meets_damage_fails_with_its_batch_and_no_later_write_lands(
    tmp_path: Path, writer: Literal["thread", "process"]
) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as journal:
        a = await journal.create(spec("a"), ttl_s=3600)
        b = await journal.create(spec("b"), ttl_s=3600)
        for i in range(300):
            await journal.append(a, [ModelIntent(0, f"intent {i} " + "x" * 100, 1)])
    root = _root_page(path, "journal")
    assert len(table_leaves(path, "journal")) > 1  # the root is an interior page
    overwrite_page(path, root)  # every insert into journal goes through it; a renewal does not
    assert integrity_problems(path)
    before = digest(path)

    journal = SQLiteJournal(path, writer=writer)
    try:
        # One turn of the event loop: one batch. The append meets the damage; the renewal,
        # which alone would succeed, fails with it instead of being retried into the file.
        outcomes = await asyncio.gather(
            journal.append(a, [ModelIntent(1, "next", 1)]),
            journal.renew(b, ttl_s=3600),
            return_exceptions=True,
        )
        assert [type(o) for o in outcomes] == [JournalError, JournalError], outcomes
        for outcome in outcomes:
            assert str(outcome).startswith(f"{path} is damaged (SQLite: "), outcome
        with pytest.raises(JournalError, match=DAMAGED):  # later writes never reach the file
            await journal.renew(b, ttl_s=3600)
        with pytest.raises(JournalError, match=DAMAGED):
            await journal.create(spec("c"), ttl_s=60)
        with pytest.raises(JournalError, match=DAMAGED):  # and the reads stop too
            await journal.list_runs()
    finally:
        await journal.aclose()
    assert digest(path) == before


def test_a_journal_whose_schema_page_is_damaged_is_refused_at_open_as_damaged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    asyncio.run(write_runs(path, 2))
    size = _page_size(path)
    with path.open("r+b") as f:  # page 1 after the 100-byte file header: the schema table
        f.seek(100)
        f.write(random.Random(7).randbytes(size - 100))
    before = digest(path)
    with pytest.raises(JournalError, match=DAMAGED):
        SQLiteJournal(path)
    assert digest(path) == before


async def test_a_write_waiting_while_a_read_finds_the_damage_is_not_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    ids = await write_runs(path, 40)
    async with SQLiteJournal(path) as journal:
        lease = await journal.create(spec("live"), ttl_s=3600)
    leaves = table_leaves(path, "journal")
    overwrite_page(path, leaves[len(leaves) // 2])  # a renewal never touches it
    assert integrity_problems(path)
    before = digest(path)

    journal = SQLiteJournal(path)
    try:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # the writer's next transaction waits for this
            renewal = asyncio.ensure_future(journal.renew(lease, ttl_s=3600))
            await writer_waits_for_the_lock(journal)
            failures = await read_failures(journal, ids)
            assert failures and all(f.startswith(f"{path} is damaged (SQLite: ") for f in failures)
            other.execute("COMMIT")
            with pytest.raises(JournalError, match=DAMAGED):
                await renewal
    finally:
        await journal.aclose()
    assert digest(path) == before
