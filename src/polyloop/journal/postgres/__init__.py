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

The package: ``_schema`` (the tables, opening and migrating a schema), ``_sql`` (the statements
only PostgreSQL has, and those of :mod:`polyloop.journal._sql` both journals speak, in its
placeholders), ``_writes`` (connections, leases, fenced appends, group commit); this module is
the seam.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Self, TypeVar

from ...types import (
    ApprovalDecided,
    ConfigError,
    EndRequest,
    JournalError,
    Lease,
    LimitsRequest,
    Record,
    RequestResult,
    RunEnd,
    RunExists,
    RunNotFound,
    RunSpec,
    StepRecord,
    check_number,
    import_extra,
    record_json,
)
from .. import _approvals, _observations
from .._limit_rows import limits_row, request_dict
from .._owner import new_owner
from .._reading import STEP_USAGE_FIELDS, check_page, list_runs_sql, listed_row, step_usage_query
from .._request_rows import request_answer, request_row, stored_request
from .._rows import _Append, _parse_run, _prepare, _steps_of, spec_json
from .._sql import REQUEST_COLUMNS
from .._versions import JOURNAL_SCHEMA_VERSION
from . import _sql as sql
from ._schema import check_schema, set_search_path
from ._writes import _Writes, pending_limits

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    from ...seams import Journal

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


# -- helpers ----------------------------------------------------------------------------------


def _describe(dsn: str, conninfo: Mapping[str, Any]) -> str:
    """The DSN without its password, for messages."""
    if not conninfo:
        return "(default connection)" if not dsn else "(DSN)"
    user = conninfo.get("user")
    host = conninfo.get("host") or conninfo.get("hostaddr") or "localhost"
    port = conninfo.get("port")
    where = f"{user + '@' if user else ''}{host}{':' + str(port) if port else ''}"
    return f"postgresql://{where}/{conninfo.get('dbname') or ''}"


# -- the journal ------------------------------------------------------------------------------


class PostgresJournal(_Writes):
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
                await check_schema(conn, self.schema, self._server, self._psycopg.sql, self._error)
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
        limits, metadata, history = spec_json(spec, "PostgreSQL")
        params: dict[str, Any] = {
            "run_id": run_id,
            "owner": new_owner(),
            "ttl": float(ttl_s),
            "created_at": spec.created_at,
            "journal_version": JOURNAL_SCHEMA_VERSION,
            "wording": spec.wording_version,
            "goal": spec.goal,
            "limits": limits,
            "metadata": metadata,
            "history": history,
        }

        async def run() -> Lease:
            local, params["now"] = self._now()
            async with self._connection() as conn:
                cur = await conn.execute(sql.INSERT_RUN, params)
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
                run_cur = await conn.execute(sql.READ_RUN, (run_id,))
                rec_cur = await conn.execute(sql.READ_RECORDS, (run_id,))
                big = await conn.execute(sql.READ_LARGE, (run_id, _observations.SHARED_ABOVE))
                # In the same round trip: none when no record is marked (_rows.has_logprobs).
                lp_cur = await conn.execute(sql.READ_LOGPROBS, (run_id,))
            row, rows = await run_cur.fetchone(), await rec_cur.fetchall()
            large = dict(await big.fetchall())
            logprobs = {(i, a): text for i, a, text in await lp_cur.fetchall()}
        if row is None:
            raise RunNotFound(run_id)
        return _parse_run(run_id, row, rows, large, logprobs)

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
        if p.end is not None or p.status is not None or any(op == "uncertain" for op, _ in p.calls):
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
                cur = await conn.execute(sql.RENEW, params)
                row = await cur.fetchone()
                if row is None:
                    raise await self._lease_lost(conn, lease)
                limits = await pending_limits(conn, lease.run_id)
            # The request stored for the run, if any: how its owner learns of one.
            return Lease(lease.run_id, lease.owner, local + ttl_s, stored_request(*row), limits)

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
            written_at = self._written_at()
            params = {"run_id": run_id, "now": self._now()[1]}
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(sql.REQUEST_STATE, params)
                row = await cur.fetchone()
                if row is None:
                    raise RunNotFound(run_id)
                answer, in_force, writes = request_answer(run_id, request, row[:-1], float(row[-1]))
                if answer is None:
                    cur = await conn.execute(sql.LAST_SEQ, (run_id,))
                    last = await cur.fetchone()
                    if last is None or last[0] != seen:
                        return None  # written since the caller read it: read it again
                if writes:
                    await conn.execute(
                        sql.WRITE_REQUEST, (*sql.clean(request_row(request)), run_id)
                    )
                if answer is not None or in_force is None:
                    return answer
                record = end(in_force)
                p = _prepare(Lease(run_id, new_owner(), 0.0), (record,))
                await conn.execute(sql.TAKE_TO_END, (p.lease.owner, run_id))
                await self._write_rows(conn, p, seen + 1, written_at)
            return RequestResult(run_id, "ended", in_force, record.stop_reason, record.stop_detail)

        return await self._guarded(run())

    async def decide(self, run_id: str, decision: ApprovalDecided) -> ApprovalDecided:
        """The ``Approvals`` seam (:class:`polyloop.seams.Approvals`), as
        :meth:`SQLiteJournal.decide` does it, in one transaction holding the run row's lock
        (``SELECT ... FOR UPDATE``): two deciders racing wait for each other, and exactly one
        decision is written."""

        async def run() -> ApprovalDecided:
            written_at = self._written_at()
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(sql.APPROVAL_STATE, (run_id,))
                row = await cur.fetchone()
                if row is None:
                    raise RunNotFound(run_id)
                cur = await conn.execute(sql.APPROVAL_RECORDS, (run_id,))
                bodies = [body for (body,) in await cur.fetchall()]
                written, writes = _approvals.decision_of(run_id, decision, row[0], bodies)
                if not writes:
                    return written
                cur = await conn.execute(sql.NEXT_SEQ, (run_id,))
                nxt = (await cur.fetchone() or (1,))[0]
                body = sql.no_nul(record_json(written))
                await conn.execute(
                    sql.INSERT_JOURNAL, (run_id, nxt, written.kind, body, written_at)
                )
                await conn.execute(sql.DECIDED, (run_id,))
            return written

        return await self._guarded(run())

    async def request_limits(self, request: LimitsRequest) -> LimitsRequest:
        """The ``LimitRequests`` seam: store ``request`` as the run's next ``requests`` row,
        numbered under the run row's lock (no lease needed). Raises ``RunNotFound``."""

        async def run() -> LimitsRequest:
            async with self._connection() as conn, conn.transaction():
                cur = await conn.execute(sql.RUN_LOCKED, (request.run_id,))
                if await cur.fetchone() is None:
                    raise RunNotFound(request.run_id)
                cur = await conn.execute(sql.INSERT_REQUEST_ROW, limits_row(request))
                row = await cur.fetchone()
                assert row is not None
            return replace(request, seq=int(row[0]))

        return await self._guarded(run())

    async def settle_requests(
        self, run_id: str, settled: Sequence[tuple[int, str]], *, at: float
    ) -> None:
        """The ``LimitRequests`` seam: mark the run's requests (seq, outcome) settled."""

        async def run() -> None:
            async with self._connection() as conn, conn.transaction():
                for seq, outcome in settled:
                    await conn.execute(sql.SETTLE_REQUEST, (at, outcome, run_id, seq))

        await self._guarded(run())

    async def requests(self, run_id: str) -> list[dict[str, Any]]:
        """The run's rows of the ``requests`` table by ``seq`` (see
        :meth:`SQLiteJournal.requests`; none in a journal of 2.0 no writer has opened yet).
        Read-only."""
        try:
            async with self._connection() as conn:
                cur = await conn.execute(sql.RUN_REQUESTS, (run_id,))
                rows = await cur.fetchall()
        except Exception as exc:
            if getattr(exc, "sqlstate", None) == "42P01":  # no such table: journal schema 2.0
                return []
            raise
        return [request_dict(r) for r in rows]

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """The ``Approvals`` seam: the actions awaiting a decision, oldest request first."""
        async with self._connection() as conn:
            cur = await conn.execute(sql.PENDING_APPROVALS)
            rows = await cur.fetchall()
        return _approvals.pending_of(rows)

    async def release(self, lease: Lease) -> None:
        await self._guarded(self._release(lease))

    # -- read-only helpers (never write; for the CLI and tests) -------------------------------
    async def list_runs(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every run (or those with ``status`` 'running'/'ended'; or only ``run_id``: a list
        of one or none, read by its key), oldest first, as dicts of the ``runs`` columns
        except ``history_json`` and ``version``, with ``metadata`` and ``limits`` decoded: the
        same shape as :meth:`SQLiteJournal.list_runs`, ``state`` included (derived on this
        machine's clock). ``steps_used``/``actions_executed`` are current after every step.
        Read-only. Pages with ``after`` and ``limit`` as :meth:`SQLiteJournal.list_runs`
        does (run ids compared byte by byte, ``COLLATE "C"``, as they are ordered)."""
        after, limit = check_page(after, limit)
        requests = ", ".join(REQUEST_COLUMNS)
        query, params = list_runs_sql(
            status,
            run_id,
            requests=requests,
            collate=' COLLATE "C"',
            after=after,
            limit=limit,
        )
        async with self._connection() as conn:
            cur = await conn.execute(sql.pg(query), params)
            names = [d.name for d in cur.description or ()]
            rows = await cur.fetchall()
        now = self._now()[0]
        return [listed_row(names, row, now) for row in rows]

    async def step_usage(self, run_id: str) -> dict[int, dict[str, Any]]:
        """What each step of the run spent, as :meth:`SQLiteJournal.step_usage` gives it (one
        aggregate query). Read-only. Raises ``RunNotFound``."""
        async with self._connection() as conn:
            async with conn.pipeline():
                run_cur = await conn.execute(sql.RUN_FOUND, (run_id,))
                cur = await conn.execute(sql.pg(step_usage_query()), (run_id,))
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
                run_cur = await conn.execute(sql.RUN_FOUND, (run_id,))
                steps_cur = await conn.execute(sql.READ_STEPS, (run_id,))
            found = await run_cur.fetchone()
            rows = await steps_cur.fetchall()
            names = [d.name for d in steps_cur.description or ()]
        if found is None:
            raise RunNotFound(run_id)
        return _steps_of(run_id, names, rows)

    async def _configure(self, conn: _Conn) -> None:
        await set_search_path(conn, self.schema, self._psycopg.sql)


if TYPE_CHECKING:

    def _conforms(journal: PostgresJournal) -> Journal:
        return journal
