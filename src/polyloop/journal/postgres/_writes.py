"""The PostgreSQL journal's leases and write path: a pooled connection, claiming and releasing
a lease (the version it was claimed at kept for the fence), an append in its own fenced
transaction (BEGIN, the fence, the rows, COMMIT in one round trip), group commit of the appends
queued in one turn of the event loop, and the error of a write fenced out. The journal
(:class:`polyloop.journal.postgres.PostgresJournal`) is built on it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...types import JournalError, Lease, LimitsRequest, PolyLoopError, RunLeased, RunNotFound
from .._limit_rows import limits_request
from .._owner import owner_is_dead
from .._request_rows import stored_request
from .._rows import _Append
from .._sqlite_writer import _wait_uninterrupted
from .._state import lease_lost
from . import _sql as sql
from ._schema import _TABLE_COLUMNS

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

    _Conn = AsyncConnection[tuple[Any, ...]]

log = logging.getLogger("polyloop")
_T = TypeVar("_T")


class _Writes:
    """What the journal's writes share: its pool, the leases it holds (per lease ``(run_id,
    owner)``: [the run row's version, the next seq], the fence) and the group-commit queue."""

    where: str
    _clock: Callable[[], float] | None
    _pool: AsyncConnectionPool[_Conn] | None
    _closed: bool
    _error: type[Exception]
    _fenced_out: type[Exception]
    _idle: object
    _held: dict[tuple[str, str], list[int]]
    _locks: dict[tuple[str, str], asyncio.Lock]
    # Group commit (see _append_grouped): the appends queued in this turn of the event loop.
    # The answer: True once written, False to write alone (the only one), or the error.
    _queue: list[tuple[_Append, asyncio.Future[bool]]]
    _flush_due: bool
    _flushes: set[asyncio.Future[None]]

    async def open(self) -> object:
        raise NotImplementedError

    def _written_at(self) -> float:
        """``journal.written_at`` of a write now: the writer's clock (or the injected one)."""
        return self._clock() if self._clock is not None else time.time()

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
                cur = await conn.execute(sql.CLAIM, params)
                row = await cur.fetchone()
                if row is not None:
                    self._held[(run_id, owner)] = [int(row[0]), 0]  # seq: set after the read
                    limits = await pending_limits(conn, run_id)
                    return Lease(run_id, owner, local + ttl_s, stored_request(*row[1:]), limits)
                cur = await conn.execute(sql.LEASE_OF, (run_id,))
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
            await conn.execute(sql.RELEASE, key)
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
        cur = await conn.execute(sql.LEASE_OF, (lease.run_id,))
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
        return lease_lost(lease, held)

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
            written_at = self._written_at()
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
                    await conn.execute(sql.FENCE, fence)
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
        written_at = self._written_at()
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
        calls: list[list[Any]] = [[] for _ in sql.CALL_COLUMNS]

        def add(columns: list[list[Any]], row: Sequence[Any]) -> None:
            for column, value in zip(columns, row, strict=True):
                column.append(sql.no_nul(value))

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
                    await conn.execute(sql.FENCE_MANY, fence)
                    for query, columns in (
                        (sql.MANY_JOURNAL, journal),
                        (sql.MANY_STEPS, steps),
                        (sql.MANY_INTENTS, intents),  # before the results that may update them
                        (sql.MANY_CALLS, calls),
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
            await cur.execute(sql.INSERT_JOURNAL, (run_id, nxt + i, kind, body, written_at))
        for row in p.steps:
            await cur.execute(sql.INSERT_STEP, sql.clean(row))
        for op, args in p.calls:
            await cur.execute(sql.CALLS[op], sql.clean(args) if op == "upsert" else args)
        if p.status is not None:
            await cur.execute(sql.SET_STATUS, (p.status, run_id))
        if p.end_row is not None:
            await cur.execute(sql.END_PENDING, (run_id,))
            await cur.execute(sql.END_RUN, sql.clean((*p.end_row, run_id)))

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


async def pending_limits(conn: _Conn, run_id: str) -> tuple[LimitsRequest, ...]:
    """The run's requests to change its budgets that no owner has applied yet."""
    cur = await conn.execute(sql.PENDING_LIMITS, (run_id,))
    return tuple(limits_request(r) for r in await cur.fetchall())
