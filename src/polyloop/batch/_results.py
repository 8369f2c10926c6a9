"""What a batch reports: one outcome per run, progress snapshots, and the batch result."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["BatchProgress", "BatchResult", "OutcomeStatus", "ProgressFn", "RunOutcome"]

OutcomeStatus = Literal["ended", "already_ended", "leased", "detached", "error"]
"""``ended``: the run reached its end record (in this batch, or it returned its end when it
was resumed); ``already_ended``: it had ended before this batch looked (skipped, nothing
executed); ``leased``: another live execution holds it (skipped: someone else is on it);
``detached``: paused by a graceful shutdown, resumable; ``error``: it could not be advanced
(a bug, a journal failure, a worker lost more often than Ray retries) — resumable, see
``detail``."""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What happened to one run of a batch.

    ``stop_reason`` is set for ``ended``/``already_ended`` runs (a PolyLoop stop reason is a
    result, never retried); ``detail`` is the stop detail, or why the run was not advanced.
    ``steps_used`` is the run's step count when known; ``tokens`` and ``cost_usd`` what it
    spent (``RunResult.totals``), for a run that ended in this batch.
    """

    run_id: str
    status: OutcomeStatus
    stop_reason: str | None = None
    detail: str | None = None
    steps_used: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None

    @property
    def is_ended(self) -> bool:
        return self.status in ("ended", "already_ended")


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """A snapshot for progress displays: ``done`` runs have ended (``skipped`` of them before
    the batch started), ``running`` are being executed now, ``by_stop_reason`` counts the ended
    ones, and ``leased``/``detached``/``errors`` count the runs left not ended. ``tokens`` and
    ``cost_usd`` sum what the runs that ended in this batch spent (a run in flight counts once
    it ends); ``started_at`` is when the batch began (``time.monotonic()``), for rates."""

    total: int
    done: int
    running: int
    skipped: int
    leased: int
    detached: int
    errors: int
    by_stop_reason: Mapping[str, int] = field(default_factory=dict)
    tokens: int = 0
    cost_usd: float = 0.0
    started_at: float = 0.0

    @property
    def pending(self) -> int:
        """Runs not started yet."""
        return self.total - self.done - self.running - self.leased - self.detached - self.errors


ProgressFn = Callable[[BatchProgress], None]
"""Called (synchronously, on the driver's event loop; must not block) whenever a run starts or
finishes. Exceptions it raises are logged and ignored."""


@dataclass(frozen=True, slots=True)
class BatchResult:
    """The outcome of each run of a batch, in submission order, and counts over them."""

    outcomes: tuple[RunOutcome, ...]

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(o.run_id for o in self.outcomes)

    @property
    def by_status(self) -> dict[str, int]:
        return dict(Counter(o.status for o in self.outcomes))

    @property
    def by_stop_reason(self) -> dict[str, int]:
        """Ended runs (in this batch or before) by stop reason."""
        return dict(Counter(str(o.stop_reason) for o in self.outcomes if o.is_ended))

    @property
    def done(self) -> int:
        """Runs that have ended (in this batch or before)."""
        return sum(o.is_ended for o in self.outcomes)

    @property
    def not_ended(self) -> tuple[RunOutcome, ...]:
        """Runs left resumable (leased elsewhere, detached, or failed): re-run the batch or
        the sweeper to continue them."""
        return tuple(o for o in self.outcomes if not o.is_ended)

    @property
    def complete(self) -> bool:
        """Every run of the batch has ended."""
        return all(o.is_ended for o in self.outcomes)

    def summary(self) -> str:
        """One line: ``50 runs: 48 ended (task_completed 40, step_budget 8), 2 error``."""
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.by_stop_reason.items()))
        parts = [f"{self.done} ended" + (f" ({reasons})" if reasons else "")]
        skipped = self.by_status.get("already_ended", 0)
        if skipped:
            parts.append(f"{skipped} of them before this batch")
        for status in ("leased", "detached", "error"):
            n = self.by_status.get(status, 0)
            if n:
                parts.append(f"{n} {status}")
        return f"{len(self.outcomes)} runs: " + ", ".join(parts)
