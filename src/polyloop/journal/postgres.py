"""The shared journal: PostgreSQL, for many processes on many machines (extra
``polyloop[postgres]``: psycopg 3 and its connection pool, imported lazily — this module imports
without them, and constructing a :class:`PostgresJournal` without them raises a one-line
``ImportError`` naming the extra).

Tables. The same tables, columns and meanings as the SQLite journal (see
:mod:`polyloop.journal.sqlite`): ``runs``, ``steps``, ``journal``, ``model_calls``, ``meta``, so
downstream SQL reads both alike. Types are PostgreSQL's: ``TEXT``, ``INTEGER`` (booleans of
``steps`` are 0/1 as in SQLite, so ``WHERE completed = 1`` works on both), ``DOUBLE PRECISION``
for epoch seconds and milliseconds. One column more in ``runs``: ``version`` (``BIGINT``), the
fencing token described below. PostgreSQL text cannot hold the NUL character: where a step's or
an end's free text (an observation, a raw reply, a stop detail, ...) contains one, its column in
``steps``, ``runs`` or ``model_calls`` holds U+FFFD instead, while the ``journal`` record keeps
the exact text (JSON escapes it) — resume reads only the records. A run id, goal or wording
version with a NUL is refused before anything is written.

Leases and fencing (durability.md "Leases"). Claiming a run is one conditional statement::

    UPDATE runs SET owner = me, lease_expires_at = now + ttl, version = version + 1
    WHERE run_id = ? AND (owner IS NULL OR lease_expires_at <= now OR owner = <dead>)
    RETURNING version

where ``<dead>`` is the current owner only when Python has proved it dead (same host, no process
with its pid and start time). The claimed ``version`` is kept in memory for the lease, and
**every** append is written in a transaction that starts with the fence::

    UPDATE runs SET version = version + 1 WHERE run_id = ? AND owner = me AND version = v

0 rows means another execution owns the run: the transaction is rolled back, nothing is
written, and ``append`` raises ``LeaseLost``. (The transaction — BEGIN, the fence, the rows,
COMMIT — is sent in one round trip, pipelined; the fence turns "0 rows" into an error so that
PostgreSQL skips everything after it.) The heartbeat (``renew``) moves only
``lease_expires_at``, never ``version``. The fence also moves the run's ``steps_used`` and
``actions_executed`` by the append's steps, so they are current after every step (as in
SQLite); the end record's transaction also sets the end columns and clears the owner.
``append`` returns after the COMMIT returned (PostgreSQL's ``synchronous_commit`` decides what
"durable" means; its default flushes every commit).

Requests to end a run (journal schema 1.3: ``runs.request``, ``request_reason``,
``requested_by``, ``requested_at``, as in SQLite) are decided in a transaction that locks the
run row (``SELECT ... FOR UPDATE``), so two requests, or a request and a claim, are decided one
after the other: with a live owner (its lease unexpired on the server's clock, and not provably
dead) only the request columns are written, and the owner's next ``renew`` returns them
(``RETURNING`` them: no query of its own); with none, the same transaction takes the lease,
moves ``version`` and writes the end record, so the run ends exactly once.

Group commit. The appends that only add rows (every step's; not one that ends its run or
retries a model call, which also update rows) queued in one turn of the event loop share one
transaction: one fence for all their runs (``UPDATE runs ... FROM unnest(run_ids, owners,
versions)``, which must match every one of them), one ``INSERT ... SELECT FROM unnest(...)``
per table, one COMMIT: one round trip and one WAL flush for many runs. If that transaction
fails — a lease fenced out, a duplicate key, a lost connection — it is rolled back and each
append runs again in a transaction of its own, so only the culprit fails. An append of a run
waits for the previous one of its lease, and every append returns only after the COMMIT that
holds it.

Time. Lease expiry is decided on one clock, the database server's (``statement_timestamp()``),
so workers whose clocks disagree still agree on whose lease has expired. The :class:`Lease`
handed back carries an expiry on the local clock, measured from before the request was sent
(never later than the stored one). ``journal.written_at`` is the writer's clock. An injected
``clock`` replaces both (tests).

Bytes per step. A step's appends insert its ``journal``, ``steps`` and ``model_calls`` rows and
write a new version of its ``runs`` row (the version bump; PostgreSQL writes a new row version
on every update). The bulky columns (goal, history) are TOASTed past about 2 kB, and the new
row version points at the stored value instead of copying it: the history is never rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

from ..types import (
    STEP_SCHEMA_VERSION,
    ActionIntent,
    ApprovalDecided,
    ApprovalRequested,
    ConfigError,
    EndRequest,
    JournalError,
    Lease,
    LeaseLost,
    PolyLoopError,
    Record,
    RequestResult,
    RunEnd,
    RunExists,
    RunLeased,
    RunNotFound,
    RunSpec,
    StepRecord,
    canonical_json,
    check_number,
    import_extra,
    record_from_dict,
    record_json,
)
from . import _approvals, _observations, _sqlite_schema, sqlite
from ._owner import new_owner, owner_is_dead
from ._reading import STEP_USAGE_FIELDS, list_runs_sql, listed_row, step_usage_query
from ._request_rows import request_answer, request_row, stored_request
from ._sqlite_read import _parse_run
from ._sqlite_schema import (
    _INSERT_INTENT,
    _INSERT_JOURNAL,
    _INSERT_STEP,
    _MARK_UNCERTAIN,
    _STEP_COLUMNS,
    _UPSERT_CALL,
    _check_tables,
    _steps_from_rows,
)
from ._sqlite_writer import _wait_uninterrupted
from ._versions import _ADDED_COLUMNS, JOURNAL_SCHEMA_VERSION, _check_meta, _level, _needs_migration
from .sqlite import _Append, _prepare, end_totals

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from ..seams import Journal

    _Conn = AsyncConnection[tuple[Any, ...]]

__all__ = ["PostgresJournal"]

log = logging.getLogger("polyloop")

_INSTALL_HINT: Final = (
    "the PostgreSQL journal needs psycopg and psycopg-pool: pip install 'polyloop[postgres]'"
)
_T = TypeVar("_T")


def _sdk() -> tuple[ModuleType, ModuleType]:
    """``psycopg`` and ``psycopg_pool``, imported on first use (layout.md rule 6)."""
    return import_extra("psycopg", _INSTALL_HINT), import_extra("psycopg_pool", _INSTALL_HINT)


# -- the schema -------------------------------------------------------------------------------


def _pg_decl(decl: str) -> str:
    return decl.replace("REAL", "DOUBLE PRECISION")


_TABLE_COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "meta": (("key", "TEXT PRIMARY KEY"), ("value", "TEXT NOT NULL")),
    "runs": (
        ("run_id", "TEXT PRIMARY KEY"),
        ("owner", "TEXT"),
        ("lease_expires_at", "DOUBLE PRECISION"),
        ("version", "BIGINT NOT NULL DEFAULT 0"),
        ("status", f"TEXT NOT NULL {_sqlite_schema._NEW_STATUS_CHECK}"),
        ("stop_reason", "TEXT"),
        ("steps_used", "INTEGER NOT NULL DEFAULT 0"),
        ("actions_executed", "INTEGER NOT NULL DEFAULT 0"),
        ("tokens_used", "INTEGER"),  # journal schema 1.3, as the three below
        ("cost_usd", "DOUBLE PRECISION"),
        ("active_seconds", "DOUBLE PRECISION"),
        ("usage_missing", "INTEGER"),
        ("created_at", "DOUBLE PRECISION NOT NULL"),
        ("ended_at", "DOUBLE PRECISION"),
        ("journal_schema_version", "TEXT NOT NULL"),
        ("wording_version", "TEXT NOT NULL"),
        ("stop_detail", "TEXT"),
        ("final_answer", "TEXT"),
        ("request", "TEXT CHECK (request IN ('stop', 'cancel'))"),  # journal schema 1.3,
        ("request_reason", "TEXT"),  # as the two below
        ("requested_by", "TEXT"),
        ("requested_at", "DOUBLE PRECISION"),
        ("goal", "TEXT NOT NULL"),
        ("limits_json", "TEXT NOT NULL"),
        ("metadata_json", "TEXT"),
        ("history_json", "TEXT NOT NULL"),
    ),
    # One column per StepRecord field, the SQLite journal's list (kernel.md §7).
    "steps": (("run_id", "TEXT NOT NULL"), *((n, _pg_decl(d)) for n, d in _STEP_COLUMNS)),
    "journal": (
        ("run_id", "TEXT NOT NULL"),
        ("seq", "INTEGER NOT NULL"),
        ("kind", "TEXT NOT NULL"),
        ("body", "TEXT NOT NULL"),
        ("written_at", "DOUBLE PRECISION NOT NULL"),
    ),
    "model_calls": (
        ("run_id", "TEXT NOT NULL"),
        ("step_idx", "INTEGER NOT NULL"),
        ("intent_id", "TEXT NOT NULL"),
        ("attempt", "INTEGER NOT NULL"),
        ("llm_call_id", "TEXT"),
        (
            "state",
            "TEXT NOT NULL CHECK (state IN ('pending', 'ok', 'failed', 'retried', 'uncertain'))",
        ),
        ("input_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("latency_ms", "DOUBLE PRECISION"),
        ("error", "TEXT"),
        ("model", "TEXT"),  # journal schema 1.2, as the four below
        ("response_model", "TEXT"),
        ("cached_tokens", "INTEGER"),
        ("reasoning_tokens", "INTEGER"),
        ("cost_usd", "DOUBLE PRECISION"),  # journal schema 1.3
    ),
}
_TABLE_TAIL: Final = {
    "meta": "",
    # Room on each page for the version bumps to be HOT updates (no index touched).
    "runs": " WITH (fillfactor = 80)",
    "steps": ",\n    PRIMARY KEY (run_id, step_idx)",
    "journal": ",\n    PRIMARY KEY (run_id, seq)",
    "model_calls": ",\n    PRIMARY KEY (intent_id, attempt)",
}


def _create_table(name: str) -> str:
    cols = ",\n".join(f"    {col} {decl}" for col, decl in _TABLE_COLUMNS[name])
    tail = _TABLE_TAIL[name]
    if tail.startswith(","):
        return f"CREATE TABLE {name} (\n{cols}{tail}\n)"
    return f"CREATE TABLE {name} (\n{cols}\n){tail}"


_DDL: Final[tuple[str, ...]] = (
    *(_create_table(name) for name in _TABLE_COLUMNS),
    "CREATE INDEX runs_by_status ON runs (status, lease_expires_at)",
    "CREATE INDEX model_calls_by_run ON model_calls (run_id, step_idx)",
)
_TABLES: Final = frozenset(_TABLE_COLUMNS)


def _pg(query: str) -> str:
    """A SQLite journal statement with PostgreSQL placeholders (one text for both backends)."""
    return query.replace("?", "%s")


_PG_INSERT_JOURNAL = _pg(_INSERT_JOURNAL)
_PG_INSERT_STEP = _pg(_INSERT_STEP)
_PG_MARK_UNCERTAIN = _pg(_MARK_UNCERTAIN)
_PG_INSERT_INTENT = _pg(_INSERT_INTENT)
_PG_UPSERT_CALL = _pg(_UPSERT_CALL)


# Epoch seconds now: the injected clock's when one is passed, else the server's.
_NOW = (
    "coalesce(%(now)s::double precision, "
    "extract(epoch from statement_timestamp())::double precision)"
)
_INSERT_RUN = f"""INSERT INTO runs (run_id, owner, lease_expires_at, version, status, created_at,
    journal_schema_version, wording_version, goal, limits_json, metadata_json, history_json)
    VALUES (%(run_id)s, %(owner)s, {_NOW} + %(ttl)s, 1, 'running', %(created_at)s,
    %(journal_version)s, %(wording)s, %(goal)s, %(limits)s, %(metadata)s, %(history)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING version"""
# Claiming also counts the run's counters again from ``steps`` (a journal written before they
# were kept current per step left them at 0 until the end).
_CLAIM = f"""UPDATE runs SET owner = %(owner)s, lease_expires_at = {_NOW} + %(ttl)s,
        version = version + 1,
        steps_used = (SELECT count(*) FROM steps s WHERE s.run_id = runs.run_id),
        actions_executed = (SELECT count(*) FROM steps s WHERE s.run_id = runs.run_id
            AND s.action_status = 'executed')
    WHERE run_id = %(run_id)s AND (owner IS NULL OR lease_expires_at IS NULL
        OR lease_expires_at <= {_NOW} OR owner = %(dead)s::text)
    RETURNING version, request, request_reason, requested_by, requested_at"""
# The fence. 0 rows (another execution owns the run) must stop the whole transaction, which is
# sent in one round trip with the rows it guards: dividing by the row count raises
# division_by_zero, PostgreSQL aborts the transaction and skips every statement after it. The
# same update moves the run's counters by the append's steps (the end record then sets them).
_FENCE = """WITH fenced AS (
        UPDATE runs SET version = version + 1, steps_used = steps_used + %(steps)s,
            actions_executed = actions_executed + %(executed)s
        WHERE run_id = %(run_id)s AND owner = %(owner)s AND version = %(version)s
        RETURNING 1)
    SELECT 1 / (SELECT count(*) FROM fenced)::integer"""
# The fence of a batch of appends (group commit): one statement for all their runs. Fewer rows
# than appends (one of them fenced out) raises division_by_zero: the batch rolls back and each
# append runs again alone, so that only the fenced-out one fails.
_FENCE_MANY = """WITH fenced AS (
        UPDATE runs SET version = runs.version + 1, steps_used = runs.steps_used + f.steps,
            actions_executed = runs.actions_executed + f.executed
        FROM unnest(%(run_ids)s::text[], %(owners)s::text[], %(versions)s::bigint[],
                %(steps)s::integer[], %(executed)s::integer[])
            AS f(run_id, owner, version, steps, executed)
        WHERE runs.run_id = f.run_id AND runs.owner = f.owner AND runs.version = f.version
        RETURNING 1)
    SELECT 1 / ((SELECT count(*) FROM fenced) = %(n)s)::integer"""


def _insert_many(table: str, columns: Sequence[tuple[str, str]], tail: str = "") -> str:
    """One ``INSERT`` of any number of rows: a parameter per column, each an array of that
    column's values (``unnest``), so the text is the same for every batch size."""
    types = [re.match(r"DOUBLE PRECISION|\w+", decl).group() for _, decl in columns]  # type: ignore[union-attr]
    arrays = ", ".join(f"%s::{t}[]" for t in types)
    names = ", ".join(name for name, _ in columns)
    return f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}){tail}"


_MANY_JOURNAL = _insert_many("journal", _TABLE_COLUMNS["journal"])
_MANY_STEPS = _insert_many("steps", _TABLE_COLUMNS["steps"])
_MANY_INTENTS = (
    "INSERT INTO model_calls (run_id, step_idx, intent_id, attempt, model, state) "
    "SELECT *, 'pending' FROM unnest(%s::text[], %s::integer[], %s::text[], %s::integer[], "
    "%s::text[])"
)
# The columns of an attempt's outcome (``call_row``): every column but ``model``, which its
# intent wrote.
_CALL_COLUMNS: Final = tuple(
    (n, "TEXT" if n == "state" else d) for n, d in _TABLE_COLUMNS["model_calls"] if n != "model"
)
_MANY_CALLS = _insert_many(
    "model_calls",
    _CALL_COLUMNS,
    """
    ON CONFLICT (intent_id, attempt) DO UPDATE SET llm_call_id = excluded.llm_call_id,
        state = excluded.state, input_tokens = excluded.input_tokens,
        output_tokens = excluded.output_tokens, latency_ms = excluded.latency_ms,
        error = excluded.error, response_model = excluded.response_model,
        cached_tokens = excluded.cached_tokens, reasoning_tokens = excluded.reasoning_tokens,
        cost_usd = excluded.cost_usd""",
)
_RENEW = f"""UPDATE runs SET lease_expires_at = {_NOW} + %(ttl)s
    WHERE run_id = %(run_id)s AND owner = %(owner)s
    RETURNING request, request_reason, requested_by, requested_at"""
# A request to end a run (journal schema 1.3): the row locked while the request is decided (two
# requests, a claim and an append of the run wait for each other), with the server's clock.
_REQUEST_STATE = f"""SELECT status, owner, lease_expires_at, stop_reason, stop_detail, request,
        request_reason, requested_by, requested_at, {_NOW}
    FROM runs WHERE run_id = %(run_id)s FOR UPDATE"""
_WRITE_REQUEST = _pg(_sqlite_schema._WRITE_REQUEST)
_LAST_SEQ = _pg(_sqlite_schema._LAST_SEQ)
# Ending a run nobody holds: the lease is taken for the transaction (the end record releases
# it) and the version moves, so a stale owner's next append is fenced out.
_TAKE_TO_END = """UPDATE runs SET owner = %s, lease_expires_at = NULL, version = version + 1
    WHERE run_id = %s"""
_RELEASE = _pg(_sqlite_schema._RELEASE)
# A person's decision (journal schema 1.4): the run row locked while it is decided.
_APPROVAL_STATE = "SELECT status FROM runs WHERE run_id = %s FOR UPDATE"
_APPROVAL_RECORDS = _pg(_sqlite_schema._APPROVAL_RECORDS)
_PENDING_APPROVALS = _sqlite_schema._PENDING_APPROVALS
_LEASE_OF = _pg(_sqlite_schema._LEASE_OF)
_END_PENDING = _pg(_sqlite_schema._END_PENDING)
_END_RUN = _pg(_sqlite_schema._END_RUN)
_READ_RUN = _pg(_sqlite_schema._READ_RUN)
_READ_RECORDS = _pg(_sqlite_schema._READ_RECORDS)
_READ_LARGE = _pg(_observations.READ_LARGE)
# (A running run at 0 steps may come from a journal written before the counters were kept
# current per step: counted from ``steps``.)
# By name, not ``SELECT *`` as SQLite reads them: a PostgreSQL journal is migrated when it is
# opened, so it has every column; and a prepared ``SELECT *`` fails ("cached plan must not change
# result type") once a newer minor adds a column while this journal is open.
_READ_STEPS = f"""SELECT {", ".join(name for name, _ in _STEP_COLUMNS)} FROM steps
    WHERE run_id = %s ORDER BY step_idx"""


# -- helpers ----------------------------------------------------------------------------------


def _no_nul(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: U+FFFD stands in for it in the projection columns."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def _clean(row: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_no_nul(v) for v in row)


def _describe(dsn: str, conninfo: Mapping[str, Any]) -> str:
    """The DSN without its password, for messages."""
    if not conninfo:
        return "(default connection)" if not dsn else "(DSN)"
    user = conninfo.get("user")
    host = conninfo.get("host") or conninfo.get("hostaddr") or "localhost"
    port = conninfo.get("port")
    where = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"
    return f"postgresql://{where}/{conninfo.get('dbname') or ''}"


def _lock_key(name: str) -> int:
    """A 64-bit advisory lock key for creating the schema or tables named ``name``."""
    digest = hashlib.sha256(f"polyloop-journal:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# -- the journal ------------------------------------------------------------------------------


class PostgresJournal:
    """The Journal seam in PostgreSQL (durability.md "Storage"): the SQLite journal's tables and
    semantics, shared by any number of processes and machines, with leases claimed by a
    conditional update and every write fenced by the run row's ``version``.

    Args:
        dsn: a libpq connection string or URI (``postgresql://user@host:5432/db``).
        min_size: connections the pool keeps open.
        max_size: the most connections the pool opens; concurrent runs beyond it wait.
        schema: the PostgreSQL schema holding the tables (created if missing; its
            ``search_path`` is set on every connection). None: the connection's current schema
            (usually ``public``). One schema per journal keeps test runs or tenants apart.
        timeout_s: how long a call waits for a free connection (and for the first connection)
            before failing with ``JournalError``.
        clock: epoch seconds for lease expiry (instead of the database server's clock) and
            ``written_at`` (instead of the local clock); for tests: every process sharing the
            tables must then use the same one.

    Opening connects, then checks what the schema holds: nothing (the PolyLoop tables are
    created), a PolyLoop journal of a readable version (it is used), or anything else — other
    tables and no PolyLoop ``meta``, a ``meta`` without a version, an unknown major version,
    missing tables or columns — which raises ``JournalError`` without modifying anything. It
    happens on first use, or explicitly with ``await journal.open()`` / ``async with``. Use one
    journal object from one event loop. Close it with :meth:`aclose` (or ``async with``).

    Raises:
        ConfigError: a bad pool size, ``schema`` or ``timeout_s``, or a DSN that cannot be
            parsed.
        ImportError: psycopg is not installed (``pip install 'polyloop[postgres]'``).
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        schema: str | None = None,
        timeout_s: float = 30.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if min_size < 0 or max_size < 1 or max_size < min_size:
            raise ConfigError(
                f"need 0 <= min_size <= max_size and max_size >= 1, got min_size={min_size}, "
                f"max_size={max_size}"
            )
        if schema is not None and (not schema or "\x00" in schema):
            raise ConfigError(f"schema must be a non-empty name or None, got {schema!r}")
        check_number("PostgresJournal timeout_s", timeout_s, above=True, unit=" of seconds")
        psycopg, pool = _sdk()
        self._psycopg = psycopg
        self._pool_mod = pool
        self._error: type[Exception] = psycopg.Error
        self._fenced_out: type[Exception] = psycopg.errors.DivisionByZero
        self._idle: object = psycopg.pq.TransactionStatus.IDLE
        try:
            conninfo: dict[str, Any] = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise ConfigError(f"not a valid PostgreSQL DSN: {exc}") from None
        self.dsn = dsn
        self.schema = schema
        self._server = _describe(dsn, conninfo)
        self.where = self._server + (f" (schema {schema})" if schema else "")
        self._min_size, self._max_size = min_size, max_size
        self._timeout = timeout_s
        self._clock = clock
        self._pool: AsyncConnectionPool[_Conn] | None = None
        self._open_lock: asyncio.Lock | None = None
        self._closed = False
        # Per lease (run_id, owner): [the run row's version, the next seq]. The fence.
        self._held: dict[tuple[str, str], list[int]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        # Group commit (see _append_grouped): the appends queued in this turn of the event loop.
        # The answer: True once written, False to write alone (the only one), or the error.
        self._queue: list[tuple[_Append, asyncio.Future[bool]]] = []
        self._flush_due = False
        self._flushes: set[asyncio.Future[None]] = set()

    def __repr__(self) -> str:
        return f"PostgresJournal({self.where!r})"

    # -- lifecycle ----------------------------------------------------------------------------
    async def open(self) -> Self:
        """Connect and check (or create) the schema. Idempotent; every method calls it.

        Raises:
            JournalError: the server cannot be reached, or the schema is not a PolyLoop
                journal this version can read (nothing was modified).
        """
        if self._pool is not None:
            return self
        if self._closed:
            raise JournalError(f"the PostgreSQL journal {self.where} is closed")
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._pool is not None:
                return self
            if self._closed:
                raise JournalError(f"the PostgreSQL journal {self.where} is closed")
            try:
                conn = await self._psycopg.AsyncConnection.connect(
                    self.dsn, autocommit=True, connect_timeout=max(2, round(self._timeout))
                )
            except self._error as exc:
                raise JournalError(
                    f"cannot connect to the PostgreSQL journal {self.where}: {exc}"
                ) from None
            try:
                await self._check_schema(conn)
            except self._error as exc:
                raise JournalError(
                    f"the PostgreSQL journal {self.where}: checking its tables failed: "
                    f"{type(exc).__name__}: {exc} (nothing was modified)"
                ) from exc
            finally:
                await conn.close()
            pool: AsyncConnectionPool[_Conn] = self._pool_mod.AsyncConnectionPool(
                self.dsn,
                min_size=self._min_size,
                max_size=self._max_size,
                kwargs={"autocommit": True},
                configure=self._configure,
                timeout=self._timeout,
                open=False,
                name=f"polyloop-journal:{self.where}",
            )
            try:
                await pool.open(wait=self._min_size > 0, timeout=self._timeout)
            except self._error as exc:
                await pool.close()
                raise JournalError(
                    f"cannot connect to the PostgreSQL journal {self.where}: {exc}"
                ) from None
            self._pool = pool
        return self

    async def aclose(self) -> None:
        """Finish the appends already queued, then close the pool's connections. Idempotent;
        later calls raise ``JournalError``."""
        self._closed = True
        if self._flush_due:
            self._flush_queue()
        while self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the seam -----------------------------------------------------------------------------
    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease:
        run_id = spec.run_id
        texts = {"run id": run_id, "goal": spec.goal, "wording version": spec.wording_version}
        for what, text in texts.items():
            if "\x00" in text:
                raise ValueError(
                    f"run {run_id!r}: the {what} contains a NUL character, which PostgreSQL "
                    "text cannot hold; nothing was written"
                )
        params: dict[str, Any] = {
            "run_id": run_id,
            "owner": new_owner(),
            "ttl": float(ttl_s),
            "created_at": spec.created_at,
            "journal_version": JOURNAL_SCHEMA_VERSION,
            "wording": spec.wording_version,
            "goal": spec.goal,
            "limits": canonical_json(spec.limits.to_dict()),
            "metadata": None
            if spec.metadata is None
            else sqlite._dumps(dict(spec.metadata), "metadata", run_id, "PostgreSQL"),
            "history": sqlite._dumps(list(spec.history), "history", run_id, "PostgreSQL"),
        }

        async def run() -> Lease:
            local, params["now"] = self._now()
            async with self._connection() as conn:
                cur = await conn.execute(_INSERT_RUN, params)
                row = await cur.fetchone()
            if row is None:
                raise RunExists(run_id)
            owner = str(params["owner"])
            self._held[(run_id, owner)] = [int(row[0]), 1]
            return Lease(run_id, owner, local + ttl_s)

        return await self._guarded(run(), give_back=True)

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]:
        async with self._connection() as conn:
            # One round trip. The runs columns never change after create; the records are one
            # snapshot; the steps rows their results name were written with them, never changed.
            async with conn.pipeline():
                run_cur = await conn.execute(_READ_RUN, (run_id,))
                rec_cur = await conn.execute(_READ_RECORDS, (run_id,))
                big = await conn.execute(_READ_LARGE, (run_id, _observations.SHARED_ABOVE))
            row, rows = await run_cur.fetchone(), await rec_cur.fetchall()
            large = dict(await big.fetchall())
        if row is None:
            raise RunNotFound(run_id)
        return _parse_run(run_id, row, rows, large)

    async def acquire(
        self, run_id: str, *, ttl_s: float
    ) -> tuple[Lease, RunSpec, Sequence[Record]]:
        owner = new_owner()
        lease = await self._guarded(self._claim(run_id, owner, ttl_s), give_back=True)
        try:
            spec, records = await self.read(run_id)  # nobody else can write it now
        except BaseException:
            await self._give_back(lease)
            raise
        held = self._held.get((run_id, owner))
        if held is not None:
            held[1] = len(records) + 1  # read() checked that seq runs 1..len
        return lease, spec, records

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        p = _prepare(lease, records)
        if (
            p.end is not None
            or p.status is not None
            or any(op == "intent" and args[3] > 1 for op, args in p.calls)
        ):
            # It also updates rows (the run's, its pending calls'): its own transaction.
            await self._guarded(self._append(p))
        else:
            await self._guarded(self._append_grouped(p))

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        async def run() -> Lease:
            local, now = self._now()
            params: dict[str, Any] = {
                "run_id": lease.run_id,
                "owner": lease.owner,
                "ttl": float(ttl_s),
                "now": now,
            }
            async with self._connection() as conn:
                cur = await conn.execute(_RENEW, params)
                row = await cur.fetchone()
                if row is None:
                    raise await self._lease_lost(conn, lease)
            # The request stored for the run, if any: how its owner learns of one.
            return Lease(lease.run_id, lease.owner, local + ttl_s, stored_request(*row))

        return await self._guarded(run())

    async def request_end(
        self,
        run_id: str,
        request: EndRequest,
        *,
        seen: int,
        end: Callable[[EndRequest], RunEnd],
    ) -> RequestResult | None:
        """The ``EndRequests`` seam (:class:`polyloop.seams.EndRequests`), as
        :meth:`SQLiteJournal.request_end` does it: one transaction holding the run row's lock
        (``SELECT ... FOR UPDATE``; liveness on the server's clock); ending the run moves its
        ``version``, so a stale owner's next append is fenced out. Raises ``RunNotFound``."""

        async def run() -> RequestResult | None:
            written_at = self._clock() if self._clock is not None else time.time()
            params = {"run_id": run_id, "now": self._now()[1]}
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(_REQUEST_STATE, params)
                row = await cur.fetchone()
                if row is None:
                    raise RunNotFound(run_id)
                answer, in_force, writes = request_answer(run_id, request, row[:-1], float(row[-1]))
                if answer is None:
                    cur = await conn.execute(_LAST_SEQ, (run_id,))
                    last = await cur.fetchone()
                    if last is None or last[0] != seen:
                        return None  # written since the caller read it: read it again
                if writes:
                    values = _clean(request_row(request))
                    await conn.execute(_WRITE_REQUEST, (*values, run_id))
                if answer is not None or in_force is None:
                    return answer
                record = end(in_force)
                p = _prepare(Lease(run_id, new_owner(), 0.0), (record,))
                await conn.execute(_TAKE_TO_END, (p.lease.owner, run_id))
                await self._write_rows(conn, p, seen + 1, written_at)
            return RequestResult(run_id, "ended", in_force, record.stop_reason, record.stop_detail)

        return await self._guarded(run())

    async def decide(self, run_id: str, decision: ApprovalDecided) -> ApprovalDecided:
        """The ``Approvals`` seam (:class:`polyloop.seams.Approvals`), as
        :meth:`SQLiteJournal.decide` does it, in one transaction holding the run row's lock
        (``SELECT ... FOR UPDATE``): two deciders racing wait for each other, and exactly one
        decision is written."""

        async def run() -> ApprovalDecided:
            written_at = self._clock() if self._clock is not None else time.time()
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(_APPROVAL_STATE, (run_id,))
                row = await cur.fetchone()
                if row is None:
                    raise RunNotFound(run_id)
                cur = await conn.execute(_APPROVAL_RECORDS, (run_id,))
                approvals = [record_from_dict(json.loads(b)) for (b,) in await cur.fetchall()]
                standing = _approvals.answer(run_id, decision, approvals, ended=row[0] == "ended")
                if standing is not None:
                    return standing
                written = _approvals.to_write(decision, approvals)
                cur = await conn.execute(_LAST_SEQ, (run_id,))
                last = await cur.fetchone()
                nxt = (last[0] if last is not None and last[0] is not None else 0) + 1
                await conn.execute(
                    _PG_INSERT_JOURNAL,
                    (run_id, nxt, written.kind, _no_nul(record_json(written)), written_at),
                )
                await conn.execute(
                    "UPDATE runs SET status = 'running' WHERE run_id = %s", (run_id,)
                )
            return written

        return await self._guarded(run())

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """The ``Approvals`` seam: the actions awaiting a decision, oldest request first."""
        async with self._connection() as conn:
            cur = await conn.execute(_PENDING_APPROVALS)
            rows = await cur.fetchall()
        out = []
        for run_id, requested, intent in rows:
            a, i = record_from_dict(json.loads(requested)), record_from_dict(json.loads(intent))
            assert isinstance(a, ApprovalRequested) and isinstance(i, ActionIntent)
            out.append(_approvals.pending_row(run_id, a, i))
        return sorted(out, key=lambda row: row["requested_at"])

    async def release(self, lease: Lease) -> None:
        await self._guarded(self._release(lease))

    # -- read-only helpers (never write; for the CLI and tests) -------------------------------
    async def list_runs(
        self, *, status: str | None = None, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every run (or those with ``status`` 'running'/'ended'; or only ``run_id``: a list
        of one or none, read by its key), oldest first, as dicts of the ``runs`` columns
        except ``history_json`` and ``version``, with ``metadata`` and ``limits`` decoded: the
        same shape as :meth:`SQLiteJournal.list_runs`, ``state`` included (derived on this
        machine's clock). ``steps_used``/``actions_executed`` are current after every step.
        Read-only."""
        requests = "request, request_reason, requested_by, requested_at"
        query, params = list_runs_sql(status, run_id, requests=requests, collate=' COLLATE "C"')
        async with self._connection() as conn:
            cur = await conn.execute(_pg(query), params)
            names = [d.name for d in cur.description or ()]
            rows = await cur.fetchall()
        now = self._now()[0]
        return [listed_row(names, row, now) for row in rows]

    async def step_usage(self, run_id: str) -> dict[int, dict[str, Any]]:
        """What each step of the run spent, as :meth:`SQLiteJournal.step_usage` gives it (one
        aggregate query). Read-only. Raises ``RunNotFound``."""
        async with self._connection() as conn:
            async with conn.pipeline():
                run_cur = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
                cur = await conn.execute(_pg(step_usage_query()), (run_id,))
            found = await run_cur.fetchone()
            rows = await cur.fetchall()
        if found is None:
            raise RunNotFound(run_id)
        return {row[0]: dict(zip(STEP_USAGE_FIELDS, row[1:], strict=True)) for row in rows}

    async def steps(self, run_id: str) -> list[StepRecord]:
        """A run's step records from the ``steps`` table, by ``step_idx``. Read-only.
        Raises ``RunNotFound``."""
        async with self._connection() as conn:
            async with conn.pipeline():
                run_cur = await conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
                steps_cur = await conn.execute(_READ_STEPS, (run_id,))
            found = await run_cur.fetchone()
            rows = await steps_cur.fetchall()
            names = [d.name for d in steps_cur.description or ()]
        if found is None:
            raise RunNotFound(run_id)
        try:
            return _steps_from_rows(names, rows)
        except TypeError as exc:
            raise JournalError(f"run {run_id!r}: a steps row is damaged ({exc})") from exc

    # -- leases -------------------------------------------------------------------------------
    def _now(self) -> tuple[float, float | None]:
        """(the local clock now, the ``now`` parameter: None for the server's clock)."""
        if self._clock is not None:
            t = self._clock()
            return t, t
        return time.time(), None

    async def _claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        dead: str | None = None
        async with self._connection() as conn:
            for _ in range(2):
                local, now = self._now()
                params: dict[str, Any] = {
                    "run_id": run_id,
                    "owner": owner,
                    "ttl": float(ttl_s),
                    "now": now,
                    "dead": dead,
                }
                cur = await conn.execute(_CLAIM, params)
                row = await cur.fetchone()
                if row is not None:
                    self._held[(run_id, owner)] = [int(row[0]), 0]  # seq: set after the read
                    return Lease(run_id, owner, local + ttl_s, stored_request(*row[1:]))
                cur = await conn.execute(_LEASE_OF, (run_id,))
                current = await cur.fetchone()
                if current is None:
                    raise RunNotFound(run_id)
                holder, expiry = current[0], current[1]
                # Leased and live; take it only from an owner proved dead, and only once.
                if dead is None and holder is not None and owner_is_dead(holder):
                    dead = str(holder)
                    continue
                raise RunLeased(run_id, str(holder), float(expiry or 0.0))
        raise AssertionError("unreachable")  # pragma: no cover

    async def _release(self, lease: Lease) -> None:
        key = (lease.run_id, lease.owner)
        async with self._connection() as conn:
            await conn.execute(_RELEASE, key)
        self._held.pop(key, None)
        self._locks.pop(key, None)

    async def _give_back(self, lease: Lease) -> None:
        try:
            await self._guarded(self._release(lease))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("run %s: could not release its lease", lease.run_id, exc_info=True)

    async def _lease_lost(self, conn: _Conn, lease: Lease, *, known: bool = True) -> PolyLoopError:
        cur = await conn.execute(_LEASE_OF, (lease.run_id,))
        row = await cur.fetchone()
        self._held.pop((lease.run_id, lease.owner), None)
        if row is None:
            return RunNotFound(lease.run_id)
        holder = row[0]
        if holder == lease.owner and not known:
            held = (
                "it is recorded as the owner, but the lease was not taken through this journal "
                "object, which alone knows its fencing version"
            )
        elif holder == lease.owner:
            held = "it is recorded as the owner, but the run's version moved on without it"
        else:
            held = f"held by {holder or 'nobody'}"
        return LeaseLost(
            f"run {lease.run_id!r}: this execution ({lease.owner}) no longer holds the lease "
            f"({held}); stop without writing"
        )

    # -- writing ------------------------------------------------------------------------------
    def _lock(self, key: tuple[str, str]) -> asyncio.Lock:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    async def _append(self, p: _Append) -> None:
        async with self._lock((p.lease.run_id, p.lease.owner)):  # one append of a lease at a time
            await self._append_alone(p)

    async def _append_alone(self, p: _Append) -> None:
        """One append in its own transaction (the caller holds the lease's lock)."""
        lease = p.lease
        run_id, owner = lease.run_id, lease.owner
        key = (run_id, owner)
        async with self._connection() as conn:
            held = self._held.get(key)
            if held is None:  # not taken through this object, or given up, ended or lost
                raise await self._lease_lost(conn, lease, known=False)
            version, nxt = held
            written_at = self._clock() if self._clock is not None else time.time()
            fence = {
                "run_id": run_id,
                "owner": owner,
                "version": version,
                "steps": len(p.steps),
                "executed": p.executed,
            }
            try:
                async with conn.pipeline():  # one round trip; the transaction is all or nothing
                    await conn.execute("BEGIN")
                    await conn.execute(_FENCE, fence)
                    await self._write_rows(conn, p, nxt, written_at)
                    await conn.execute("COMMIT")
            except self._fenced_out:
                await conn.execute("ROLLBACK")
                raise await self._lease_lost(conn, lease) from None
            except BaseException:
                await self._roll_back(conn)
                raise
        if p.end is None:
            held[0], held[1] = version + 1, nxt + len(p.rows)
        else:  # the end record released the lease in its transaction
            self._held.pop(key, None)
            self._locks.pop(key, None)

    async def _roll_back(self, conn: _Conn) -> None:
        if conn.info.transaction_status != self._idle:
            with contextlib.suppress(self._error):
                await conn.execute("ROLLBACK")

    # Group commit: the appends that only add rows (every step's, none that ends a run) queued
    # in one turn of the event loop share one transaction: one fence statement for all their
    # runs, one INSERT per table, one COMMIT (one WAL flush), one round trip. If it fails (a
    # fenced-out lease, a duplicate key, a lost connection), it is rolled back and each append
    # runs again in a transaction of its own, so only the culprit fails. Each append returns
    # after the COMMIT that holds it.
    async def _append_grouped(self, p: _Append) -> None:
        key = (p.lease.run_id, p.lease.owner)
        async with self._lock(key):  # held until answered: one queued append per lease
            if key not in self._held or self._closed:
                await self._append_alone(p)  # raises LeaseLost or "closed", as alone
                return
            loop = asyncio.get_running_loop()
            answer: asyncio.Future[bool] = loop.create_future()
            self._queue.append((p, answer))
            if not self._flush_due:
                self._flush_due = True
                loop.call_soon(self._flush_queue)
            if not await answer:  # the only append of its turn: no batch to share
                await self._append_alone(p)

    def _flush_queue(self) -> None:
        self._flush_due = False
        batch, self._queue = self._queue, []
        if len(batch) == 1 and not self._closed:
            batch[0][1].set_result(False)  # its caller writes it alone, at once
            return
        if not batch:  # aclose flushed it already
            return
        task = asyncio.ensure_future(self._flush(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, batch: list[tuple[_Append, asyncio.Future[bool]]]) -> None:
        try:
            if len(batch) > 1:
                try:
                    await self._append_many([p for p, _ in batch])
                except Exception:
                    log.debug("PostgreSQL journal %s: a batch failed; each alone", self.where)
                else:
                    for _, answer in batch:
                        if not answer.done():
                            answer.set_result(True)
                    return
            for p, answer in batch:
                try:
                    await self._append_alone(p)
                except Exception as exc:
                    if not answer.done():
                        answer.set_exception(exc)
                else:
                    if not answer.done():
                        answer.set_result(True)
        finally:  # cancelled (the event loop is closing): nobody is left without an answer
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(
                        JournalError(f"the PostgreSQL journal {self.where}: write abandoned")
                    )

    async def _append_many(self, ps: list[_Append]) -> None:
        """``ps`` (one per lease, none ending its run) in one transaction, or none of them."""
        written_at = self._clock() if self._clock is not None else time.time()
        held = [self._held[(p.lease.run_id, p.lease.owner)] for p in ps]
        fence: dict[str, Any] = {
            "run_ids": [],
            "owners": [],
            "versions": [],
            "steps": [],
            "executed": [],
            "n": len(ps),
        }
        journal: list[list[Any]] = [[] for _ in _TABLE_COLUMNS["journal"]]
        steps: list[list[Any]] = [[] for _ in _TABLE_COLUMNS["steps"]]
        intents: list[list[Any]] = [[], [], [], [], []]
        calls: list[list[Any]] = [[] for _ in _CALL_COLUMNS]

        def add(columns: list[list[Any]], row: Sequence[Any]) -> None:
            for column, value in zip(columns, row, strict=True):
                column.append(_no_nul(value))

        for p, (version, nxt) in zip(ps, held, strict=True):
            run_id = p.lease.run_id
            fence["run_ids"].append(run_id)
            fence["owners"].append(p.lease.owner)
            fence["versions"].append(version)
            fence["steps"].append(len(p.steps))
            fence["executed"].append(p.executed)
            for i, (kind, body) in enumerate(p.rows):
                add(journal, (run_id, nxt + i, kind, body, written_at))
            for row in p.steps:
                add(steps, row)
            for op, args in p.calls:
                add(intents if op == "intent" else calls, args)
        async with self._connection() as conn:
            try:
                async with conn.pipeline():
                    await conn.execute("BEGIN")
                    await conn.execute(_FENCE_MANY, fence)
                    for query, columns in (
                        (_MANY_JOURNAL, journal),
                        (_MANY_STEPS, steps),
                        (_MANY_INTENTS, intents),  # before the results that may update them
                        (_MANY_CALLS, calls),
                    ):
                        if columns[0]:
                            await conn.execute(query, columns)
                    await conn.execute("COMMIT")
            except BaseException:
                await self._roll_back(conn)
                raise
        for p, h in zip(ps, held, strict=True):
            h[0], h[1] = h[0] + 1, h[1] + len(p.rows)

    @staticmethod
    async def _write_rows(conn: _Conn, p: _Append, nxt: int, written_at: float) -> None:
        run_id = p.lease.run_id
        cur = conn.cursor()
        for i, (kind, body) in enumerate(p.rows):
            await cur.execute(_PG_INSERT_JOURNAL, (run_id, nxt + i, kind, body, written_at))
        for row in p.steps:
            await cur.execute(_PG_INSERT_STEP, _clean(row))
        for op, args in p.calls:
            if op == "intent":
                if args[3] > 1:  # earlier attempts of this intent still pending: lost
                    await cur.execute(_PG_MARK_UNCERTAIN, (args[2], args[3]))
                await cur.execute(_PG_INSERT_INTENT, args)
            else:
                await cur.execute(_PG_UPSERT_CALL, _clean(args))
        if p.status is not None:
            await cur.execute("UPDATE runs SET status = %s WHERE run_id = %s", (p.status, run_id))
        end = p.end
        if end is not None:
            await cur.execute(_END_PENDING, (run_id,))
            await cur.execute(
                _END_RUN,
                (
                    end.stop_reason.value,
                    _no_nul(end.stop_detail),
                    _no_nul(end.final_answer),
                    end.steps_used,
                    end.actions_executed,
                    end.ended_at,
                    *end_totals(end),
                    run_id,
                ),
            )

    async def _guarded(self, coro: Awaitable[_T], *, give_back: bool = False) -> _T:
        """Run ``coro`` to its end even if the caller is cancelled meanwhile: the write lands
        (or fails) before ``CancelledError`` propagates (its own error, if it failed,
        propagates instead). ``give_back``: a lease it took is released, since the caller
        never gets it."""
        task = asyncio.ensure_future(coro)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await _wait_uninterrupted(task)
            if not task.cancelled():
                exc = task.exception()
                if exc is not None:
                    raise exc from exc.__cause__
                result = task.result()
                if give_back and isinstance(result, Lease):
                    await self._give_back(result)
            raise

    # -- connections --------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[_Conn]:
        """A pooled connection; psycopg's errors come out as ``JournalError``."""
        await self.open()
        pool = self._pool
        if pool is None:
            raise JournalError(f"the PostgreSQL journal {self.where} is closed")
        try:
            async with pool.connection() as conn:
                yield conn
        except self._error as exc:
            if self._closed:
                raise JournalError(f"the PostgreSQL journal {self.where} is closed") from exc
            raise JournalError(
                f"PostgreSQL journal {self.where}: {type(exc).__name__}: {exc}"
            ) from exc

    async def _configure(self, conn: _Conn) -> None:
        if self.schema is not None:
            sql = self._psycopg.sql
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))

    # -- opening ------------------------------------------------------------------------------
    async def _check_schema(self, conn: _Conn) -> None:
        """Create the schema in an empty namespace; accept a readable PolyLoop journal; refuse
        anything else without modifying it."""
        if self.schema is not None:
            cur = await conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)
            )
            if await cur.fetchone() is None:
                sql = self._psycopg.sql
                async with conn.transaction():  # IF NOT EXISTS alone races with itself
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema),)
                    )
                    await conn.execute(
                        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                            sql.Identifier(self.schema)
                        )
                    )
        await self._configure(conn)
        cur = await conn.execute("SELECT current_schema()")
        row = await cur.fetchone()
        namespace = None if row is None else row[0]
        if namespace is None:
            raise JournalError(
                f"the PostgreSQL journal {self.where}: the connection has no current schema "
                "(its search_path names none that exists); pass schema= or fix the search_path"
            )
        names = await self._relations(conn, namespace)
        if names:
            version = await self._check_polyloop(conn, namespace, names)
            if _needs_migration(version):
                await self._migrate(conn, namespace)
            return
        async with conn.transaction():
            # Two processes opening one empty schema: the second waits, then finds the tables.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(namespace),))
            names = await self._relations(conn, namespace)
            if names:
                await self._check_polyloop(conn, namespace, names)
                return
            for statement in _DDL:
                await conn.execute(statement)
            await conn.cursor().executemany(
                "INSERT INTO meta (key, value) VALUES (%s, %s)",
                [
                    ("journal_schema_version", JOURNAL_SCHEMA_VERSION),
                    ("step_schema_version", STEP_SCHEMA_VERSION),
                ],
            )

    @staticmethod
    async def _relations(conn: _Conn, namespace: str) -> set[str]:
        cur = await conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
            (namespace,),
        )
        return {str(r[0]) for r in await cur.fetchall()}

    async def _migrate(self, conn: _Conn, namespace: str) -> None:
        """Bring a journal of an older version to ``JOURNAL_SCHEMA_VERSION`` (the SQLite
        journal's ``_migrate``), in one transaction under the schema's advisory lock."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(namespace),))
            cur = await conn.execute(
                "SELECT value FROM meta WHERE key = 'journal_schema_version' FOR UPDATE"
            )
            row = await cur.fetchone()
            old = None if row is None else row[0]
            if old is None or not _needs_migration(old):
                return  # another writer migrated it meanwhile
            for minor, table, column, decl in _ADDED_COLUMNS:
                if minor > _level(old):
                    await conn.execute(
                        f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {_pg_decl(decl)}"
                    )
            if _level(old) < 4:  # 1.4: runs.status may be 'awaiting_approval'
                await conn.execute("ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_status_check")
                await conn.execute(
                    "ALTER TABLE runs ADD CONSTRAINT runs_status_check "
                    + _sqlite_schema._NEW_STATUS_CHECK
                )
            await conn.execute(
                "UPDATE meta SET value = %s WHERE key = 'journal_schema_version'",
                (JOURNAL_SCHEMA_VERSION,),
            )
        log.info(
            "PostgreSQL journal %s schema %r: migrated from journal schema %s to %s",
            self._server,
            namespace,
            old,
            JOURNAL_SCHEMA_VERSION,
        )

    async def _check_polyloop(self, conn: _Conn, namespace: str, names: set[str]) -> str:
        """Refuse a schema that is not a PolyLoop journal this version can read; its journal
        schema version."""
        where = f"{self._server} schema {namespace!r}"
        if "meta" not in names:
            shown = ", ".join(sorted(names)[:8])
            raise JournalError(
                f"{where} holds tables ({shown}) and no PolyLoop 'meta' table: it is not a "
                "PolyLoop journal; refusing to touch it (it was not modified). Pass schema= "
                "naming an empty or PolyLoop schema."
            )
        try:
            cur = await conn.execute("SELECT key, value FROM meta")
            meta = {str(k): v for k, v in await cur.fetchall()}
        except self._error as exc:
            raise JournalError(
                f"{where} has a 'meta' table that is not PolyLoop's ({exc}); refusing to touch "
                "it (it was not modified)"
            ) from None
        _check_meta(meta, where)
        cur = await conn.execute(
            "SELECT c.relname, a.attname FROM pg_attribute a "
            "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = ANY(%s) AND a.attnum > 0 "
            "AND NOT a.attisdropped",
            (namespace, sorted(_TABLES)),
        )
        have: dict[str, set[str]] = {}
        for table, column in await cur.fetchall():
            have.setdefault(str(table), set()).add(str(column))
        want = {table: [c for c, _ in columns] for table, columns in _TABLE_COLUMNS.items()}
        version = str(meta["journal_schema_version"])
        _check_tables(where, names, have, want, version)
        return version


# -- reading ----------------------------------------------------------------------------------


if TYPE_CHECKING:

    def _conforms(journal: PostgresJournal) -> Journal:
        return journal
