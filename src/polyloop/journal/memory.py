"""An in-memory journal: for tests and throwaway runs. Nothing survives the process."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..types import (
    Lease,
    LeaseLost,
    Record,
    RunEnd,
    RunExists,
    RunLeased,
    RunNotFound,
    RunSpec,
)
from ._owner import new_owner, owner_is_dead

__all__ = ["MemoryJournal"]


@dataclass
class _Run:
    spec: RunSpec
    records: list[Record] = field(default_factory=list)
    owner: str | None = None
    expires_at: float = 0.0


class MemoryJournal:
    """The Journal seam in memory, with the same lease and fencing rules as the durable ones.

    Every ``append`` is atomic and immediately "durable" (for the life of the process).
    ``clock`` (epoch seconds) is injectable so lease expiry can be tested without sleeping.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._runs: dict[str, _Run] = {}
        self._clock = clock

    # -- introspection (read-only) ---------------------------------------------------------
    def run_ids(self) -> list[str]:
        """Ids of the runs held, in creation order."""
        return list(self._runs)

    def records(self, run_id: str) -> tuple[Record, ...]:
        """A run's records in ``seq`` order (seq = index + 1). Raises ``RunNotFound``."""
        return tuple(self._get(run_id).records)

    # -- the seam ---------------------------------------------------------------------------
    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease:
        if spec.run_id in self._runs:
            raise RunExists(spec.run_id)
        run = _Run(spec)
        self._runs[spec.run_id] = run
        return self._take(run, ttl_s)

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]:
        run = self._get(run_id)
        return run.spec, tuple(run.records)

    async def acquire(
        self, run_id: str, *, ttl_s: float
    ) -> tuple[Lease, RunSpec, Sequence[Record]]:
        run = self._get(run_id)
        if (
            run.owner is not None
            and run.expires_at > self._clock()
            and not owner_is_dead(run.owner)
        ):
            raise RunLeased(run_id, run.owner, run.expires_at)
        lease = self._take(run, ttl_s)
        return lease, run.spec, tuple(run.records)

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        run = self._owned(lease)
        run.records.extend(records)
        for r in records:
            if isinstance(r, RunEnd):
                run.owner = None

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        run = self._owned(lease)
        run.expires_at = self._clock() + ttl_s
        return Lease(lease.run_id, lease.owner, run.expires_at)

    async def release(self, lease: Lease) -> None:
        run = self._runs.get(lease.run_id)
        if run is not None and run.owner == lease.owner:
            run.owner = None

    # -- helpers ----------------------------------------------------------------------------
    def _get(self, run_id: str) -> _Run:
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFound(run_id) from None

    def _take(self, run: _Run, ttl_s: float) -> Lease:
        run.owner = new_owner()
        run.expires_at = self._clock() + ttl_s
        return Lease(run.spec.run_id, run.owner, run.expires_at)

    def _owned(self, lease: Lease) -> _Run:
        run = self._get(lease.run_id)
        if run.owner != lease.owner:
            raise LeaseLost(
                f"run {lease.run_id!r}: this execution ({lease.owner}) no longer holds the "
                f"lease (held by {run.owner or 'nobody'}); stop without writing"
            )
        return run
