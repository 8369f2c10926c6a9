"""Driving one run of a batch to its end (any backend), and keeping count of a batch."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Sequence

from polyloop import ApprovalRequired, Loop, RunDetached, RunLeased

from ._results import BatchProgress, BatchResult, ProgressFn, RunOutcome

__all__ = ["Tracker", "drive_run"]

log = logging.getLogger("polyloop")

_LEASE_MARGIN_S = 0.5


async def drive_run(loop: Loop, run_id: str, *, wait_leased_s: float = 0.0) -> RunOutcome:
    """``loop.resume(run_id)`` as a batch outcome: a stop reason is a result (never retried);
    a live lease elsewhere is ``leased``; a detach is ``detached``; any other exception is an
    ``error`` (logged; the run stays resumable). Cancellation propagates.

    ``wait_leased_s``: when the run is leased and the lease expires within this many seconds,
    wait for it to expire and try once more. A restarted Ray worker uses it to take back a run
    whose previous attempt died on another machine (a live owner renews its lease, so the
    second try then fails with ``leased``)."""
    try:
        try:
            result = await loop.resume(run_id)
        except RunLeased as exc:
            wait = exc.expires_at - time.time()
            if wait_leased_s <= 0 or wait > wait_leased_s:
                raise
            await asyncio.sleep(max(wait, 0.0) + _LEASE_MARGIN_S)
            result = await loop.resume(run_id)
    except RunLeased as exc:
        until = time.strftime("%H:%M:%S", time.localtime(exc.expires_at))
        return RunOutcome(run_id, "leased", detail=f"leased by {exc.owner} until {until}")
    except ApprovalRequired as exc:  # parked until a person decides: left alone, reported
        detail = f"awaiting approval: {exc.tool_name or 'an action'} op_id={exc.op_id}"
        return RunOutcome(run_id, "detached", detail=detail, steps_used=exc.steps_used)
    except RunDetached as exc:
        return RunOutcome(run_id, "detached", detail="detached", steps_used=exc.steps_used)
    except Exception as exc:
        log.warning("batch: run %s could not be advanced", run_id, exc_info=True)
        return RunOutcome(run_id, "error", detail=f"{type(exc).__name__}: {exc}")
    return RunOutcome(
        run_id,
        "ended",
        str(result.stop_reason),
        result.stop_detail,
        result.steps_used,
        result.totals.tokens,
        result.totals.cost_usd,
    )


class Tracker:
    """Counts a batch as its runs start and finish, and tells ``on_progress``. A worker that
    finishes a run and takes the next one says both at once (``finished(outcome,
    then=next_id)``), so no snapshot shows one run fewer running than there are."""

    def __init__(self, run_ids: Sequence[str], on_progress: ProgressFn | None) -> None:
        self._order = list(run_ids)
        self._outcomes: dict[str, RunOutcome] = {}
        self._running: set[str] = set()
        self._on_progress = on_progress
        self._reasons: Counter[str] = Counter()
        self._status: Counter[str] = Counter()
        self._tokens = 0
        self._cost = 0.0
        self._started_at = time.monotonic()

    @property
    def total(self) -> int:
        return len(self._order)

    def started(self, run_id: str) -> None:
        self._running.add(run_id)
        self._tell()

    def finished(
        self, outcome: RunOutcome, *, quiet: bool = False, then: str | None = None
    ) -> None:
        """``outcome`` is in; ``then``: the run the same worker starts next (counted running
        in the same snapshot)."""
        self._running.discard(outcome.run_id)
        if then is not None:
            self._running.add(then)
        old = self._outcomes.get(outcome.run_id)
        if old is not None:  # counted again (e.g. a retry): replace the earlier outcome
            self._status[old.status] -= 1
            if old.is_ended:
                self._reasons[str(old.stop_reason)] -= 1
        if old is not None:
            self._tokens -= old.tokens or 0
            self._cost -= old.cost_usd or 0.0
        self._outcomes[outcome.run_id] = outcome
        self._status[outcome.status] += 1
        self._tokens += outcome.tokens or 0
        self._cost += outcome.cost_usd or 0.0
        if outcome.is_ended:
            self._reasons[str(outcome.stop_reason)] += 1
        if not quiet:
            self._tell()

    def snapshot(self) -> BatchProgress:
        s = self._status
        return BatchProgress(
            total=self.total,
            done=s["ended"] + s["already_ended"],
            running=len(self._running),
            skipped=s["already_ended"],
            leased=s["leased"],
            detached=s["detached"],
            errors=s["error"],
            by_stop_reason={k: v for k, v in sorted(self._reasons.items()) if v > 0},
            tokens=self._tokens,
            cost_usd=self._cost,
            started_at=self._started_at,
        )

    def result(self) -> BatchResult:
        missing = [r for r in self._order if r not in self._outcomes]
        for run_id in missing:  # never reached (cannot happen unless a backend is cut short)
            self._outcomes[run_id] = RunOutcome(run_id, "error", detail="not executed")
        return BatchResult(tuple(self._outcomes[r] for r in self._order))

    def _tell(self) -> None:
        if self._on_progress is None:
            return
        try:
            self._on_progress(self.snapshot())
        except Exception:
            log.exception("batch: on_progress raised; ignored")
