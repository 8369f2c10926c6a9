"""The durable journals behind one interface, and the helpers their tests share.

A *store* is where a durable journal keeps its tables: a SQLite file (:class:`SQLiteStore`) or a
PostgreSQL schema (:class:`PostgresStore`). The contract suite (test_journal_contract.py,
test_crash_injection.py) gets a fresh one per test from the ``journal_backend`` fixture
(tests/durability/conftest.py) and, through it:

- opens as many journal objects on the store as it likes (``journal()`` / ``open()``), standing
  for several processes sharing it;
- reads its tables with plain SQL (``sql()`` and ``rows()``, ``?`` placeholders on both
  backends), and damages rows with ``damage()``;
- compares the store before and after (``snapshot()``: all of it; ``dump()``: every row, also
  while journals are open);
- hands ``where`` to child processes, which open it with
  :func:`tests.durability.crash_child.open_journal` (a file path, ``sqlite-process:`` and a
  path for a journal with a writer process, or ``postgres:`` and a DSN
  whose search_path is the schema).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    JournalError,
    LeaseLost,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    ReplayPolicy,
    StepRecord,
    StopReason,
    ToolRegistry,
)
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import ActionIntent, Lease, ModelRequest, Record, RunSpec, StepWritten
from tests.conftest import Crash, RecordingJournal, call, first_write
from tests.contract.test_resume import World, comparable, new_loop
from tests.durability import pg

REPO = Path(__file__).resolve().parents[2]


class SQLiteStore:
    """A SQLite journal file (and its -wal and -shm files) in a folder of its own."""

    unique_violation = "UNIQUE"  # what the JournalError of a primary-key conflict says
    refusal_hint = "Pass the path"  # what a refusal of a foreign store tells to do instead
    # test_journal_bytes_per_step_do_not_grow_with_the_history: the WAL file grows by what the
    # commits write, nothing else.
    wal_noise: tuple[float, int] = (1.2, 0)
    # The steps (measured from the second one) whose WAL holds a copy of the run's history:
    # SQLite rewrites the runs row when its size changes, as when the counters reach 2.
    history_copies: tuple[int, ...] = (0,)

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def journal(self, **kw: Any) -> SQLiteJournal:
        """A new journal object on the store (``async with`` it); it opens as it is made."""
        return SQLiteJournal(self.path, **kw)

    async def open(self, **kw: Any) -> SQLiteJournal:
        """A new journal object, its tables checked (or created) off the event loop."""
        return await asyncio.to_thread(SQLiteJournal, self.path, **kw)

    def _connect(self) -> contextlib.closing[sqlite3.Connection]:
        return contextlib.closing(sqlite3.connect(self.path, isolation_level=None))

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit); its rows, or [] if it returns none."""
        with self._connect() as conn:
            return conn.execute(query, args).fetchall()

    def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        """The rows of one query as dicts, their keys in column order."""
        with self._connect() as conn:
            cur = conn.execute(query, args)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def damage(self, *statements: str) -> None:
        """Run ``statements`` on one connection, autocommit (and checkpointed when it closes)."""
        with self._connect() as conn:
            for statement in statements:
                conn.execute(statement)

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table, sorted."""
        tables = [r[0] for r in self.sql("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: sorted(self.sql(f'SELECT * FROM "{t}"'), key=repr) for t in tables}

    def snapshot(self) -> dict[str, bytes]:
        """The bytes of every file of the store (none may appear, vanish or change)."""
        return {
            p.name: p.read_bytes()
            for p in sorted(self.path.parent.iterdir())
            if p.name.startswith(self.path.name)
        }

    @contextlib.contextmanager
    def writes_blocked(self) -> Iterator[None]:
        """Another connection holds the file's write lock: every journal write waits."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                conn.execute("COMMIT")

    def wal_position(self) -> int:
        """How many bytes the write-ahead log has received so far."""
        return Path(f"{self.path}-wal").stat().st_size


class SQLiteProcessStore(SQLiteStore):
    """A SQLite journal file whose journal objects commit their appends in a writer process
    (``SQLiteJournal(writer="process")``): the whole contract suite, run against that writer,
    also in the child processes given ``where`` (``sqlite-process:`` and the path)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.where = f"sqlite-process:{path}"

    def journal(self, **kw: Any) -> SQLiteJournal:
        return SQLiteJournal(self.path, **{"writer": "process", **kw})

    async def open(self, **kw: Any) -> SQLiteJournal:
        return await asyncio.to_thread(SQLiteJournal, self.path, **{"writer": "process", **kw})


class PostgresStore(pg.Db):
    """A schema of the test database, dropped after the test."""

    unique_violation = "duplicate key"
    refusal_hint = "Pass schema="
    # The server's WAL position is the cluster's: other sessions (autovacuum, checkpoints) and
    # record headers add a little to each step.
    wal_noise = (1.5, 64_000)
    history_copies: tuple[int, ...] = ()  # a new row version points at the TOASTed history

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.where = f"postgres:{self.schema_dsn}"

    async def open(self, **kw: Any) -> Any:
        """A new journal object, connected and its tables checked (or created)."""
        return await self.journal(**kw).open()

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement in the schema (autocommit), with ``?`` placeholders as SQLite's;
        its rows, or [] if it returns none."""
        return self._execute(_psycopg_style(query, args), args)

    def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        """The rows of one query as dicts, their keys in column order."""
        with self.connect() as conn:
            cur = conn.execute(_psycopg_style(query, args), args or None)
            names = [d.name for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def damage(self, *statements: str) -> None:
        """Run ``statements`` in one transaction."""
        with self.connect() as conn, conn.transaction():
            for statement in statements:
                conn.execute(statement)

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        return self.dump()

    @contextlib.contextmanager
    def writes_blocked(self) -> Iterator[None]:
        """Another session holds the runs table: every journal write waits."""
        conn = self.connect()
        try:
            conn.autocommit = False
            conn.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
            yield
        finally:
            conn.commit()
            conn.close()

    def wal_position(self) -> int:
        return int(self.sql("SELECT pg_current_wal_insert_lsn() - '0/0'")[0][0])


def _psycopg_style(query: str, args: tuple[Any, ...]) -> str:
    """``query`` with SQLite's ``?`` placeholders turned into psycopg's ``%s`` (a literal ``%``
    is doubled, as psycopg wants when there are parameters)."""
    return query.replace("%", "%%").replace("?", "%s") if args else query


Store = SQLiteStore | PostgresStore


# -- runs and records -------------------------------------------------------------------------


def recording(inner: Any, **kw: Any) -> RecordingJournal:
    """conftest's crash wrapper around a durable journal (it only delegates the seam methods;
    its ``records()``-based helpers are MemoryJournal's and are not used here)."""
    return RecordingJournal(inner, **kw)


async def records_of(journal: Any, run_id: str) -> tuple[Record, ...]:
    return tuple((await journal.read(run_id))[1])


async def make_reference() -> tuple[RecordingJournal, Any]:
    """tests/contract/test_resume.py's scenario on a memory journal, every write recorded."""
    journal = RecordingJournal()
    result = await new_loop(World(), journal).run("pay", run_id="r")
    return journal, result


def never_replay_intents(ref: RecordingJournal) -> dict[int, ActionIntent]:
    """The reference run's writes (1-based) that hold the intent of a never-replay action."""
    return {  # an action intent is the last record of its write (after the model result)
        i: batch[-1]
        for i, batch in enumerate(ref.appends, start=1)
        if isinstance(batch[-1], ActionIntent) and batch[-1].replay_policy == ReplayPolicy.never
    }


def check_resumed(n: int, r: Any, ref: Any, unknown: ActionIntent | None) -> bool:
    """``r``, a run resumed after a crash at write ``n``, against the uncrashed ``ref``: it
    ended resume_state_unknown at the never-replay intent ``unknown`` when there is one
    (True), or else it followed ``ref``'s trajectory (False)."""
    if unknown is not None:
        assert r.stop_reason == StopReason.resume_state_unknown, n
        assert r.pending_action is not None
        assert r.pending_action.tool_name == unknown.action.tool_name, n
        k = unknown.step_idx
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]], n
        return True
    assert r.stop_reason == ref.stop_reason, n
    assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
    assert (r.steps_used, r.actions_executed) == (ref.steps_used, ref.actions_executed), n
    return False


async def crashed_run(store: Store) -> None:
    """A run 'r' interrupted before its 'charge' action, its journal closed."""
    ref_journal, _ = await make_reference()
    n = first_write(ref_journal, "action_intent", "charge")
    async with store.journal() as journal:
        with pytest.raises(Crash):
            await new_loop(World(), recording(journal, crash_at=n)).run("pay", run_id="r")


@contextlib.asynccontextmanager
async def two_journals(store: Store, now: list[float]) -> AsyncIterator[tuple[Any, Any]]:
    """Two journal objects on ``store`` whose clock reads ``now[0]``."""
    async with (
        store.journal(clock=lambda: now[0]) as one,
        store.journal(clock=lambda: now[0]) as two,
    ):
        yield one, two


def ended_once_without_gaps(store: Store) -> int:
    """How many runs the store holds; fails unless each has exactly one end record and its
    records are numbered 1 to N without a gap."""
    rows = store.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end'), count(*), max(seq) FROM journal "
        "GROUP BY run_id"
    )
    assert all(ends == 1 and count == top for _, ends, count, top in rows), rows
    return len(rows)


async def damaged_run(store: Store, *statements: str) -> Any:
    """:func:`crashed_run`, then ``statements`` run on the store: its snapshot after them."""
    await crashed_run(store)
    store.damage(*statements)
    return store.snapshot()


def spec(run_id: str = "r") -> RunSpec:
    return RunSpec(run_id, "g", Limits(), 0.0, ({"role": "user", "content": "hi"},), {"k": 1})


def _scenarios() -> dict[str, tuple[Callable[[ModelRequest], Any], Limits]]:
    def final(req: ModelRequest) -> Any:
        return call("noop") if req.step_idx == 0 else ModelReply("the answer")

    def retry_then_final(req: ModelRequest) -> Any:
        if req.attempt == 1:
            raise ModelCallError("slow down", retryable=True, kind="rate_limit")
        return ModelReply("ok")

    def fail(req: ModelRequest) -> Any:
        raise ModelCallError("invalid api key", kind="auth")

    return {
        "agent_finished": (final, Limits()),
        "retried_then_finished": (retry_then_final, Limits()),
        "task_completed": (lambda r: call("done", {"answer": "42"}), Limits()),
        "step_budget": (lambda r: call("noop"), Limits(max_steps=3)),
        "action_budget": (lambda r: call("count", {"n": 2}), Limits(max_actions=2)),
        "env_error": (lambda r: call("broken"), Limits()),
        "llm_error": (fail, Limits()),
        "parse_failed_repeatedly": (lambda r: ModelReply(""), Limits()),
        "not_executed_then_finished": (
            lambda r: call("nope") if r.step_idx == 0 else ModelReply("fin"),
            Limits(),
        ),
    }


SCENARIOS = _scenarios()


async def check_only_the_conflict_failed(
    store: Store, journal: Any, leases: dict[str, Lease], step: StepRecord, outcomes: list[Any]
) -> None:
    """The outcomes of four appends, to runs 'a' to 'd', of which only 'b' (not its lease) and
    'c' (two steps with one step_idx) had to fail: they failed alone and wrote nothing; 'c'
    stays writable."""
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], LeaseLost)
    assert isinstance(outcomes[2], JournalError)
    assert store.unique_violation in str(outcomes[2])
    assert [r.kind for r in await records_of(journal, "a")] == ["model_intent"]
    assert [r.kind for r in await records_of(journal, "d")] == ["model_intent"]
    assert await records_of(journal, "b") == () and await records_of(journal, "c") == ()
    assert store.sql("SELECT count(*) FROM steps") == [(0,)]
    # The failed append left the run writable: its next append lands at seq 1.
    await journal.append(leases["c"], [StepWritten(step)])
    assert store.sql("SELECT seq FROM journal WHERE run_id = 'c'") == [(1,)]


def nul_loop(journal: Any) -> Loop:
    """A loop whose tool returns text with a NUL character, then answers with one."""
    tools = ToolRegistry()

    @tools.tool
    def nul() -> str:
        """Returns text with a NUL."""
        return "a\x00b"

    model = FunctionModel(lambda r: call("nul") if r.step_idx == 0 else ModelReply("fin\x00al"))
    return Loop(model, tools=tools, journal=journal)


# -- processes --------------------------------------------------------------------------------


def no_such_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 7


def run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -c code args`` from the repository, to completion."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO / "src"), str(REPO)))}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, check=False,
    )  # fmt: skip
