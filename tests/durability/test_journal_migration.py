"""A journal written by an older minor version of the table schema (1.0: no
``steps.replaced_chars``; 1.1: no ``steps.model`` and no ``model_calls.model``,
``response_model``, ``cached_tokens``, ``reasoning_tokens``; 1.2: no ``runs.request``,
``request_reason``, ``requested_by``, ``requested_at``; 1.3: no ``steps.outcome_unknown``, and
``runs.status`` only 'running' or 'ended') still opens, on SQLite and PostgreSQL: a
writer migrates it (adds the columns, sets the version in ``meta``) and the run goes on; its
steps read back without the columns, with the fields' defaults."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from polyloop import ApprovalRequired, JournalError, Loop, StopReason
from polyloop.journal import SQLiteJournal, _sqlite_schema
from polyloop.journal._rows import _steps_from_rows
from polyloop.journal._sql import REQUEST_COLUMNS as _REQUEST_COLUMNS
from polyloop.journal._sqlite_schema import JOURNAL_SCHEMA_VERSION
from polyloop.testing import FakeClock, FunctionModel
from tests.contract.test_approval import Mailer, mail_then_answer
from tests.contract.test_resume import World, new_loop
from tests.durability.journals import SQLiteStore, Store, crashed_run

ADDED_IN_1_4 = (("steps", "outcome_unknown"),)
ADDED_IN_1_3 = (
    ("steps", "wrap_up"),
    ("model_calls", "cost_usd"),
    ("runs", "tokens_used"),
    ("runs", "cost_usd"),
    ("runs", "active_seconds"),
    ("runs", "usage_missing"),
    *(("runs", c) for c in _REQUEST_COLUMNS),
)
ADDED_IN_1_2 = (
    ("steps", "model"),
    ("model_calls", "model"),
    ("model_calls", "response_model"),
    ("model_calls", "cached_tokens"),
    ("model_calls", "reasoning_tokens"),
)
TO_1_3 = (
    *(f"ALTER TABLE {table} DROP COLUMN {column}" for table, column in ADDED_IN_1_4),
    "UPDATE meta SET value = '1.3' WHERE key = 'journal_schema_version'",
    "UPDATE runs SET journal_schema_version = '1.3'",
)
TO_1_2 = (
    *TO_1_3,
    *(f"ALTER TABLE {table} DROP COLUMN {column}" for table, column in ADDED_IN_1_3),
    "UPDATE meta SET value = '1.2' WHERE key = 'journal_schema_version'",
    "UPDATE runs SET journal_schema_version = '1.2'",
)
TO_1_1 = (
    *TO_1_2,
    *(f"ALTER TABLE {table} DROP COLUMN {column}" for table, column in ADDED_IN_1_2),
    "UPDATE meta SET value = '1.1' WHERE key = 'journal_schema_version'",
    "UPDATE runs SET journal_schema_version = '1.1'",
)
TO_1_0 = (
    *TO_1_1,
    "ALTER TABLE steps DROP COLUMN replaced_chars",
    "UPDATE meta SET value = '1.0' WHERE key = 'journal_schema_version'",
    "UPDATE runs SET journal_schema_version = '1.0'",
)


async def a_1_0_journal(store: Store) -> None:
    """A run interrupted with steps written, in a journal as schema 1.0 left it."""
    await crashed_run(store)
    store.damage(*TO_1_0)
    assert "replaced_chars" not in step_columns(store)


def step_columns(store: Store) -> list[str]:
    rows = store.rows("SELECT * FROM steps")
    assert rows, "the interrupted run has steps"
    return list(rows[0])


def journal_version(store: Store) -> str:
    rows = store.sql("SELECT value FROM meta WHERE key = 'journal_schema_version'")
    return str(rows[0][0])


async def test_the_steps_of_a_1_0_journal_read_back_without_the_column(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await a_1_0_journal(store)
    rows = store.rows("SELECT * FROM steps WHERE run_id = ? ORDER BY step_idx", "r")
    names = list(rows[0])
    steps = _steps_from_rows(names, [tuple(row.values()) for row in rows])
    assert [s.step_idx for s in steps] == list(range(len(rows)))
    assert {s.replaced_chars for s in steps} == {0}
    assert {s.model for s in steps} == {None}


async def test_a_writer_migrates_a_1_0_journal_and_the_run_goes_on(journal_backend: Store) -> None:
    store = journal_backend
    await a_1_0_journal(store)
    assert journal_version(store) == "1.0"
    async with store.journal() as journal:
        assert journal_version(store) == JOURNAL_SCHEMA_VERSION == "2.1"
        r = await new_loop(World(), journal).resume("r")
        assert await journal.steps("r") == list(r.steps)
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 6
    assert "replaced_chars" in step_columns(store)
    assert store.sql("SELECT DISTINCT replaced_chars FROM steps") == [(0,)]
    # The run's row keeps the version it was created with; a new run gets the new one.
    assert store.sql("SELECT journal_schema_version FROM runs") == [("1.0",)]
    async with store.journal() as journal:  # migrated once: a second writer changes nothing
        await new_loop(World(), journal).run("pay", run_id="new")
    assert sorted(store.sql("SELECT journal_schema_version FROM runs")) == [("1.0",), ("2.1",)]


async def test_a_writer_migrates_a_1_1_journal_and_new_attempts_fill_the_new_columns(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    store.damage(*TO_1_1)
    assert "model" not in step_columns(store)
    async with store.journal() as journal:
        assert journal_version(store) == "2.1"
        r = await new_loop(World(), journal).resume("r")
    assert r.stop_reason == StopReason.task_completed
    assert "model" in step_columns(store) and "replaced_chars" in step_columns(store)
    calls = store.rows("SELECT * FROM model_calls ORDER BY step_idx, attempt")
    assert {"model", "response_model", "cached_tokens", "reasoning_tokens"} <= set(calls[0])
    # The rows written before the migration have NULL in the added columns.
    assert {row["model"] for row in calls} == {None}  # the scripted model has no name


async def test_a_writer_migrates_a_1_2_journal_and_the_end_sets_the_run_totals(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    store.damage(*TO_1_2)
    async with store.journal() as journal:
        assert journal_version(store) == "2.1"
        r = await new_loop(World(), journal).resume("r")
    assert r.stop_reason == StopReason.task_completed
    (row,) = store.rows(
        "SELECT tokens_used, cost_usd, active_seconds, usage_missing FROM runs WHERE run_id = ?",
        "r",
    )
    assert row["tokens_used"] == r.totals.tokens and row["usage_missing"] == r.totals.usage_missing
    assert row["active_seconds"] == r.totals.active_s and row["cost_usd"] == 0.0


async def test_a_writer_migrates_a_1_2_journal_and_its_runs_take_requests(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    store.damage(*TO_1_2)
    assert "request" not in store.rows("SELECT * FROM runs")[0]
    async with store.journal() as journal:
        assert journal_version(store) == "2.1"
        listed = await journal.list_runs(run_id="r")
        assert [listed[0][c] for c in _REQUEST_COLUMNS] == [None] * 4  # nothing asked yet
        answer = await new_loop(World(), journal).stop("r", "migrated", by="me")
    assert answer.happened == "ended" and answer.stop_reason == StopReason.stopped
    row = store.rows("SELECT * FROM runs")[0]
    assert [row[c] for c in _REQUEST_COLUMNS[:3]] == ["stop", "migrated", "me"]
    assert (row["stop_reason"], row["stop_detail"]) == ("stopped", "migrated")


async def test_a_writer_migrates_a_1_3_journal_and_its_steps_have_outcome_unknown(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    store.damage(*TO_1_3)
    assert "outcome_unknown" not in step_columns(store)
    async with store.journal() as journal:
        assert {s.outcome_unknown for s in await journal.steps("r")} == {None}
        assert journal_version(store) == "2.1"
        r = await new_loop(World(), journal).resume("r")
        assert await journal.steps("r") == list(r.steps)
    assert r.stop_reason == StopReason.task_completed
    assert store.sql("SELECT DISTINCT outcome_unknown FROM steps") == [(None,)]


async def test_a_1_2_journal_read_without_migrating_lists_its_runs_without_requests(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    await crashed_run(store)
    store.damage(*TO_1_2)
    async with store.journal(read_only=True) as journal:
        listed = await journal.list_runs()
    assert [(r["run_id"], r["request"], r["requested_by"]) for r in listed] == [("r", None, None)]
    assert journal_version(store) == "1.2"  # a reader does not migrate


async def test_a_1_1_journal_without_the_column_is_refused_as_damaged(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    store.damage("ALTER TABLE steps DROP COLUMN replaced_chars")
    before = store.snapshot()
    with pytest.raises(JournalError, match=r"steps lacks the columns \['replaced_chars'\]"):
        await store.open()
    assert store.snapshot() == before


async def test_a_column_a_newer_minor_adds_while_a_journal_reads_is_read_past(
    journal_backend: Store,
) -> None:
    # A newer PolyLoop migrates the journal while this one has read its steps many times (on
    # PostgreSQL, often enough that the query is a prepared statement on the connection).
    store = journal_backend
    await crashed_run(store)
    async with store.journal() as journal:
        for _ in range(12):
            before = await journal.steps("r")
        store.damage(
            "ALTER TABLE steps ADD COLUMN added_by_1_9 INTEGER NOT NULL DEFAULT 0",
            "UPDATE meta SET value = '1.9' WHERE key = 'journal_schema_version'",
        )
        assert await journal.steps("r") == before
        r = await new_loop(World(), journal).resume("r")
        assert await journal.steps("r") == list(r.steps)
    assert r.stop_reason == StopReason.task_completed


async def test_a_1_0_journal_another_connection_keeps_locked_is_refused_in_one_line(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    await a_1_0_journal(store)
    with contextlib.closing(sqlite3.connect(store.path, isolation_level=None)) as other:
        other.execute("BEGIN IMMEDIATE")  # the migration's transaction cannot begin
        with pytest.raises(JournalError) as refused:
            SQLiteJournal(store.path, busy_timeout_s=0.05)
        other.execute("COMMIT")
    assert str(refused.value) == (
        f"cannot open the SQLite journal {store.path}: another connection kept it locked for "
        "longer than busy_timeout_s=0.05 s (database is locked); it was not modified. Try "
        "again, or pass a longer busy_timeout_s"
    )
    assert journal_version(store) == "1.0"
    async with store.journal() as journal:  # once the lock is gone, it migrates
        assert journal_version(store) == JOURNAL_SCHEMA_VERSION
        r = await new_loop(World(), journal).resume("r")
    assert r.stop_reason == StopReason.task_completed


def narrow_status(store: Store) -> tuple[str, ...]:
    """What journal schema 1.3 had: ``runs.status`` only 'running' or 'ended'."""
    old, new = _sqlite_schema._OLD_STATUS_CHECK, _sqlite_schema._NEW_STATUS_CHECK
    if isinstance(store, SQLiteStore):
        return (
            "PRAGMA writable_schema = ON",
            f'UPDATE sqlite_master SET sql = replace(sql, "{new}", "{old}") WHERE name = \'runs\'',
            "PRAGMA writable_schema = OFF",
        )
    return (
        "ALTER TABLE runs DROP CONSTRAINT runs_status_check",
        f"ALTER TABLE runs ADD CONSTRAINT runs_status_check {old}",
    )


async def test_a_writer_migrates_a_1_3_journal_and_its_runs_can_park(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    store.damage(
        *narrow_status(store),
        "UPDATE meta SET value = '1.3' WHERE key = 'journal_schema_version'",
    )
    with pytest.raises(Exception, match=r"(?i)check"):  # a 1.3 table refuses the status
        store.damage("UPDATE runs SET status = 'awaiting_approval'")
    async with store.journal() as journal:
        assert journal_version(store) == "2.1"
        world = Mailer()
        with pytest.raises(ApprovalRequired):
            await Loop(FunctionModel(mail_then_answer), tools=world.tools, journal=journal,
                       clock=FakeClock()).run("mail", run_id="parks")  # fmt: skip
    assert store.sql("SELECT status FROM runs WHERE run_id = 'parks'") == [("awaiting_approval",)]
