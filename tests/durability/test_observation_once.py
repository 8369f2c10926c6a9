"""A large observation is stored once in the journal (journal schema 2.0): the step record of an
action whose observation is longer than ``SHARED_ABOVE`` characters refers to the
``action_result`` record before it instead of holding a copy, and that result, written in the
same append, leaves the text to ``steps.observation`` (filled as before). Every reader puts the
text back, on every journal; a journal of schema 1.x (every step holding its observation) is
still read and migrated; a PolyLoop that reads only major 1 refuses a 2.0 journal in one line."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polyloop import JournalError, Loop, StopReason
from polyloop.journal import _observations, _sqlite_read, _versions
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ActionResult, StepWritten
from tests.conftest import Crash, RecordingJournal
from tests.contract.test_resume import comparable
from tests.durability.conftest import OpenJournal
from tests.durability.crash_child import ForkServer
from tests.durability.journals import (
    SQLiteStore,
    Store,
    ended_once_without_gaps,
    recording,
    records_of,
)
from tests.durability.large_observation import SIZE, large_loop, script, text, tools

MB = 1_000_000


def stored_chars(store: Store, run_id: str) -> tuple[int, int]:
    """Characters of the run's ``journal`` bodies, and of its ``steps.observation`` column."""
    bodies = store.sql("SELECT sum(length(body)) FROM journal WHERE run_id = ?", run_id)
    column = store.sql("SELECT sum(length(observation)) FROM steps WHERE run_id = ?", run_id)
    return int(bodies[0][0]), int(column[0][0])


@pytest.mark.parametrize("size", [MB, 20 * MB], ids=["1MB", "20MB"])
async def test_a_large_observation_is_stored_once_in_the_journal_table(
    size: int, journal_backend: Store
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        r = await Loop(
            FunctionModel(script), tools=tools(size), journal=journal, clock=FakeClock()
        ).run("read", run_id="big")
        assert r.stop_reason == StopReason.task_completed
        assert [len(s.observation or "") for s in r.steps] == [size] * 3
        assert await journal.steps("big") == list(r.steps)
        _, records = await journal.read("big")
    results = [x.outcome.observation for x in records if isinstance(x, ActionResult)]
    assert results == [s.observation for s in r.steps]
    bodies, column = stored_chars(store, "big")
    # Three large observations, each written with its step in one append: once each, in
    # steps.observation. Their action results and step records hold none of their text.
    assert bodies < 20_000, bodies
    assert column == 3 * size
    refs = store.sql(
        "SELECT count(*) FROM journal WHERE run_id = ? AND kind = 'step' "
        "AND body LIKE '%\"observation_at\":-1,%'",
        "big",
    )
    assert refs == [(3,)]
    marked = store.sql(
        "SELECT count(*) FROM journal WHERE run_id = ? AND kind = 'action_result' "
        'AND body LIKE \'%"observation_in":"steps",%\'',
        "big",
    )
    assert marked == [(3,)]


async def test_a_result_written_before_its_step_keeps_its_text(journal_backend: Store) -> None:
    """The submit's result is written alone (before a completion guard runs): it keeps its
    observation, and the steps column holds the second copy."""
    store = journal_backend
    async with store.journal() as journal:
        await large_loop(journal).run("read", run_id="r")
    marked = store.sql(
        "SELECT count(*) FROM journal WHERE kind = 'action_result' AND body LIKE '%observation_in%'"
    )
    assert marked == [(2,)]  # the two reads; not the submit
    kept = store.sql(
        "SELECT count(*) FROM journal WHERE kind = 'action_result' "
        "AND body LIKE '%submitted ok line 000001%'"
    )
    assert kept == [(1,)]


async def test_a_small_or_steered_observation_keeps_its_copy(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        r = await large_loop(journal, _observations.SHARED_ABOVE).run("read", run_id="small")
        assert await journal.steps("small") == list(r.steps)
    refs = store.sql(
        "SELECT count(*) FROM journal WHERE kind = 'step' AND body LIKE '%observation_at%'"
    )
    assert refs == [(0,)]  # 4,096 characters: not above the threshold


async def test_every_reader_sees_the_steps_that_were_written(every_journal: OpenJournal) -> None:
    async with every_journal() as journal:
        r = await large_loop(journal).run("read", run_id="big")
        _, records = await journal.read("big")
        if hasattr(journal, "steps"):
            assert await journal.steps("big") == list(r.steps)
    assert r.stop_reason == StopReason.task_completed
    assert [len(s.observation or "") for s in r.steps] == [SIZE] * 3
    assert [x.step for x in records if isinstance(x, StepWritten)] == list(r.steps)
    results = [x.outcome.observation for x in records if isinstance(x, ActionResult)]
    assert [s.observation for s in r.steps] == results
    async with every_journal() as journal:  # ended: resume rebuilds it from the journal
        again = await large_loop(journal).resume("big")
    assert again.steps == r.steps and again.final_answer == r.final_answer


async def test_a_run_resumed_after_a_crash_continues_with_the_observations(
    every_journal: OpenJournal,
) -> None:
    ref = await large_loop(RecordingJournal()).run("read", run_id="big")
    for n in (3, 4, 5):  # around the second read's action (intent, result + step)
        async with every_journal() as journal:
            with pytest.raises(Crash):
                await large_loop(recording(journal, crash_at=n)).run("read", run_id=f"c{n}")
        async with every_journal() as journal:
            r = await large_loop(journal).resume(f"c{n}")
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        # The resumed run's model saw the first read's observation in its context.
        assert r.final_answer == ref.final_answer


async def test_a_1_x_journal_is_read_and_migrated(
    journal_backend: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal written by PolyLoop 1.4 (every step record holds its observation) reads as
    it did; a writer migrates it to 2.0 and its new steps refer to their results."""
    store = journal_backend
    with monkeypatch.context() as old:
        old.setattr(_observations, "SHARED_ABOVE", 10**12)  # as 1.4 wrote every step
        async with store.journal() as journal:
            with pytest.raises(Crash):  # interrupted after its first step
                await large_loop(recording(journal, crash_at=4)).run("read", run_id="old")
    store.damage(
        "UPDATE meta SET value = '1.4' WHERE key = 'journal_schema_version'",
        "UPDATE runs SET journal_schema_version = '1.4'",
    )
    assert store.sql("SELECT count(*) FROM journal WHERE body LIKE '%observation_at%'") == [(0,)]
    async with store.journal() as journal:
        r = await large_loop(journal).resume("old")
        _, records = await journal.read("old")
    assert store.sql("SELECT value FROM meta WHERE key = 'journal_schema_version'") == [("2.1",)]
    ref = await large_loop(RecordingJournal()).run("read", run_id="ref")
    assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps]
    assert [x.step for x in records if isinstance(x, StepWritten)] == list(r.steps)
    refs = store.sql("SELECT count(*) FROM journal WHERE body LIKE '%observation_at%'")
    assert refs == [(1,)]  # the second read's step (the submit's result came before a guard)


async def test_a_polyloop_that_reads_only_major_1_refuses_a_2_0_journal_in_one_line(
    journal_backend: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        await large_loop(journal).run("read", run_id="new")
    before = store.snapshot()
    # The version check of PolyLoop 1.4: journal schema 1.4, major 1 only.
    monkeypatch.setattr(_versions, "JOURNAL_SCHEMA_VERSION", "1.4")
    monkeypatch.setattr(_versions, "_READ_MAJORS", (1,))
    with pytest.raises(JournalError) as info:
        await store.open()
    message = str(info.value)
    assert "\n" not in message
    assert "'2.1'" in message and "1.4" in message and "upgrade polyloop" in message
    assert store.snapshot() == before


async def test_a_reference_to_no_action_result_is_damage(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    async with store.journal() as journal:
        await large_loop(journal).run("read", run_id="r")
    seq = store.sql("SELECT min(seq) FROM journal WHERE body LIKE '%observation_at%'")[0][0]
    store.damage(f"DELETE FROM journal WHERE seq = {seq - 1}")
    store.damage(f"UPDATE journal SET seq = seq - 1 WHERE seq >= {seq}")
    async with store.journal() as journal:
        with pytest.raises(JournalError, match="observation_at=-1, which names no action_result"):
            await journal.read("r")


async def test_a_run_is_read_with_one_query_for_its_observations(tmp_path: Path) -> None:
    """The observations the results left out are read by one query per run read, however
    many records refer to them."""
    store = SQLiteStore(tmp_path / "j.db")
    async with store.journal() as journal:
        await large_loop(journal).run("read", run_id="r")
    with contextlib.closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        _, records = _sqlite_read._read_run(conn, "r")
    assert len(statements) == 3, statements  # the runs row, the records, the observations
    assert [len(x.outcome.observation) for x in records if isinstance(x, ActionResult)] == [
        SIZE
    ] * 3


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM steps WHERE run_id = 'r' AND step_idx = 1",
        "UPDATE steps SET observation = NULL WHERE run_id = 'r' AND step_idx = 1",
    ],
    ids=["missing", "null"],
)
async def test_a_result_whose_steps_row_lost_its_observation_is_damage(
    damage: str, tmp_path: Path
) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    async with store.journal() as journal:
        await large_loop(journal).run("read", run_id="r")
    seq = store.sql(
        "SELECT seq FROM journal WHERE kind = 'action_result' AND body LIKE '%observation_in%' "
        "AND body LIKE '%\"step_idx\":1}'"
    )[0][0]
    store.damage(damage)
    why = (
        f"journal record {seq} cannot be read (has observation_in='steps' but the steps row "
        "of step 1 is missing or holds no observation)"
    )
    async with store.journal() as journal:
        with pytest.raises(JournalError, match=re.escape(why)):
            await journal.read("r")
        with pytest.raises(JournalError, match=re.escape(why)):
            await large_loop(journal).resume("r")
    found = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "polyloop.cli", "check", "--journal", str(tmp_path / "j.db")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 8, found  # ExitCode.DAMAGED
    assert f"run 'r': {why}" in found.stdout, found


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_of_large_observations_then_resume(
    after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    """The ``large`` scenario killed around each write (the result of the submit is a write of
    its own, before its step: a kill between them too) and resumed in another process: the same
    steps, observations included, and each run ended once with no gap in its records."""
    store = journal_backend
    ref_journal = RecordingJournal()
    ref = await large_loop(ref_journal).run("fix", run_id="ref")  # the child's goal
    writes = ref_journal.count
    kinds = [[r.kind for r in batch] for batch in ref_journal.appends]
    assert ["action_result"] in kinds  # the submit's result, alone before its step
    servers = await asyncio.gather(*(ForkServer.start() for _ in range(2)))

    async def one(n: int, journal: Any) -> None:
        run_id = f"l{n}"
        server = servers[n % len(servers)]
        code = await server.crash(store.where, run_id, n, after, tmp_path / "fx", "large")
        assert code == -signal.SIGKILL, (n, code)
        r = await large_loop(journal).resume(run_id)
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        steps = [x.step for x in await records_of(journal, run_id) if isinstance(x, StepWritten)]
        assert steps == list(r.steps) == await journal.steps(run_id), n

    try:
        async with store.journal() as journal:
            await asyncio.gather(*(one(n, journal) for n in range(1, writes + 1)))
    finally:
        for server in servers:
            await server.close()
    assert ended_once_without_gaps(store) == writes
    first = store.sql("SELECT observation FROM steps WHERE run_id = 'l1' AND step_idx = 0")
    assert first == [(text("a"),)]  # the column holds the text, as before
