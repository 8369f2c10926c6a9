"""The PostgreSQL journal (durability.md "Storage", "Leases", "How this is proven"; issue 8):
the SQLite journal's contract, tables and crash-injection proof run again on a real PostgreSQL
server, then leases and fencing between executions that share it.

The scenarios and their assertions are those of tests/durability/test_sqlite_journal.py,
test_crash_injection.py and tests/contract/test_resume.py, imported from there. Every test has
a schema of its own (tests/durability/pg.py). Without PostgreSQL these tests skip, saying how to
run them; CI starts a server (.ci/postgres.sh) and sets POLYLOOP_TEST_PG_DSN.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    ConfigError,
    JournalError,
    LeaseLost,
    Limits,
    Loop,
    ModelReply,
    RunDetached,
    RunExists,
    RunLeased,
    RunNotFound,
    StepRecord,
    StopReason,
    ToolContext,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal, PostgresJournal, SQLiteJournal
from polyloop.journal._owner import host_id, new_owner
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import (
    ActionIntent,
    Lease,
    ModelIntent,
    ModelRequest,
    Record,
    ReplayPolicy,
    RunEnd,
    RunSpec,
    StepAppended,
    StepWritten,
)
from tests.conftest import Crash, RecordingJournal, call, make_tools
from tests.contract.test_resume import World, comparable, new_loop, reference
from tests.durability import pg
from tests.durability.test_sqlite_journal import (
    SCENARIOS,
    first_write,
    make_reference,
    no_such_pid,
    run_child,
    spec,
)

ROOT = Path(__file__).resolve().parents[2]


def _has_psycopg() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True


needs_psycopg = pytest.mark.skipif(
    not _has_psycopg(),
    reason="psycopg is not installed: pip install -e '.[postgres]' (or '.[dev]')",
)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    with pg.server() as dsn:
        yield dsn


@pytest.fixture
def db(pg_dsn: str) -> Iterator[pg.Db]:
    schema = pg.Db(pg_dsn)
    try:
        yield schema
    finally:
        schema.drop()


@contextlib.asynccontextmanager
async def opened(db: pg.Db, **kw: Any) -> AsyncIterator[PostgresJournal]:
    journal = db.journal(**kw)
    try:
        yield await journal.open()
    finally:
        await journal.aclose()


def recording(inner: PostgresJournal, **kw: Any) -> RecordingJournal:
    return RecordingJournal(inner, **kw)  # type: ignore[arg-type]


async def records_of(journal: PostgresJournal, run_id: str) -> tuple[Record, ...]:
    return tuple((await journal.read(run_id))[1])


def version_of(db: pg.Db, run_id: str = "r") -> int:
    return int(db.sql("SELECT version FROM runs WHERE run_id = %s", run_id)[0][0])


# -- the kernel contract on PostgreSQL --------------------------------------------------------


async def test_records_read_back_equal_the_records_appended(db: pg.Db) -> None:
    async with opened(db) as journal:
        rec = recording(journal)
        result = await new_loop(World(), rec).run("pay", run_id="r", metadata={"team": "a"})
        got_spec, records = await journal.read("r")
    assert tuple(records) == tuple(r for batch in rec.appends for r in batch)
    assert got_spec.goal == "pay" and got_spec.metadata == {"team": "a"}
    assert result.stop_reason == StopReason.task_completed


def _rows(fetch: Callable[[str], list[tuple[Any, ...]]]) -> dict[str, Any]:
    """What one backend's tables say about run 's', minus timings and per-run ids."""
    step_cols = [
        f.name for f in fields(StepRecord) if f.name not in ("step_wall_ms", "llm_call_id")
    ]
    return {
        "runs": fetch(
            "SELECT status, stop_reason, stop_detail, final_answer, steps_used, actions_executed, "
            "owner, lease_expires_at, created_at, journal_schema_version, "
            "wording_version, goal, limits_json, metadata_json, history_json FROM runs"
        ),
        "steps": fetch(f"SELECT run_id, {', '.join(step_cols)} FROM steps ORDER BY step_idx"),
        "journal": fetch("SELECT run_id, seq, kind FROM journal ORDER BY seq"),
        "model_calls": fetch(
            "SELECT run_id, step_idx, attempt, state, input_tokens, output_tokens, error "
            "FROM model_calls ORDER BY step_idx, attempt"
        ),
        "meta": fetch("SELECT key, value FROM meta ORDER BY key"),
    }


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_a_scenario_gives_the_memory_result_the_sqlite_rows_and_resumes_as_ended(
    name: str, db: pg.Db, tmp_path: Path
) -> None:
    fn, limits = SCENARIOS[name]

    def loop(journal: Any) -> Loop:
        return Loop(
            FunctionModel(fn), tools=make_tools(), journal=journal, clock=FakeClock(),
            limits=limits,
        )  # fmt: skip

    ref = await loop(MemoryJournal()).run("g", run_id="s", metadata={"n": 1})
    async with opened(db) as journal:
        got = await loop(journal).run("g", run_id="s", metadata={"n": 1})
    assert (got.stop_reason, got.stop_detail, got.final_answer) == (
        ref.stop_reason, ref.stop_detail, ref.final_answer,
    )  # fmt: skip
    assert [comparable(s) for s in got.steps] == [comparable(s) for s in ref.steps]
    assert (got.steps_used, got.actions_executed) == (ref.steps_used, ref.actions_executed)
    async with opened(db) as journal:  # a new object: the ended run comes back as it ended
        model = FunctionModel(fn)
        again = await Loop(model, tools=make_tools(), journal=journal).resume("s")
        assert await journal.steps("s") == list(got.steps)
    assert model.requests == []
    assert again.steps == got.steps and again.messages == got.messages
    # The same rows as the SQLite journal writes for the same run: the backends cannot drift.
    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as lite:
        await loop(lite).run("g", run_id="s", metadata={"n": 1})
    with contextlib.closing(sqlite3.connect(path)) as conn:
        sqlite_rows = _rows(lambda q: [tuple(r) for r in conn.execute(q).fetchall()])
    assert _rows(lambda q: db.sql(q)) == sqlite_rows


def test_the_tables_have_the_sqlite_journals_columns_plus_the_runs_version(
    db: pg.Db, tmp_path: Path
) -> None:
    async def both() -> None:
        async with opened(db):
            pass
        async with SQLiteJournal(tmp_path / "j.db"):
            pass

    asyncio.run(both())
    with contextlib.closing(sqlite3.connect(tmp_path / "j.db")) as conn:
        for table in ("runs", "steps", "journal", "model_calls", "meta"):
            lite = [d[0] for d in conn.execute(f"SELECT * FROM {table} LIMIT 0").description]
            with db.connect() as pgc:
                cur = pgc.execute(f"SELECT * FROM {table} LIMIT 0")
                cols = [d.name for d in cur.description]
            assert [c for c in cols if c != "version"] == lite, table
            assert ("version" in cols) == (table == "runs")


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_around_any_write_resumes_on_a_new_journal_object(
    after: bool, db: pg.Db
) -> None:
    ref_journal, ref = await make_reference()
    total = ref_journal.count
    never_intents = {
        i: batch[0]
        for i, batch in enumerate(ref_journal.appends, start=1)
        if isinstance(batch[0], ActionIntent) and batch[0].replay_policy == ReplayPolicy.never
    }
    gate = asyncio.Semaphore(4)

    async def one(
        n: int, first: PostgresJournal, restarted: PostgresJournal
    ) -> tuple[int, Any, tuple[Record, ...], World]:
        run_id = f"r{n}"  # the crash points are independent runs: they run side by side
        world = World()
        async with gate:
            with pytest.raises(Crash):
                await new_loop(world, recording(first, crash_at=n, crash_after=after)).run(
                    "pay", run_id=run_id
                )
            # The "restarted process": a journal object that never saw the run.
            r = await new_loop(world, restarted).resume(run_id)
            records = await records_of(restarted, run_id)
        return n, r, records, world

    async with opened(db) as first, opened(db) as restarted:
        outcomes = await asyncio.gather(*(one(n, first, restarted) for n in range(1, total + 1)))
    for n, r, records, world in outcomes:
        run_id = f"r{n}"
        assert sum(isinstance(x, RunEnd) for x in records) == 1, n
        assert isinstance(records[-1], RunEnd), n
        assert len(world.charged) <= 1, f"charged twice after a crash at write {n}"
        if len(world.stored) > 2:
            assert len(set(world.stored)) == 2, "an idempotent replay reuses its op_id"
        steps_rows = db.sql("SELECT step_idx FROM steps WHERE run_id = %s ORDER BY 1", run_id)
        assert steps_rows == [(s.step_idx,) for s in r.steps], n  # no step lost or doubled
        seqs = db.sql("SELECT seq FROM journal WHERE run_id = %s ORDER BY seq", run_id)
        assert seqs == [(i,) for i in range(1, len(records) + 1)], n
        unknown = never_intents.get(n if after else n - 1)
        if unknown is not None:
            assert r.stop_reason == StopReason.resume_state_unknown, n
            p = r.pending_action
            assert p is not None and p.tool_name == unknown.action.tool_name
            k = unknown.step_idx
            assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]]
            continue
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert (r.steps_used, r.actions_executed) == (ref.steps_used, ref.actions_executed)
        assert world.charged == ["5"], n
        assert len(r.messages) == len(ref.messages), n


async def test_detach_then_resume_on_another_journal_object(db: pg.Db) -> None:
    world = World()
    async with opened(db) as journal:
        holder: list[Loop] = []

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended) and event.step.step_idx == 1:
                holder[0].detach("r")

        loop = new_loop(world, journal, observers=[on_event])
        holder.append(loop)
        with pytest.raises(RunDetached):
            await loop.run("pay", run_id="r")
    assert db.sql("SELECT status, owner FROM runs") == [("running", None)]
    assert db.sql("SELECT count(*) FROM steps") == [(2,)]
    async with opened(db) as journal:
        r = await new_loop(world, journal).resume("r")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 6


async def test_cancelling_a_run_writes_the_cancelled_end_record(db: pg.Db) -> None:
    started = asyncio.Event()
    tools = ToolRegistry()

    @tools.tool
    async def wait_forever() -> str:
        """Blocks."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = FunctionModel(lambda r: call("wait_forever"))
    async with opened(db) as journal:
        task = asyncio.ensure_future(
            Loop(model, tools=tools, journal=journal, cancel_grace_s=0).run("g", run_id="c")
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with opened(db) as journal:
        r = await Loop(model, tools=tools, journal=journal).resume("c")
    assert r.stop_reason == StopReason.cancelled
    assert db.sql("SELECT stop_reason, owner FROM runs") == [("cancelled", None)]


# -- the crash-injection proof, with real processes killed ------------------------------------


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_then_resume_in_another_process(
    after: bool, db: pg.Db, tmp_path: Path
) -> None:
    """test_crash_injection.py's proof on PostgreSQL: a child process runs the scenario and is
    SIGKILLed just before or after each journal write in turn, holding its lease; another
    process takes the run over at once (its owner is provably dead) and resumes it."""
    ref_journal, ref = await reference()
    writes = ref_journal.appends
    never = {
        i: batch[0] for i, batch in enumerate(writes, start=1)
        if isinstance(batch[0], ActionIntent) and batch[0].replay_policy == ReplayPolicy.never
    }  # fmt: skip
    store_results = {
        i for i, batch in enumerate(writes, start=1)
        if batch[0].kind == "action_result" and "stored" in batch[0].outcome.observation
    }  # fmt: skip
    servers = await asyncio.gather(*(pg.ForkServer.start() for _ in range(3)))

    async def one(n: int, journal: PostgresJournal) -> tuple[int, Any, list[str], World]:
        run_id = f"r{n}"
        effects = tmp_path / f"fx{n}.txt"
        effects.touch()
        code = await servers[n % len(servers)].crash(
            f"postgres:{db.schema_dsn}", run_id, n, after, effects
        )
        assert code == -signal.SIGKILL, (n, code)
        if not after or not any(isinstance(x, RunEnd) for x in writes[n - 1]):
            owner = db.sql("SELECT owner FROM runs WHERE run_id = %s", run_id)
            assert owner[0][0] is not None, n  # it died holding the lease
        world = World()
        result = await new_loop(world, journal).resume(run_id)  # taken over at once
        return n, result, effects.read_text().splitlines(), world

    try:
        async with opened(db) as journal:  # creates the tables the children use
            outcomes = await asyncio.gather(*(one(n, journal) for n in range(1, len(writes) + 1)))
    finally:
        for server in servers:
            await server.close()
    assert len(outcomes) >= 20
    for n, r, lines, world in outcomes:
        charged = [x for x in lines if x.startswith("charged")] + world.charged
        stored = [x.split()[1] for x in lines if x.startswith("stored")] + world.stored
        assert len(charged) <= 1, f"the never-replay tool ran twice (crash at write {n})"
        replayed = len(stored) - len(set(stored))
        if not after and n in store_results:  # it ran, its result was lost: same op_id again
            assert replayed == 1, n
        else:
            assert replayed == 0, n
        unknown = never.get(n if after else n - 1)
        if unknown is not None:
            assert r.stop_reason == StopReason.resume_state_unknown, n
            assert r.pending_action is not None
            assert r.pending_action.tool_name == unknown.action.tool_name, n
            k = unknown.step_idx
            assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]]
            continue
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert (r.steps_used, r.actions_executed) == (ref.steps_used, ref.actions_executed)
        assert len(charged) == 1, n
    # Every run ended exactly once, and its records have no duplicate or gap.
    rows = db.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end'), count(*), max(seq) FROM journal "
        "GROUP BY run_id"
    )
    assert len(rows) == len(writes)
    assert all(ends == 1 and count == top for _, ends, count, top in rows), rows


async def test_the_crash_child_runs_on_postgres_and_its_kill_is_resumed_at_once(
    db: pg.Db, tmp_path: Path
) -> None:
    ref_journal, _ = await make_reference()
    n = first_write(ref_journal, "action_intent", "charge")
    effects = tmp_path / "effects.txt"
    effects.touch()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.durability.crash_child", f"postgres:{db.schema_dsn}",
        str(n), "after", str(effects), cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, err.decode()
    assert db.sql("SELECT owner FROM runs")[0][0] is not None
    world = World()
    async with opened(db) as journal:
        r = await new_loop(world, journal).resume("r")
    assert r.stop_reason == StopReason.resume_state_unknown and world.charged == []
    assert r.pending_action is not None and r.pending_action.tool_name == "charge"
    assert "charged" not in effects.read_text()


# -- the tables, read with plain SQL ----------------------------------------------------------


async def test_runs_table_counts_stop_reasons_with_plain_sql(db: pg.Db) -> None:
    async with opened(db) as journal:
        for name in ("agent_finished", "step_budget", "env_error", "llm_error"):
            fn, limits = SCENARIOS[name]
            loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal, limits=limits,
                        clock=FakeClock())  # fmt: skip
            for i in range(2 if name == "env_error" else 1):
                await loop.run("g", run_id=f"{name}-{i}")
        listed = await journal.list_runs()
        ended = await journal.list_runs(status="ended")
        assert await journal.list_runs(status="running") == []
    counts = dict(db.sql("SELECT stop_reason, count(*) FROM runs GROUP BY 1"))
    assert counts == {"agent_finished": 1, "step_budget": 1, "env_error": 2, "llm_error": 1}
    assert [d["run_id"] for d in listed] == [d["run_id"] for d in ended]
    budget = next(d for d in listed if d["run_id"] == "step_budget-0")
    assert budget["steps_used"] == 3 and budget["limits"]["max_steps"] == 3
    assert "history_json" not in budget and "version" not in budget


async def test_list_runs_has_the_shape_of_the_sqlite_journals(db: pg.Db, tmp_path: Path) -> None:
    async def listed(journal: Any) -> list[dict[str, Any]]:
        loop = new_loop(World(), journal)
        await loop.run("pay", run_id="done", metadata={"k": [1]})
        holder: list[Loop] = []  # and one still running, detached after its first step

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended):
                holder[0].detach("open")

        holder.append(new_loop(World(), journal, observers=[on_event]))
        with pytest.raises(RunDetached):
            await holder[0].run("pay", run_id="open")
        return list(await journal.list_runs())

    async with opened(db) as journal:
        got = await listed(journal)
    async with SQLiteJournal(tmp_path / "j.db") as lite:
        want = await listed(lite)
    assert [sorted(d) for d in got] == [sorted(d) for d in want]
    skip = ("ended_at", "lease_expires_at", "owner")
    assert [{k: v for k, v in d.items() if k not in skip} for d in got] == [
        {k: v for k, v in d.items() if k not in skip} for d in want
    ]
    assert [d["steps_used"] for d in got] == [6, 1]


async def test_model_calls_accounts_mark_an_attempt_lost_in_a_crash_uncertain(db: pg.Db) -> None:
    world = World()
    async with opened(db) as journal:  # crash right after step 0's model intent
        with pytest.raises(Crash):
            await new_loop(world, recording(journal, crash_at=1, crash_after=True)).run(
                "pay", run_id="r"
            )
    assert db.sql("SELECT attempt, state FROM model_calls") == [(1, "pending")]
    async with opened(db) as journal:
        r = await new_loop(world, journal).resume("r")
    rows = db.sql(
        "SELECT step_idx, attempt, state, llm_call_id FROM model_calls ORDER BY step_idx, attempt"
    )
    by_step: dict[int, list[tuple[int, str]]] = {}
    for step_idx, attempt, state, _ in rows:
        by_step.setdefault(step_idx, []).append((attempt, state))
    assert by_step[0] == [(1, "uncertain"), (2, "ok")]
    assert by_step[2] == [(1, "retried"), (2, "ok")]
    assert {row[3] for row in rows if row[2] == "ok"} == {s.llm_call_id for s in r.steps}


async def test_journal_seq_is_contiguous_and_kinds_match_bodies(db: pg.Db) -> None:
    async with opened(db) as journal:
        loop = new_loop(World(), journal)
        await asyncio.gather(*(loop.run("pay", run_id=f"r{i}") for i in range(3)))
    for i in range(3):
        rows = db.sql("SELECT seq, kind, body FROM journal WHERE run_id = %s ORDER BY seq", f"r{i}")
        assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
        assert all(json.loads(body)["kind"] == kind for _, kind, body in rows)
        assert rows[-1][1] == "end"


async def test_journal_bytes_per_step_do_not_grow_with_the_history(db: pg.Db) -> None:
    """A long history is written with the run and never again: the WAL a step writes is the
    same whether the run carries 400 kB of (incompressible) history or none."""

    async def growth_per_step(history_chars: int, conn: Any) -> list[int]:
        sizes: list[int] = []

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended):
                row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'").fetchone()
                sizes.append(int(row[0]))

        history = [{"role": "user", "content": secrets.token_hex(history_chars // 2)}]
        async with opened(db) as journal:
            loop = Loop(
                FunctionModel(lambda r: call("noop")), tools=make_tools(), journal=journal,
                limits=Limits(max_steps=12), observers=[on_event],
            )  # fmt: skip
            await loop.run("g", history=history)
        return [b - a for a, b in itertools.pairwise(sizes)]

    with db.connect() as conn:
        without = await growth_per_step(0, conn)
        with_history = await growth_per_step(400_000, conn)
    assert len(with_history) == 11
    assert max(with_history) < 100_000  # a few kB per step, no history copy
    assert sum(with_history) <= sum(without) * 1.5 + 64_000


async def test_a_nul_character_is_kept_exactly_in_the_journal_and_replaced_in_the_tables(
    db: pg.Db,
) -> None:
    tools = ToolRegistry()

    @tools.tool
    def nul() -> str:
        """Returns text with a NUL."""
        return "a\x00b"

    model = FunctionModel(lambda r: call("nul") if r.step_idx == 0 else ModelReply("fin\x00al"))
    async with opened(db) as journal:
        got = await Loop(model, tools=tools, journal=journal).run("g", run_id="r")
        again = await Loop(model, tools=tools, journal=journal).resume("r")
        table_steps = await journal.steps("r")
    assert got.steps[0].observation == "a\x00b" and got.final_answer == "fin\x00al"
    assert again.steps == got.steps and again.final_answer == got.final_answer
    assert table_steps[0].observation == "a\ufffdb"
    assert db.sql("SELECT final_answer FROM runs") == [("fin\ufffdal",)]
    async with opened(db) as journal:
        with pytest.raises(ValueError, match="NUL"):
            await journal.create(RunSpec("n", "go\x00al", Limits(), 0.0), ttl_s=1)
    assert db.sql("SELECT count(*) FROM runs") == [(1,)]


# -- leases -----------------------------------------------------------------------------------


async def test_a_second_acquire_of_a_live_run_is_run_leased_and_writes_nothing(
    db: pg.Db,
) -> None:
    async with opened(db) as one, opened(db) as two:
        lease = await one.create(spec(), ttl_s=60)
        with pytest.raises(RunExists):
            await two.create(spec(), ttl_s=60)
        before = db.dump()
        with pytest.raises(RunLeased) as info:
            await two.acquire("r", ttl_s=60)
        assert info.value.owner == lease.owner and lease.owner in str(info.value)
        assert info.value.expires_at == pytest.approx(lease.expires_at, abs=2)
        with pytest.raises(RunLeased):
            await new_loop(World(), two).resume("r")
        assert db.dump() == before  # not even the version moved


async def test_an_expired_lease_is_taken_over_and_renewal_moves_only_the_expiry(
    db: pg.Db,
) -> None:
    now = [1000.0]
    async with opened(db, clock=lambda: now[0]) as one, opened(db, clock=lambda: now[0]) as two:
        old = await one.create(spec(), ttl_s=10)
        version = version_of(db)
        now[0] += 9
        with pytest.raises(RunLeased):
            await two.acquire("r", ttl_s=10)
        old = await one.renew(old, ttl_s=10)  # the heartbeat: expiry only, never the version
        assert old.expires_at == 1019.0 and version_of(db) == version
        assert db.sql("SELECT lease_expires_at FROM runs") == [(1019.0,)]
        now[0] += 9.5
        with pytest.raises(RunLeased):
            await two.acquire("r", ttl_s=10)
        now[0] += 1
        new, got_spec, records = await two.acquire("r", ttl_s=10)
        assert new.owner != old.owner and records == ()
        assert got_spec == spec()  # history and metadata come back as stored
        assert db.sql("SELECT owner, lease_expires_at FROM runs") == [(new.owner, now[0] + 10)]
        assert version_of(db) == version + 1  # the claim moved the version


async def test_the_servers_clock_decides_expiry_when_none_is_injected(db: pg.Db) -> None:
    async with opened(db) as journal:
        lease = await journal.create(spec(), ttl_s=1.0)
        with pytest.raises(RunLeased):
            await journal.acquire("r", ttl_s=60)
        await asyncio.sleep(max(0.0, lease.expires_at - time.time()) + 0.1)
        new, _, _ = await journal.acquire("r", ttl_s=60)
    assert new.owner != lease.owner


async def test_a_dead_owners_lease_is_taken_over_at_once(db: pg.Db) -> None:
    child = run_child(
        "import asyncio, os, sys\n"
        "from polyloop import Limits\n"
        "from polyloop.journal import PostgresJournal\n"
        "from polyloop.types import RunSpec\n"
        "async def main():\n"
        "    j = PostgresJournal(sys.argv[1])\n"
        "    lease = await j.create(RunSpec('r', 'g', Limits(), 0.0), ttl_s=3600)\n"
        "    print(lease.owner, flush=True)\n"
        "    os._exit(0)  # dies holding the lease\n"
        "asyncio.run(main())\n",
        db.schema_dsn,
    )
    assert child.returncode == 0, child.stderr
    dead = child.stdout.strip()
    assert db.sql("SELECT owner FROM runs") == [(dead,)]
    async with opened(db) as journal:
        lease, _, _ = await journal.acquire("r", ttl_s=60)  # the lease had an hour to run
        assert lease.owner != dead
        forged = f"{host_id()}/{no_such_pid()}/12345/feedface"  # this host, no such process
        db.sql("UPDATE runs SET owner = %s, lease_expires_at = 1e12", forged)
        lease2, _, _ = await journal.acquire("r", ttl_s=60)
        assert lease2.owner not in (forged, lease.owner)
        other_host = f"elsewhere:1/{no_such_pid()}/12345/feedface"  # cannot be proved dead
        db.sql("UPDATE runs SET owner = %s, lease_expires_at = 1e12", other_host)
        with pytest.raises(RunLeased):
            await journal.acquire("r", ttl_s=60)


async def test_a_stale_owners_writes_after_a_takeover_are_refused(db: pg.Db) -> None:
    now = [1000.0]
    async with (
        opened(db, clock=lambda: now[0]) as stale,
        opened(db, clock=lambda: now[0]) as fresh,
    ):
        old = await stale.create(spec(), ttl_s=10)
        await stale.append(old, [ModelIntent(0, "i", 1)])
        now[0] += 11
        new, _, records = await fresh.acquire("r", ttl_s=60)
        assert [r.kind for r in records] == ["model_intent"]
        await fresh.append(new, [ModelIntent(0, "i", 2)])
        before = db.dump()
        with pytest.raises(LeaseLost, match="no longer holds the lease"):
            await stale.append(old, [ModelIntent(0, "i", 3)])
        with pytest.raises(LeaseLost):
            await stale.renew(old, ttl_s=10)
        await stale.release(old)  # not ours any more: a no-op
        assert db.dump() == before
        assert db.sql("SELECT owner FROM runs") == [(new.owner,)]
        await fresh.append(new, [ModelIntent(0, "i", 3)])  # the new owner goes on
        assert db.sql("SELECT max(seq) FROM journal") == [(3,)]
        states = db.sql("SELECT attempt, state FROM model_calls ORDER BY attempt")
        assert states == [(1, "uncertain"), (2, "uncertain"), (3, "pending")]


async def test_every_write_is_fenced_by_the_runs_version(db: pg.Db) -> None:
    async with opened(db) as journal, opened(db) as other:
        lease = await journal.create(spec(), ttl_s=60)
        v = version_of(db)
        await journal.append(lease, [ModelIntent(0, "i", 1)])
        await journal.append(lease, [ModelIntent(0, "i", 2)])
        assert version_of(db) == v + 2  # one version per write
        await journal.renew(lease, ttl_s=60)
        assert version_of(db) == v + 2
        # The lease's owner string alone is not enough: another journal object never claimed
        # it, so it does not know the version and is refused.
        before = db.dump()
        with pytest.raises(LeaseLost, match="not taken through this journal object"):
            await other.append(lease, [ModelIntent(0, "i", 3)])
        # A write that moved the version behind this execution's back fences it out.
        db.sql("UPDATE runs SET version = version + 1")
        before = db.dump()
        with pytest.raises(LeaseLost, match="version moved on"):
            await journal.append(lease, [ModelIntent(0, "i", 3)])
        assert db.dump() == before


async def test_a_stale_worker_whose_action_outlived_its_lease_writes_nothing(db: pg.Db) -> None:
    """Worker A's lease expires during a slow action; worker B takes the run over and ends
    it. A's next write is refused (LeaseLost): the run ends once, with B's trajectory."""
    now = [1000.0]
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    def tools() -> ToolRegistry:
        reg = ToolRegistry()

        @reg.tool(replay="idempotent")
        async def slow(ctx: ToolContext) -> str:
            """Slow the first time."""
            ran.append(ctx.op_id)
            if len(ran) == 1:
                started.set()
                await release.wait()
            return "done"

        return reg

    def script(r: ModelRequest) -> ModelReply:
        return call("slow") if r.step_idx == 0 else ModelReply("the end")

    async with opened(db, clock=lambda: now[0]) as ja, opened(db, clock=lambda: now[0]) as jb:
        a = asyncio.ensure_future(
            Loop(FunctionModel(script), tools=tools(), journal=ja, lease_ttl_s=30).run(
                "g", run_id="r"
            )
        )
        await started.wait()
        now[0] += 100  # A's lease has expired (its heartbeat never ran: the clock jumped)
        b = await Loop(FunctionModel(script), tools=tools(), journal=jb).resume("r")
        before = db.dump()
        release.set()
        with pytest.raises(LeaseLost):
            await a
        assert db.dump() == before
    assert b.stop_reason == StopReason.agent_finished and b.final_answer == "the end"
    assert ran[0] == ran[1] and len(ran) == 2  # B re-ran the idempotent action, same op_id
    assert db.sql("SELECT count(*) FROM journal WHERE kind = 'end'") == [(1,)]
    assert db.sql("SELECT step_idx FROM steps ORDER BY 1") == [(0,), (1,)]


async def test_the_end_record_releases_the_lease_in_its_transaction(db: pg.Db) -> None:
    async with opened(db) as journal:
        lease = await journal.create(spec(), ttl_s=60)
        end = RunEnd(StopReason.agent_finished, None, "done", 0, 0, 5.0)
        await journal.append(lease, [end])
        assert db.sql(
            "SELECT status, owner, lease_expires_at, final_answer, ended_at FROM runs"
        ) == [("ended", None, None, "done", 5.0)]
        with pytest.raises(LeaseLost):
            await journal.append(lease, [ModelIntent(0, "i", 1)])


async def test_many_executions_racing_to_claim_one_run_exactly_one_wins(db: pg.Db) -> None:
    now = [1000.0]
    async with opened(db, clock=lambda: now[0]) as journal:
        await journal.create(spec(), ttl_s=10)
    now[0] += 11  # expired: everyone may try
    version = version_of(db)
    journals = [db.journal(clock=lambda: now[0], min_size=0, max_size=1) for _ in range(8)]
    try:
        results = await asyncio.gather(
            *(j.acquire("r", ttl_s=60) for j in journals), return_exceptions=True
        )
    finally:
        for j in journals:
            await j.aclose()
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(isinstance(r, RunLeased) for r in results if isinstance(r, BaseException))
    assert version_of(db) == version + 1
    assert db.sql("SELECT owner FROM runs") == [(winners[0][0].owner,)]


_RESUME_CHILD = """
import asyncio, json, os, sys, time
from polyloop import Loop, RunLeased
from polyloop.journal import PostgresJournal
from polyloop.testing import FakeClock, FunctionModel
from tests.contract.test_resume import World, script

dsn, go = sys.argv[1], sys.argv[2]

async def slow(request):
    await asyncio.sleep(0.05)
    return script(request)

async def main():
    journal = await PostgresJournal(dsn).open()
    model = FunctionModel(slow)
    loop = Loop(model, tools=World().tools(), journal=journal, clock=FakeClock())
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        r = await loop.resume("r")
        outcome = r.stop_reason.value
    except RunLeased as exc:
        outcome = "leased"
    await journal.aclose()
    print(json.dumps({"outcome": outcome, "calls": len(model.requests)}), flush=True)

asyncio.run(main())
"""


async def test_two_processes_resuming_one_run_advance_it_exactly_once(
    db: pg.Db, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    async with opened(db) as journal:  # a run interrupted after its first step
        with pytest.raises(Crash):
            await new_loop(World(), recording(journal, crash_at=4, crash_after=True)).run(
                "pay", run_id="r"
            )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pipe = asyncio.subprocess.PIPE
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _RESUME_CHILD,
            db.schema_dsn,
            str(go),
            stdout=pipe,
            stderr=pipe,
            cwd=ROOT,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert (await asyncio.wait_for(child.stdout.readline(), 60)).strip() == b"ready"
        go.touch()
        outs = [await asyncio.wait_for(child.communicate(), 60) for child in children]
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    reports = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outs]
    advanced = [x for x in reports if x["calls"] > 0]
    assert len(advanced) == 1, reports
    assert advanced[0]["outcome"] == "task_completed"
    other = next(x for x in reports if x["calls"] == 0)
    assert other["outcome"] in ("leased", "task_completed")  # refused, or read the ended run
    assert db.sql("SELECT step_idx FROM steps ORDER BY 1") == [(i,) for i in range(6)]
    assert db.sql("SELECT count(*) FROM journal WHERE kind = 'end'") == [(1,)]
    seqs = db.sql("SELECT seq FROM journal ORDER BY seq")
    assert seqs == [(i,) for i in range(1, len(seqs) + 1)]


async def test_200_concurrent_runs_all_complete(db: pg.Db) -> None:
    def fn(req: ModelRequest) -> ModelReply:
        return call("noop") if req.step_idx == 0 else ModelReply(f"answer {req.run_id}")

    async with opened(db) as journal:
        loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
        results = await asyncio.gather(*(loop.run("g", run_id=f"r{i:03}") for i in range(200)))
    expected = [
        "model_intent", "model_result", "action_intent", "action_result", "step",
        "model_intent", "model_result", "step", "end",
    ]  # fmt: skip
    assert all(r.stop_reason == StopReason.agent_finished for r in results)
    assert all(r.final_answer == f"answer {r.run_id}" for r in results)
    kinds = db.sql(
        "SELECT run_id, string_agg(kind, ' ' ORDER BY seq), max(seq), count(*) FROM journal "
        "GROUP BY run_id"
    )
    assert len(kinds) == 200
    assert all(k == " ".join(expected) and m == c == 9 for _, k, m, c in kinds)
    assert db.sql("SELECT count(*), count(owner) FROM runs WHERE status = 'ended'") == [(200, 0)]
    assert db.sql("SELECT count(*) FROM steps") == [(400,)]


async def test_a_conflicting_append_fails_only_itself(db: pg.Db) -> None:
    async with opened(db) as journal:
        leases = {k: await journal.create(spec(k), ttl_s=60) for k in "abcd"}
        step = StepRecord(0, "", 0, 0, None, False, None, None, False, 0, 0, None, 0.0)
        outcomes = await asyncio.gather(
            journal.append(leases["a"], [ModelIntent(0, "a", 1)]),
            journal.append(Lease("b", new_owner(), 0.0), [ModelIntent(0, "b", 1)]),
            journal.append(leases["c"], [StepWritten(step), StepWritten(step)]),  # PK conflict
            journal.append(leases["d"], [ModelIntent(0, "d", 1)]),
            return_exceptions=True,
        )
        assert outcomes[0] is None and outcomes[3] is None
        assert isinstance(outcomes[1], LeaseLost)
        assert isinstance(outcomes[2], JournalError) and "duplicate key" in str(outcomes[2])
        assert [r.kind for r in await records_of(journal, "a")] == ["model_intent"]
        assert await records_of(journal, "b") == () and await records_of(journal, "c") == ()
        assert db.sql("SELECT count(*) FROM steps") == [(0,)]
        # The failed append left the run writable: its next append lands at seq 1.
        await journal.append(leases["c"], [StepWritten(step)])
        assert db.sql("SELECT seq FROM journal WHERE run_id = 'c'") == [(1,)]


@contextlib.contextmanager
def runs_locked(db: pg.Db) -> Iterator[None]:
    """Another session holds the runs table: every journal write waits."""
    conn = db.connect()
    try:
        conn.autocommit = False
        conn.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        yield
    finally:
        conn.commit()
        conn.close()


async def test_a_cancelled_append_still_lands_before_cancelled_error(db: pg.Db) -> None:
    async with opened(db) as journal:
        lease = await journal.create(spec(), ttl_s=60)
        with runs_locked(db):
            task = asyncio.ensure_future(journal.append(lease, [ModelIntent(0, "i", 1)]))
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()  # twice: it still waits for its write
            await asyncio.sleep(0.05)
            assert not task.done()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.kind for r in await records_of(journal, "r")] == ["model_intent"]
        await journal.append(lease, [ModelIntent(0, "i", 2)])  # and the lease still writes


async def test_a_cancelled_create_gives_its_lease_back(db: pg.Db) -> None:
    async with opened(db) as journal:
        with runs_locked(db):
            task = asyncio.ensure_future(journal.create(spec(), ttl_s=60))
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert db.sql("SELECT owner FROM runs") == [(None,)]
        await journal.acquire("r", ttl_s=60)  # resumable at once


# -- what it refuses to read, and leaves as it was --------------------------------------------


async def crashed_run(db: pg.Db) -> None:
    """A run interrupted before its 'charge' action."""
    ref_journal, _ = await make_reference()
    n = first_write(ref_journal, "action_intent", "charge")
    async with opened(db) as journal:
        with pytest.raises(Crash):
            await new_loop(World(), recording(journal, crash_at=n)).run("pay", run_id="r")


async def test_resume_of_an_unknown_run_is_run_not_found(db: pg.Db) -> None:
    async with opened(db) as journal:
        with pytest.raises(RunNotFound, match="ghost"):
            await new_loop(World(), journal).resume("ghost")
        with pytest.raises(RunNotFound):
            await journal.acquire("ghost", ttl_s=1)
        with pytest.raises(RunNotFound):
            await journal.steps("ghost")
        with pytest.raises(RunNotFound):
            await journal.append(Lease("ghost", "x", 0.0), [ModelIntent(0, "i", 1)])
        with pytest.raises(RunNotFound):
            await journal.renew(Lease("ghost", "x", 0.0), ttl_s=1)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("DELETE FROM journal WHERE seq = 5", "out of order"),
        ("UPDATE journal SET seq = seq + 100 WHERE seq = 3", "out of order"),
        ("UPDATE journal SET body = substr(body, 1, 20) WHERE seq = 4", "not valid JSON"),
        ("UPDATE journal SET kind = 'step' WHERE seq = 2", "does not match its kind"),
        ('UPDATE journal SET body = \'{"kind": "model_intent"}\' WHERE seq = 1', "malformed"),
        ("UPDATE runs SET limits_json = '[' ", "runs row is damaged"),
    ],
    ids=["gap", "reordered", "truncated", "kind", "malformed", "runs-row"],
)
async def test_damaged_records_fail_clearly_and_nothing_is_modified(
    damage: str, message: str, db: pg.Db
) -> None:
    await crashed_run(db)
    db.sql(damage)
    before = db.dump()
    world = World()
    async with opened(db) as journal:
        with pytest.raises(JournalError, match=message):
            await new_loop(world, journal).resume("r")
        with pytest.raises(JournalError, match=message):
            await journal.read("r")
    assert db.dump() == before
    assert world.charged == world.stored == []


async def test_records_that_contradict_each_other_fail_and_stay_as_they_were(db: pg.Db) -> None:
    await crashed_run(db)
    seq = db.sql("SELECT min(seq) FROM journal WHERE kind = 'step'")[0][0]
    db.sql("DELETE FROM journal WHERE seq = %s", seq)
    db.sql("UPDATE journal SET seq = seq - 1 WHERE seq > %s", seq)
    before = db.dump()
    async with opened(db) as journal:
        with pytest.raises(JournalError, match="out of order"):
            await new_loop(World(), journal).resume("r")
    assert db.dump() == before
    assert db.sql("SELECT owner FROM runs") == [(None,)]


async def test_a_schema_holding_another_applications_tables_is_refused_untouched(
    db: pg.Db,
) -> None:
    db.sql("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    db.sql("CREATE TABLE runs (id INTEGER)")  # a name clash, to be sure nothing is mixed in
    db.sql("INSERT INTO invoices VALUES (1, 9.5)")
    before = db.dump()
    journal = db.journal()
    with pytest.raises(JournalError, match="not a PolyLoop journal") as info:
        await journal.open()
    assert "invoices" in str(info.value) and "schema=" in str(info.value)
    assert db.dump() == before
    with pytest.raises(JournalError):  # every call says so, and writes nothing
        await journal.create(spec(), ttl_s=1)
    await journal.aclose()
    db.sql("DROP TABLE runs, invoices")
    db.sql("CREATE TABLE meta (name TEXT)")  # a 'meta' that is not ours
    with pytest.raises(JournalError, match="not PolyLoop's"):
        await db.journal().open()


@pytest.mark.parametrize(
    ("key", "version"), [("journal_schema_version", "2.0"), ("step_schema_version", "3.1")]
)
async def test_an_unknown_major_version_is_refused_naming_both_versions(
    key: str, version: str, db: pg.Db
) -> None:
    await crashed_run(db)
    db.sql("UPDATE meta SET value = %s WHERE key = %s", version, key)
    before = db.dump()
    with pytest.raises(JournalError) as info:
        await db.journal().open()
    assert repr(version) in str(info.value) and "1.0" in str(info.value)
    assert "upgrade polyloop" in str(info.value)
    assert db.dump() == before


async def test_a_run_of_an_unknown_major_version_is_refused(db: pg.Db) -> None:
    await crashed_run(db)
    db.sql("UPDATE runs SET journal_schema_version = '9.0'")
    before = db.dump()
    async with opened(db) as journal:
        with pytest.raises(JournalError, match=r"'9\.0'.*1\.0"):
            await new_loop(World(), journal).resume("r")
    assert db.dump() == before


async def test_a_newer_minor_version_opens_and_resumes(db: pg.Db) -> None:
    await crashed_run(db)
    db.sql("UPDATE meta SET value = '1.7' WHERE key = 'journal_schema_version'")
    db.sql("UPDATE runs SET journal_schema_version = '1.7'")
    db.sql("ALTER TABLE steps ADD COLUMN something_new TEXT")  # a minor may add columns
    async with opened(db) as journal:
        r = await new_loop(World(), journal).resume("r")
    assert r.stop_reason == StopReason.task_completed


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("DROP TABLE model_calls", r"lacks the tables \['model_calls'\]"),
        ("ALTER TABLE runs DROP COLUMN version", r"runs lacks the columns \['version'\]"),
        ("DELETE FROM meta WHERE key = 'journal_schema_version'", "without journal_schema_ver"),
    ],
    ids=["table", "column", "meta"],
)
async def test_a_damaged_schema_is_refused_untouched(damage: str, message: str, db: pg.Db) -> None:
    await crashed_run(db)
    db.sql(damage)
    before = db.dump()
    with pytest.raises(JournalError, match=message):
        await db.journal().open()
    assert db.dump() == before


async def test_a_new_schema_gets_the_tables_and_two_journals_opening_it_agree(
    pg_dsn: str,
) -> None:
    name = f"t_{secrets.token_hex(6)}"  # does not exist yet: the journal creates it
    journals = [PostgresJournal(pg_dsn, schema=name) for _ in range(4)]
    try:
        await asyncio.gather(*(j.open() for j in journals))
        with pg.connect(pg_dsn) as conn:
            meta = dict(conn.execute(f"SELECT key, value FROM {name}.meta").fetchall())
    finally:
        for j in journals:
            await j.aclose()
        with pg.connect(pg_dsn) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    assert meta == {"journal_schema_version": "1.0", "step_schema_version": "1.0"}


@needs_psycopg
def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_size"):
        PostgresJournal("postgresql://x@127.0.0.1/db", min_size=5, max_size=2)
    with pytest.raises(ConfigError, match="schema"):
        PostgresJournal("postgresql://x@127.0.0.1/db", schema="")
    with pytest.raises(ConfigError, match="DSN"):
        PostgresJournal("host=127.0.0.1 nonsense")


@needs_psycopg
async def test_an_unreachable_server_is_a_journal_error_naming_it_without_its_password() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    journal = PostgresJournal(f"postgresql://u:secret@127.0.0.1:{port}/db", timeout_s=2)
    with pytest.raises(JournalError, match=f"cannot connect.*127.0.0.1:{port}") as info:
        await journal.read("r")
    assert "secret" not in str(info.value)


async def test_metadata_that_is_not_json_is_refused_before_anything_is_written(
    db: pg.Db,
) -> None:
    async with opened(db) as journal:
        with pytest.raises(TypeError, match="JSON-ready"):
            await journal.create(
                RunSpec("r", "g", Limits(), 0.0, metadata={"x": object()}), ttl_s=1
            )
    assert db.sql("SELECT count(*) FROM runs") == [(0,)]


async def test_a_closed_journal_fails_clearly(db: pg.Db) -> None:
    journal = db.journal()
    lease = await journal.create(spec(), ttl_s=60)  # opens on first use
    await journal.aclose()
    await journal.aclose()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        await journal.append(lease, [ModelIntent(0, "i", 1)])
    with pytest.raises(JournalError, match="closed"):
        await journal.read("r")


# -- the extra is optional --------------------------------------------------------------------

INSTALL_HINT = (
    "the PostgreSQL journal needs psycopg and psycopg-pool: pip install 'polyloop[postgres]'"
)


def test_importing_the_journals_does_not_import_psycopg_and_its_absence_names_the_extra() -> None:
    code = (
        "import sys\n"
        "from polyloop.journal import PostgresJournal\n"
        "print('psycopg' in sys.modules)\n"
        "sys.modules['psycopg'] = None\n"
        "try:\n"
        "    PostgresJournal('postgresql://u@127.0.0.1/db')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.splitlines() == ["False", INSTALL_HINT]


def test_the_lease_reported_is_never_later_than_the_stored_one(db: pg.Db) -> None:
    async def go() -> tuple[Lease, float]:
        async with opened(db) as journal:
            lease = await journal.create(replace(spec(), run_id="r"), ttl_s=30)
            stored = db.sql("SELECT lease_expires_at FROM runs")[0][0]
            return lease, float(stored)

    lease, stored = asyncio.run(go())
    assert lease.expires_at <= stored + 0.05  # same machine: the two clocks agree
