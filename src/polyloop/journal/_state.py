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

from typing import Any

from ._owner import owner_is_dead

__all__ = ["run_state"]


def run_state(status: str, owner: Any, lease_expires_at: Any, now: float) -> str:
    """The derived state of a run (see the module) from its ``runs`` columns at ``now``
    (epoch seconds). Reads ``/proc`` only for an unexpired lease held on this host."""
    if status != "running":
        return status
    if owner is None:
        return "detached"
    if lease_expires_at is None or float(lease_expires_at) <= now or owner_is_dead(str(owner)):
        return "stale"
    return "running"
