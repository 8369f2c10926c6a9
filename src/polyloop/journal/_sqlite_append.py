"""The SQLite journal's writes of a run under its lease, as the writer (thread or process) runs
them in its transaction: an append (fenced, then its rows: the statements of
:mod:`polyloop.journal._sql`), a release, and the error of a write fenced out."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

from ..types import Lease, PolyLoopError, RunNotFound
from ._rows import _Append
from ._sql import (
    END_PENDING,
    END_RUN,
    INSERT_INTENT,
    INSERT_JOURNAL,
    INSERT_STEP,
    LEASE_OF,
    MARK_UNCERTAIN,
    NEXT_SEQ,
    RELEASE,
    SET_STATUS,
    UPSERT_CALL,
)
from ._sqlite_schema import _COUNT_STEPS, _FENCE
from ._sqlite_writer import _Fn, _Seqs
from ._state import lease_lost


def _lease_lost(conn: sqlite3.Cursor, lease: Lease) -> PolyLoopError:
    """Why a write of ``lease`` was fenced out (read in its transaction)."""
    row = conn.execute(LEASE_OF, (lease.run_id,)).fetchone()
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
            nxt = conn.execute(NEXT_SEQ, (run_id,)).fetchone()[0]
        now = clock()
        conn.executemany(
            INSERT_JOURNAL,
            [(run_id, nxt + i, kind, body, now) for i, (kind, body) in enumerate(p.rows)],
        )
        if p.steps:
            conn.executemany(INSERT_STEP, p.steps)
        for op, args in p.calls:
            if op == "intent":
                if args[3] > 1:  # earlier attempts of this intent still pending: lost
                    conn.execute(MARK_UNCERTAIN, (args[2], args[3]))
                conn.execute(INSERT_INTENT, args)
            else:
                conn.execute(UPSERT_CALL, args)
        if p.status is not None:
            conn.execute(SET_STATUS, (p.status, run_id))
        end = p.end_row
        if end is None:
            seqs.set(run_id, (owner, nxt + len(p.rows)))
            return
        conn.execute(END_PENDING, (run_id,))
        conn.execute(END_RUN, (*end, run_id))
        seqs.set(run_id, None)  # the lease is released with the end record

    return run


def _release_fn(lease: Lease) -> _Fn:
    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> None:
        conn.execute(RELEASE, (lease.run_id, lease.owner))
        seqs.set(lease.run_id, None)

    return run
