"""Retuning a run's budgets from any process: ``Loop.set_limits``.

A request (:class:`polyloop.types.LimitsRequest`) is one row of the journal's ``requests``
table (the ``LimitRequests`` seam), written first, whoever then applies it:

* a run this process drives gets it at once; a live owner elsewhere with its next lease
  renewal (``Lease.limits``: the heartbeat's read, no query of its own per step). Either way
  the owner applies it at its next step boundary, before rule A, so a lowered budget ends the
  run with that budget's stop reason there and a raised one lets it go on;
* a run nobody drives (detached, parked, its owner dead, or created and never driven): the
  requester takes its lease and applies it now, then lets the run go.

Applying = appending a ``LimitsChanged`` record with the new limits (which ``resume``
rebuilds), then marking the request applied (``applied_at``, ``outcome``). A crash between
the two leaves the request pending: the next owner finds the limits already set, writes
nothing more and marks it applied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..seams import Clock, Journal, LimitRequests
from ..types import (
    ConfigError,
    Lease,
    Limits,
    LimitsChanged,
    LimitsRequest,
    RunLeased,
)
from .replay import replay

__all__ = ["apply_pending", "request_limits", "takes_limits"]

APPLIED = "applied"


def takes_limits(journal: Journal) -> LimitRequests:
    """The journal as the ``LimitRequests`` seam; ``ConfigError`` when it is not one."""
    if not isinstance(journal, LimitRequests):
        raise ConfigError(
            f"{type(journal).__name__} cannot take requests to change a run's limits (it has "
            "no request_limits method); use MemoryJournal, SQLiteJournal or PostgresJournal"
        )
    return journal


async def apply_pending(
    journal: Journal,
    clock: Clock,
    lease: Lease,
    limits: Limits,
    pending: Sequence[LimitsRequest],
) -> Limits:
    """Apply ``pending`` (oldest first) to a run whose limits are ``limits``, holding
    ``lease``: the ``LimitsChanged`` record (when they change), then each request settled.
    A request whose values no longer hold is settled ``not applied: <why>``. Returns the
    limits in force after."""
    settled: list[tuple[int, str]] = []
    new = limits
    for request in pending:
        try:
            new = request.applied_to(new)
        except ConfigError as exc:
            settled.append((request.seq, f"not applied: {exc}"))
        else:
            settled.append((request.seq, APPLIED))
    if new != limits:
        await journal.append(lease, (LimitsChanged(new),))
    await takes_limits(journal).settle_requests(lease.run_id, settled, at=clock.time())
    return new


async def request_limits(
    journal: Journal,
    clock: Clock,
    run_id: str,
    new: Mapping[str, Any],
    by: str,
    reason: str,
    ttl_s: float,
) -> tuple[LimitsRequest, bool]:
    """Store a request to set ``new`` on ``run_id`` and, when nobody drives the run, apply it
    now. Returns the stored request (``seq`` set; ``applied_at`` and ``outcome`` set when it
    was applied here) and whether a live owner holds the run (it applies the request).

    Raises:
        ConfigError: a value that cannot hold, the run has ended, or the journal takes no
            requests (nothing written).
        RunNotFound: no such run.
    """
    requests = takes_limits(journal)
    spec, records = await journal.read(run_id)
    state = replay(spec.run_id, spec.limits, records, None)
    if state.end is not None:
        raise ConfigError(
            f"run {run_id!r} has ended ({state.end.stop_reason}): its limits can no longer "
            "change (start a new run)"
        )
    asked = LimitsRequest.make(run_id, state.limits, new, by, reason, clock.time())
    stored = await requests.request_limits(asked)
    try:
        lease, spec, records = await journal.acquire(run_id, ttl_s=ttl_s)
    except RunLeased:
        return stored, True
    try:
        state = replay(spec.run_id, spec.limits, records, None)
        if state.end is not None:  # it ended between the request and the lease
            why = f"not applied: the run ended {state.end.stop_reason} first"
            await requests.settle_requests(run_id, [(stored.seq, why)], at=clock.time())
            return _settled(stored, why, clock), False
        await apply_pending(journal, clock, lease, state.limits, lease.limits)
    finally:
        await journal.release(lease)
    outcome = next((r for r in await requests.requests(run_id) if r["seq"] == stored.seq), None)
    if outcome is None:
        return stored, False
    return _settled(stored, outcome["outcome"], clock, outcome["applied_at"]), False


def _settled(
    request: LimitsRequest, outcome: str, clock: Clock, at: float | None = None
) -> LimitsRequest:
    return replace(request, applied_at=clock.time() if at is None else at, outcome=outcome)
