"""What a run is doing now, derived from its ``runs`` row: the ``state`` of ``list_runs()``.

The ``runs.status`` column says whether the end record is written (``running`` or
``ended``), or whether the run is parked until a person decides on an action
(``awaiting_approval``, journal schema 1.4; its state is that too). Whether anybody is
advancing a run that has not ended is told by its lease:

=============  ==============================================================================
``ended``      the end record is written (``status = 'ended'``); the run never changes again
``running``    not ended, and an execution holds a lease that has not expired: it is advancing
``detached``   not ended, and nobody holds it (``owner IS NULL``): detached (Ctrl-C, ``detach``,
               a worker's graceful shutdown), released after an error, or a batch row not yet
               dispatched. Resumable at once
``stale``      not ended, and its owner is gone: the lease expired (``lease_expires_at <=``
               now: the owner stopped renewing it) or the owner is provably dead (same host,
               no process with its pid and start time). Resumable: ``resume`` takes it over
=============  ==============================================================================

In SQL (epoch seconds; a dead owner on this host is only told apart by ``list_runs()``)::

    SELECT run_id,
           CASE WHEN status <> 'running' THEN status
                WHEN owner IS NULL THEN 'detached'
                WHEN coalesce(lease_expires_at, 0) <= :now THEN 'stale'
                ELSE 'running' END AS state
    FROM runs

A ``status`` this version does not know is passed through as the state.
"""

from __future__ import annotations

from typing import Any, Final

from ..types import ApprovalDecided, ApprovalRequested, Lease, LeaseLost, RunEnd
from ._owner import owner_is_dead

__all__ = ["STATUS_AFTER", "lease_is_live", "lease_lost", "run_state"]

STATUS_AFTER: Final[dict[str, str]] = {
    ApprovalRequested.kind: "awaiting_approval",
    ApprovalDecided.kind: "running",
    RunEnd.kind: "ended",
}
"""The ``runs.status`` a record of these kinds leaves its run in (every other record leaves it
as it was; a run starts ``running``): every journal's rule."""


def lease_is_live(owner: Any, lease_expires_at: Any, now: float) -> bool:
    """Whether a live execution holds the lease of a run whose ``owner`` and
    ``lease_expires_at`` columns these are, at ``now`` (epoch seconds): an owner, a lease not
    expired, and the owner not provably dead. Anything else may be taken over (durability.md
    "Leases"): every journal's rule for ``acquire``, requests and ``state``."""
    return (
        owner is not None and float(lease_expires_at or 0.0) > now and not owner_is_dead(str(owner))
    )


def lease_lost(lease: Lease, held: str) -> LeaseLost:
    """The error of a write fenced out: ``lease`` is no longer its run's; ``held`` says by
    whom (or why)."""
    return LeaseLost(
        f"run {lease.run_id!r}: this execution ({lease.owner}) no longer holds the lease "
        f"({held}); stop without writing"
    )


def run_state(status: str, owner: Any, lease_expires_at: Any, now: float) -> str:
    """The derived state of a run (see the module) from its ``runs`` columns at ``now``
    (epoch seconds). Reads ``/proc`` only for an unexpired lease held on this host."""
    if status != "running":
        return status
    if owner is None:
        return "detached"
    return "running" if lease_is_live(owner, lease_expires_at, now) else "stale"
