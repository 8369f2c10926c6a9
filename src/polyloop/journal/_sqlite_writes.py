"""The SQLite journal's write transactions, as the writer (thread or process) runs them under
the file's write lock: an append (fenced, then its rows: the statements of
:mod:`polyloop.journal._sql`), taking, renewing and releasing a lease, a request to end a run,
a person's decision; and the error of a write fenced out. Each is a function of the
connection and the writer's lease cache (``_Seqs``), made on the caller's thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..types import (
    ApprovalDecided,
    EndRequest,
    Lease,
    LimitsRequest,
    PolyLoopError,
    RequestResult,
    RunEnd,
    RunLeased,
    RunNotFound,
    record_json,
)
from . import _approvals
from . import _sql as sql
from ._limit_rows import limits_request, limits_row
from ._owner import new_owner
from ._request_rows import request_answer, request_row, stored_request
from ._rows import _Append, _prepare
from ._sqlite_schema import _COUNT_STEPS, _FENCE, _RECOUNT, _RENEW, _TAKE_LEASE, _TAKE_TO_END
from ._sqlite_writer import _Fn, _Seqs
from ._state import lease_is_live, lease_lost


def _lease_lost(conn: sqlite3.Cursor, lease: Lease) -> PolyLoopError:
    """Why a write of ``lease`` was fenced out (read in its transaction)."""
    row = conn.execute(sql.LEASE_OF, (lease.run_id,)).fetchone()
    if row is None:
        return RunNotFound(lease.run_id)
    return lease_lost(lease, f"held by {row[0] or 'nobody'}")


def _payload(p: _Append, now: float) -> tuple[Any, ...]:
    """An append for the writer process: only SQL values in tuples and lists (cheap to pickle,
    and nothing the child would have to import), ``now`` its ``written_at`` (taken when the
    append was made, not when it commits)."""
    lease = p.lease
    return (
        lease.run_id,
        lease.owner,
        lease.expires_at,
        p.rows,
        p.steps,
        p.calls,
        p.end_row,
        p.executed,
        p.status,
        now,
    )


def _append_of_payload(payload: tuple[Any, ...]) -> _Fn:
    """The writer process's write of one :func:`_payload` (the same SQL as the thread's)."""
    run_id, owner, expires_at, rows, steps, calls, end, executed, status, now = payload
    p = _Append(Lease(run_id, owner, expires_at), rows, steps, calls, None, executed, status, end)
    return _append_fn(p, lambda: now)


def _append_fn(p: _Append, clock: Callable[[], float]) -> _Fn:
    """The write of one append in the writer's transaction: the fence, then its rows (the
    ``written_at`` of its records from ``clock``)."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> None:
        run_id, owner = p.lease.run_id, p.lease.owner
        cached = seqs.get(run_id)
        # Steps not ending the run move the run's counters, fenced (the end sets them itself).
        counted = bool(p.steps) and p.end_row is None
        if counted:
            cur = conn.execute(_COUNT_STEPS, (len(p.steps), p.executed, run_id, owner))
            if cur.rowcount != 1:
                raise _lease_lost(conn, p.lease)
        if cached is not None and cached[0] == owner:
            # The fence, from memory: this connection's last committed write of the run left
            # it owned by this execution, no write of this connection changed the owner since
            # (those update the cache), and no other connection committed anything since
            # (``PRAGMA data_version``, checked under the write lock this transaction holds).
            nxt = cached[1]
        else:
            # The fence: it matches only while this execution holds the lease. It changes no
            # byte of the row (owner = owner), so it writes nothing and never copies the history.
            # (The counters' update above was the fence already.)
            if not counted:
                cur = conn.execute(_FENCE, (run_id, owner))
                if cur.rowcount != 1:
                    raise _lease_lost(conn, p.lease)
            nxt = conn.execute(sql.NEXT_SEQ, (run_id,)).fetchone()[0]
        now = clock()
        conn.executemany(
            sql.INSERT_JOURNAL,
            [(run_id, nxt + i, kind, body, now) for i, (kind, body) in enumerate(p.rows)],
        )
        if p.steps:
            conn.executemany(sql.INSERT_STEP, p.steps)
        for op, args in p.calls:
            conn.execute(sql.CALLS[op], args)
        if p.status is not None:
            conn.execute(sql.SET_STATUS, (p.status, run_id))
        end = p.end_row
        if end is None:
            seqs.set(run_id, (owner, nxt + len(p.rows)))
            return
        conn.execute(sql.END_PENDING, (run_id,))
        conn.execute(sql.END_RUN, (*end, run_id))
        seqs.set(run_id, None)  # the lease is released with the end record

    return run


def _release_fn(lease: Lease) -> _Fn:
    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> None:
        conn.execute(sql.RELEASE, (lease.run_id, lease.owner))
        seqs.set(lease.run_id, None)

    return run


def _acquire_fn(run_id: str, owner: str, ttl_s: float, clock: Callable[[], float]) -> _Fn:
    """``acquire``'s transaction: take the run's lease for ``owner`` unless a live execution
    holds it (``RunLeased``), count its counters again, and hand back the lease with the run's
    stored request."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> Lease:
        row = conn.execute(sql.LEASE_OF, (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        old_owner, old_expiry = row
        now = clock()
        if lease_is_live(old_owner, old_expiry, now):
            raise RunLeased(run_id, old_owner, old_expiry)
        expires = now + ttl_s
        cur = conn.execute(_TAKE_LEASE, (owner, expires, run_id, old_owner, old_expiry))
        if cur.rowcount != 1:  # cannot happen under the write lock; lose cleanly if it does
            now_owner = conn.execute(sql.LEASE_OF, (run_id,)).fetchone()
            raise RunLeased(run_id, str(now_owner[0]), float(now_owner[1] or 0.0))
        conn.execute(_RECOUNT, (run_id,))
        nxt = conn.execute(sql.LAST_SEQ, (run_id,)).fetchone()[0] + 1
        seqs.set(run_id, (owner, nxt))
        request = stored_request(*conn.execute(sql.REQUEST_OF, (run_id,)).fetchone())
        limits = _pending_limits(conn, run_id)
        return Lease(run_id, owner, expires, request, limits)

    return run


def _renew_fn(lease: Lease, ttl_s: float, clock: Callable[[], float]) -> _Fn:
    """``renew``'s transaction: move only the expiry (fenced by the owner), and hand back the
    request stored for the run, if any: how its owner learns of one."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> Lease:
        expires = clock() + ttl_s
        cur = conn.execute(_RENEW, (expires, lease.run_id, lease.owner))
        if cur.rowcount != 1:
            raise _lease_lost(conn, lease)
        # The request stored for the run, if any: how its owner learns of one.
        request = stored_request(*conn.execute(sql.REQUEST_OF, (lease.run_id,)).fetchone())
        limits = _pending_limits(conn, lease.run_id)
        return Lease(lease.run_id, lease.owner, expires, request, limits)

    return run


def _pending_limits(conn: sqlite3.Cursor, run_id: str) -> tuple[LimitsRequest, ...]:
    """The run's requests to change its budgets that no owner has applied yet."""
    return tuple(limits_request(r) for r in conn.execute(sql.PENDING_LIMITS, (run_id,)))


def _request_limits_fn(request: LimitsRequest) -> _Fn:
    """``request_limits``'s transaction: store ``request`` as the run's next ``requests`` row
    and hand it back with its ``seq``. Raises ``RunNotFound``."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> LimitsRequest:
        if conn.execute(sql.RUN_FOUND, (request.run_id,)).fetchone() is None:
            raise RunNotFound(request.run_id)
        conn.execute(sql.INSERT_REQUEST_ROW, limits_row(request))
        seq = conn.execute(sql.LAST_REQUEST_SEQ, (request.run_id,)).fetchone()[0]
        return replace(request, seq=int(seq))

    return run


def _settle_fn(run_id: str, settled: Sequence[tuple[int, str]], at: float) -> _Fn:
    """``settle_requests``'s transaction: mark each (seq, outcome) of the run settled at
    ``at`` (a row settled already stays as it was)."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> None:
        for seq, outcome in settled:
            conn.execute(sql.SETTLE_REQUEST, (at, outcome, run_id, seq))

    return run


def _request_end_fn(
    run_id: str,
    request: EndRequest,
    seen: int,
    end: Callable[[EndRequest], RunEnd],
    clock: Callable[[], float],
) -> _Fn:
    """``request_end``'s transaction (see :meth:`SQLiteJournal.request_end`)."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> RequestResult | None:
        row = conn.execute(sql.REQUEST_STATE, (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        answer, in_force, writes = request_answer(run_id, request, row, clock())
        if answer is None and conn.execute(sql.LAST_SEQ, (run_id,)).fetchone()[0] != seen:
            return None  # written since the caller read it: read it again
        if writes:
            conn.execute(sql.WRITE_REQUEST, (*request_row(request), run_id))
        if answer is not None or in_force is None:
            return answer
        record = end(in_force)
        me = new_owner()  # held for this transaction only: the end record releases it
        conn.execute(_TAKE_TO_END, (me, clock(), run_id))
        seqs.set(run_id, None)
        _append_fn(_prepare(Lease(run_id, me, 0.0), (record,)), clock)(conn, seqs)
        return RequestResult(run_id, "ended", in_force, record.stop_reason, record.stop_detail)

    return run


def _decide_fn(run_id: str, decision: ApprovalDecided, clock: Callable[[], float]) -> _Fn:
    """``decide``'s transaction (see :meth:`SQLiteJournal.decide`)."""

    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> ApprovalDecided:
        row = conn.execute(sql.RUN_STATUS, (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        bodies = [body for (body,) in conn.execute(sql.APPROVAL_RECORDS, (run_id,)).fetchall()]
        written, writes = _approvals.decision_of(run_id, decision, row[0], bodies)
        if not writes:
            return written
        nxt = conn.execute(sql.NEXT_SEQ, (run_id,)).fetchone()[0]
        conn.execute(sql.INSERT_JOURNAL, (run_id, nxt, written.kind, record_json(written), clock()))
        conn.execute(sql.DECIDED, (run_id,))
        seqs.set(run_id, None)
        return written

    return run
