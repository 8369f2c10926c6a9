"""What only the SQLite journal does (durability.md "Storage"): a file (WAL mode, refusing
what is not SQLite), a busy timeout for other writers of the file, group commit through one
writer thread, and that thread's lifecycle.

The contract it shares with every durable journal is test_journal_contract.py and
test_crash_injection.py, run on SQLite there.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import ConfigError, JournalError, Loop, ModelReply, StepRecord, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.journal._owner import new_owner
from polyloop.journal._sqlite_schema import _switch_to_wal
from polyloop.testing import FunctionModel
from polyloop.types import Lease, ModelIntent, ModelRequest, StepWritten
from tests.conftest import call, make_tools
from tests.durability.journals import (
    SQLiteProcessStore,
    SQLiteStore,
    check_only_the_conflict_failed,
    records_of,
    spec,
)

# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    return SQLiteStore(tmp_path / "j.db")


@contextlib.asynccontextmanager
async def opened(store: SQLiteStore, **kw: Any) -> AsyncIterator[SQLiteJournal]:
    journal = store.journal(**kw)
    try:
        yield journal
    finally:
        await journal.aclose()


@contextlib.contextmanager
def file_locked(store: SQLiteStore) -> Any:
    """Another connection holds the file's write lock until the block ends; yields it."""
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")
        try:
            yield other
        finally:
            if other.in_transaction:
                other.execute("COMMIT")


# -- the file ---------------------------------------------------------------------------------


def test_a_file_that_is_not_sqlite_is_refused_untouched(store: SQLiteStore) -> None:
    store.path.write_bytes(os.urandom(8192))
    before = store.snapshot()
    with pytest.raises(JournalError, match="not a SQLite database"):
        SQLiteJournal(store.path)
    assert store.snapshot() == before


async def test_an_empty_file_gets_the_schema_in_wal_mode(store: SQLiteStore) -> None:
    store.path.touch()
    async with opened(store, durability="normal") as journal:
        await journal.create(spec(), ttl_s=1)
    assert store.sql("PRAGMA journal_mode") == [("wal",)]
    meta = dict(store.sql("SELECT key, value FROM meta"))
    assert meta == {"journal_schema_version": "2.1", "step_schema_version": "1.0"}


def _open_together(path: Path, n: int) -> list[BaseException]:
    """``n`` threads construct a SQLiteJournal on ``path`` at the same moment; their errors."""
    barrier = threading.Barrier(n)
    opened: list[SQLiteJournal] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        barrier.wait()
        try:
            opened.append(SQLiteJournal(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for journal in opened:
        journal.close()
    return errors


def test_journals_opening_one_new_file_together_all_open_in_wal_mode(tmp_path: Path) -> None:
    # Switching a new file to WAL needs it to itself: SQLite answers "database is locked" at
    # once, without waiting, when another connection switches it too (about 1 round in 20
    # here before the switch was retried).
    for i in range(60):
        path = tmp_path / f"j{i}.db"
        errors = _open_together(path, 4)
        assert errors == [], f"round {i}: {errors[0]!r}"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


class _BusyConn:
    """A connection whose WAL switch finds the file locked ``busy`` times (then succeeds), or
    fails with ``error``."""

    def __init__(self, busy: int, error: sqlite3.OperationalError | None = None) -> None:
        self.busy, self.error, self.calls = busy, error, 0

    def execute(self, sql: str) -> Any:
        assert sql == "PRAGMA journal_mode = WAL"
        self.calls += 1
        if self.error is not None:
            raise self.error
        if self.calls <= self.busy:
            exc = sqlite3.OperationalError("database is locked")
            exc.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise exc
        return sqlite3.connect(":memory:").execute("SELECT 'wal'")


def test_the_wal_switch_is_retried_while_the_file_is_locked_then_fails_clearly() -> None:
    conn = _BusyConn(busy=3)
    assert _switch_to_wal(conn, "j.db", 5.0) == "wal"  # type: ignore[arg-type]
    assert conn.calls == 4
    stuck = _BusyConn(busy=10**9)
    with pytest.raises(JournalError, match=r"cannot switch the SQLite journal j\.db to WAL"):
        _switch_to_wal(stuck, "j.db", 0.05)  # type: ignore[arg-type]
    assert stuck.calls > 1
    other = sqlite3.OperationalError("disk I/O error")
    other.sqlite_errorcode = sqlite3.SQLITE_IOERR
    failing = _BusyConn(busy=0, error=other)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _switch_to_wal(failing, "j.db", 5.0)  # type: ignore[arg-type]
    assert failing.calls == 1  # only "locked" is waited for


def test_bad_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="durability"):
        SQLiteJournal(tmp_path / "j.db", durability="off")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="MemoryJournal"):
        SQLiteJournal(":memory:")


async def test_a_write_blocked_past_the_busy_timeout_fails_clearly_and_writes_nothing(
    store: SQLiteStore,
) -> None:
    async with opened(store, busy_timeout_s=0.2) as journal:
        lease = await journal.create(spec(), ttl_s=60)
        with file_locked(store), pytest.raises(JournalError, match="locked"):
            await journal.append(lease, [ModelIntent(0, "i", 1)])
        assert await records_of(journal, "r") == ()
        await journal.append(lease, [ModelIntent(0, "i", 1)])  # and it works again
        assert store.sql("SELECT seq FROM journal") == [(1,)]


# -- group commit -----------------------------------------------------------------------------


async def test_200_concurrent_runs_share_commits(store: SQLiteStore) -> None:
    def fn(req: ModelRequest) -> ModelReply:
        return call("noop") if req.step_idx == 0 else ModelReply(f"answer {req.run_id}")

    async with opened(store) as journal:
        loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
        results = await asyncio.gather(*(loop.run("g", run_id=f"r{i:03}") for i in range(200)))
        commits = journal.commits
    assert [r.stop_reason for r in results] == [StopReason.agent_finished] * 200
    writes = 200 * 8  # a create and seven appends per run
    assert commits < writes / 3, f"{commits} commits for {writes} writes: no group commit"


@pytest.mark.parametrize("kind", [SQLiteStore, SQLiteProcessStore], ids=["thread", "process"])
async def test_a_conflicting_append_fails_only_itself_not_its_batch(
    tmp_path: Path, kind: type[SQLiteStore]
) -> None:
    """durability.md: one record's conflict rejects only that record, never its batch-mates;
    also in the writer process, which reruns the batch with a savepoint per append."""
    store = kind(tmp_path / "j.db")
    async with opened(store) as journal:
        leases = {k: await journal.create(spec(k), ttl_s=60) for k in "abcd"}
        step = StepRecord(0, "", 0, 0, None, False, None, None, False, 0, 0, None, 0.0)
        with file_locked(store) as other:  # another writer holds the file
            first = asyncio.ensure_future(journal.renew(leases["a"], ttl_s=60))
            await asyncio.sleep(0.1)  # the writer took it and waits for the lock
            before = journal.commits
            tasks = [
                asyncio.ensure_future(journal.append(leases["a"], [ModelIntent(0, "a", 1)])),
                asyncio.ensure_future(
                    journal.append(Lease("b", new_owner(), 0.0), [ModelIntent(0, "b", 1)])
                ),
                asyncio.ensure_future(  # two step records with one step_idx: a PK conflict
                    journal.append(leases["c"], [StepWritten(step), StepWritten(step)])
                ),
                asyncio.ensure_future(journal.append(leases["d"], [ModelIntent(0, "d", 1)])),
            ]
            await asyncio.sleep(0.1)
            assert not any(t.done() for t in tasks)
            other.execute("COMMIT")
            await first
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert journal.commits - before == 2  # the renewal alone, then the four together
        await check_only_the_conflict_failed(store, journal, leases, step, outcomes)


async def test_the_writes_of_one_event_loop_turn_share_one_commit(store: SQLiteStore) -> None:
    async with opened(store) as journal:
        before = journal.commits
        # The 20 tasks each write in the same turn of the event loop: one hand-over, one batch.
        leases = await asyncio.gather(*(journal.create(spec(f"r{i}"), ttl_s=60) for i in range(20)))
        assert journal.commits - before == 1
        await asyncio.gather(*(journal.append(x, [ModelIntent(0, x.run_id, 1)]) for x in leases))
        assert journal.commits - before == 2
    assert store.sql("SELECT count(*) FROM journal") == [(20,)]


async def test_without_group_commit_every_write_commits_alone(store: SQLiteStore) -> None:
    async with opened(store, group_commit=False) as journal:
        leases = [await journal.create(spec(f"r{i}"), ttl_s=60) for i in range(20)]
        before = journal.commits
        await asyncio.gather(*(journal.append(x, [ModelIntent(0, x.run_id, 1)]) for x in leases))
        assert journal.commits - before == 20


# -- the writer thread ------------------------------------------------------------------------


async def test_close_stops_the_writer_and_later_calls_fail_clearly(store: SQLiteStore) -> None:
    journal = store.journal()
    lease = await journal.create(spec(), ttl_s=60)
    thread = journal._writer._thread
    await journal.aclose()
    assert not thread.is_alive()
    journal.close()  # idempotent, from synchronous code too
    with pytest.raises(JournalError, match="closed"):
        await journal.append(lease, [ModelIntent(0, "i", 1)])


async def test_a_write_queued_before_close_is_finished_by_it(store: SQLiteStore) -> None:
    journal = store.journal()
    lease = await journal.create(spec(), ttl_s=60)
    append = asyncio.create_task(journal.append(lease, [ModelIntent(0, "i", 1)]))
    await asyncio.sleep(0)  # the append is queued; the writer is woken only after this turn
    journal.close()  # (blocking, from the event loop's thread: a test's shortcut)
    await append  # finished and durable, not refused as "closed"
    assert [kind for (kind,) in store.sql("SELECT kind FROM journal")] == ["model_intent"]


def test_an_unclosed_journal_stops_its_writer_when_collected(store: SQLiteStore) -> None:
    journal = store.journal()
    thread = journal._writer._thread
    del journal
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()
