"""What only the PostgreSQL journal does (durability.md "Storage", "Leases"; issue 8): the
SQLite journal's rows, columns and listings on a server, fencing by the run row's version, the
server's clock, schemas, text PostgreSQL cannot hold, and psycopg as an optional extra.

The contract it shares with every durable journal is test_journal_contract.py and
test_crash_injection.py, run on PostgreSQL there. Every test has a schema of its own
(tests/durability/pg.py). Without PostgreSQL these tests skip, saying how to run them; CI
starts a server (.ci/postgres.sh) and sets POLYLOOP_TEST_PG_DSN.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    ConfigError,
    JournalError,
    LeaseLost,
    Limits,
    Loop,
    RunDetached,
    RunLeased,
    StepRecord,
)
from polyloop.journal import PostgresJournal
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelIntent, RunSpec, StepAppended
from tests.conftest import make_tools
from tests.contract.test_resume import World, new_loop
from tests.durability import pg
from tests.durability.journals import (
    SCENARIOS,
    PostgresStore,
    SQLiteStore,
    crashed_run,
    nul_loop,
    spec,
)


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


def version_of(db: PostgresStore, run_id: str = "r") -> int:
    return int(db.sql("SELECT version FROM runs WHERE run_id = ?", run_id)[0][0])


# -- the SQLite journal's tables, on a server -------------------------------------------------


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
async def test_a_scenario_writes_the_rows_the_sqlite_journal_writes(
    name: str, db: PostgresStore, tmp_path: Path
) -> None:
    fn, limits = SCENARIOS[name]
    lite = SQLiteStore(tmp_path / "j.db")
    for store in (db, lite):
        async with store.journal() as journal:
            loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal,
                        clock=FakeClock(), limits=limits)  # fmt: skip
            await loop.run("g", run_id="s", metadata={"n": 1})
    assert _rows(db.sql) == _rows(lite.sql)


async def test_the_tables_have_the_sqlite_journals_columns_plus_the_runs_version(
    db: PostgresStore, tmp_path: Path
) -> None:
    lite = SQLiteStore(tmp_path / "j.db")
    for store in (db, lite):
        async with store.journal():
            pass
    for table in ("runs", "steps", "journal", "model_calls", "meta"):
        with db.connect() as conn:
            cols = [d.name for d in conn.execute(f"SELECT * FROM {table} LIMIT 0").description]
        lite_cols = [name for _, name, *_ in lite.sql(f"PRAGMA table_info({table})")]
        assert [c for c in cols if c != "version"] == lite_cols, table
        assert ("version" in cols) == (table == "runs")


async def test_list_runs_has_the_shape_of_the_sqlite_journals(
    db: PostgresStore, tmp_path: Path
) -> None:
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

    async with db.journal() as journal:
        got = await listed(journal)
    async with SQLiteStore(tmp_path / "j.db").journal() as lite:
        want = await listed(lite)
    assert [sorted(d) for d in got] == [sorted(d) for d in want]
    skip = ("ended_at", "lease_expires_at", "owner", "active_seconds")  # timings, owners
    assert [{k: v for k, v in d.items() if k not in skip} for d in got] == [
        {k: v for k, v in d.items() if k not in skip} for d in want
    ]
    assert [d["steps_used"] for d in got] == [6, 1]


async def test_a_nul_character_is_replaced_in_the_tables_and_refused_where_it_would_be_lost(
    db: PostgresStore,
) -> None:
    async with db.journal() as journal:
        got = await nul_loop(journal).run("g", run_id="r")
        table_steps = await journal.steps("r")
    assert got.steps[0].observation == "a\x00b"  # the journal's records keep it exactly
    assert table_steps[0].observation == "a\ufffdb"
    assert db.sql("SELECT final_answer FROM runs") == [("fin\ufffdal",)]
    async with db.journal() as journal:
        with pytest.raises(ValueError, match="NUL"):
            await journal.create(RunSpec("n", "go\x00al", Limits(), 0.0), ttl_s=1)
    assert db.sql("SELECT count(*) FROM runs") == [(1,)]


# -- leases: the server's clock, fencing by the run row's version -----------------------------


async def test_the_servers_clock_decides_expiry_when_none_is_injected(db: PostgresStore) -> None:
    async with db.journal() as journal:
        lease = await journal.create(spec(), ttl_s=1.0)
        with pytest.raises(RunLeased):
            await journal.acquire("r", ttl_s=60)
        await asyncio.sleep(max(0.0, lease.expires_at - time.time()) + 0.1)
        new, _, _ = await journal.acquire("r", ttl_s=60)
    assert new.owner != lease.owner


async def test_every_write_is_fenced_by_the_runs_version(db: PostgresStore) -> None:
    async with db.journal() as journal, db.journal() as other:
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
        assert db.dump() == before
        # A write that moved the version behind this execution's back fences it out.
        db.sql("UPDATE runs SET version = version + 1")
        before = db.dump()
        with pytest.raises(LeaseLost, match="version moved on"):
            await journal.append(lease, [ModelIntent(0, "i", 3)])
        assert db.dump() == before


# -- group commit ---------------------------------------------------------------------------


def transactions_of(db: PostgresStore, kind: str) -> set[str]:
    """The transactions that wrote the ``kind`` records (a row's ``xmin``)."""
    return {x for (x,) in db.sql("SELECT xmin::text FROM journal WHERE kind = ?", kind)}


async def test_the_appends_of_one_event_loop_turn_share_one_transaction(db: PostgresStore) -> None:
    async with db.journal() as journal:
        leases = [await journal.create(spec(f"r{i}"), ttl_s=60) for i in range(20)]
        versions = [version_of(db, x.run_id) for x in leases]
        await asyncio.gather(*(journal.append(x, [ModelIntent(0, x.run_id, 1)]) for x in leases))
        assert len(transactions_of(db, "model_intent")) == 1
        # Each run's version moved by one (its own fence), and the next appends go on from it.
        assert [version_of(db, x.run_id) for x in leases] == [v + 1 for v in versions]
        await asyncio.gather(
            *(journal.append(x, [ModelIntent(1, f"{x.run_id}-1", 1)]) for x in leases)
        )
    assert len(transactions_of(db, "model_intent")) == 2
    seqs = db.sql("SELECT run_id, seq FROM journal")
    assert sorted(seqs) == sorted((f"r{i}", n) for i in range(20) for n in (1, 2))
    assert db.sql("SELECT count(*) FROM model_calls WHERE state = 'pending'") == [(40,)]


async def test_appends_sharing_a_transaction_return_only_after_its_commit(
    db: PostgresStore,
) -> None:
    async with db.journal() as journal:
        leases = [await journal.create(spec(f"r{i}"), ttl_s=60) for i in range(3)]
        with db.writes_blocked():  # another session holds the runs table: the fence waits
            tasks = [
                asyncio.ensure_future(journal.append(x, [ModelIntent(0, x.run_id, 1)]))
                for x in leases
            ]
            await asyncio.sleep(0.2)
            assert not any(t.done() for t in tasks)
            assert db.sql("SELECT count(*) FROM journal") == [(0,)]
        await asyncio.gather(*tasks)
    assert db.sql("SELECT count(*) FROM journal") == [(3,)]
    assert len(transactions_of(db, "model_intent")) == 1


async def test_a_lease_taken_over_fails_alone_in_a_shared_transaction(db: PostgresStore) -> None:
    async with db.journal() as journal, db.journal() as other:
        leases = {k: await journal.create(spec(k), ttl_s=60) for k in "abc"}
        db.sql("UPDATE runs SET lease_expires_at = 0 WHERE run_id = 'b'")  # b's lease expired
        await other.acquire("b", ttl_s=60)  # and another execution took the run over
        outcomes = await asyncio.gather(
            *(journal.append(leases[k], [ModelIntent(0, k, 1)]) for k in "abc"),
            return_exceptions=True,
        )
    assert outcomes[0] is None and outcomes[2] is None
    assert isinstance(outcomes[1], LeaseLost)
    assert db.sql("SELECT run_id FROM journal ORDER BY run_id") == [("a",), ("c",)]


async def test_closing_finishes_the_appends_already_queued(db: PostgresStore) -> None:
    journal = db.journal()
    await journal.open()
    leases = [await journal.create(spec(f"r{i}"), ttl_s=60) for i in range(5)]
    tasks = [
        asyncio.ensure_future(journal.append(x, [ModelIntent(0, x.run_id, 1)])) for x in leases
    ]
    for _ in range(2):  # each append's task starts, then its write's: queued, not yet sent
        await asyncio.sleep(0)
    await journal.aclose()
    assert all(t.done() and t.exception() is None for t in tasks)
    assert db.sql("SELECT count(*) FROM journal") == [(5,)]
    with pytest.raises(JournalError, match="closed"):
        await journal.append(leases[0], [ModelIntent(0, "r0", 2)])


# -- schemas ----------------------------------------------------------------------------------


async def test_a_refused_schema_fails_every_call_and_writes_nothing(db: PostgresStore) -> None:
    db.damage(
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)",
        "INSERT INTO invoices VALUES (1, 9.5)",
    )
    before = db.dump()
    journal = db.journal()
    with pytest.raises(JournalError, match="not a PolyLoop journal"):
        await journal.open()
    with pytest.raises(JournalError, match="not a PolyLoop journal"):  # every call says so
        await journal.create(spec(), ttl_s=1)
    await journal.aclose()
    assert db.dump() == before


async def test_a_runs_table_without_its_version_is_refused_untouched(db: PostgresStore) -> None:
    await crashed_run(db)
    db.damage("ALTER TABLE runs DROP COLUMN version")
    before = db.dump()
    with pytest.raises(JournalError, match=r"runs lacks the columns \['version'\]"):
        await db.open()
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
    assert meta == {"journal_schema_version": "2.1", "step_schema_version": "1.0"}


# -- settings and the server ------------------------------------------------------------------


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
