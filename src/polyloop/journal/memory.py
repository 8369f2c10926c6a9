"""An in-memory journal: for tests and throwaway runs. Nothing survives the process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..types import (
    ActionIntent,
    ApprovalDecided,
    ApprovalRequested,
    EndRequest,
    Lease,
    LimitsRequest,
    ModelResult,
    Record,
    RequestResult,
    RunEnd,
    RunExists,
    RunLeased,
    RunNotFound,
    RunSpec,
    StepWritten,
)
from . import _approvals
from ._limit_rows import limits_row_of, request_dict
from ._owner import new_owner
from ._reading import UsageSums, check_page, run_totals
from ._request_rows import request_answer, request_row
from ._state import STATUS_AFTER, lease_is_live, lease_lost, run_state

__all__ = ["MemoryJournal"]


@dataclass
class _Run:
    spec: RunSpec
    records: list[Record] = field(default_factory=list)
    owner: str | None = None
    expires_at: float = 0.0
    steps_used: int = 0
    actions_executed: int = 0
    end: RunEnd | None = None
    request: EndRequest | None = None
    limit_requests: list[LimitsRequest] = field(default_factory=list)  # the requests rows
    status: str = "running"  # as runs.status: 'awaiting_approval' while parked, then 'ended'
    usage: UsageSums = field(default_factory=UsageSums)
    step_usage: dict[int, UsageSums] = field(default_factory=dict)


class MemoryJournal:
    """The Journal seam in memory, with the same lease and fencing rules as the durable ones.

    Every ``append`` is atomic and immediately "durable" (for the life of the process).
    ``clock`` (epoch seconds) is injectable so lease expiry can be tested without sleeping.
    It takes requests to end a run (``request_end``, the ``EndRequests`` seam) as the durable
    journals do, for the ``Loop`` objects of this process.
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

    async def list_runs(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every run (or those with ``status`` 'running'/'ended'; or only ``run_id``), in
        creation order, as :meth:`SQLiteJournal.list_runs` gives them: the ``runs`` columns
        (``journal_schema_version`` None: nothing is stored), the usage fields and the derived
        ``state``.
        ``steps_used``/``actions_executed`` are current after every step. Read-only.
        Pages with ``limit`` and ``after`` as :meth:`SQLiteJournal.list_runs` does, in this
        journal's order (creation order): ``after`` names the last run of the previous page,
        and the page starts at the run created after it (a run id this journal does not hold:
        the runs whose ``(created_at, run_id)`` sort after ``after``)."""
        after, limit = check_page(after, limit)
        now = self._clock()
        runs: Iterable[_Run | None] = (
            self._runs.values() if run_id is None else [self._runs.get(run_id)]
        )
        if after is not None:
            runs = _after(runs, after, after[1] in self._runs)
        out: list[dict[str, Any]] = []
        for run in runs:
            if run is None:
                continue
            if limit is not None and len(out) == limit:
                break
            row = _listed(run)
            if status is None or row["status"] == status:
                row["state"] = run_state(row["status"], row["owner"], row["lease_expires_at"], now)
                out.append(row)
        return out

    async def step_usage(self, run_id: str) -> dict[int, dict[str, Any]]:
        """What each step of the run spent, as :meth:`SQLiteJournal.step_usage` gives it.
        Raises ``RunNotFound``."""
        run = self._get(run_id)
        return {i: sums.step_fields() for i, sums in sorted(run.step_usage.items())}

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
        if lease_is_live(run.owner, run.expires_at, self._clock()):
            assert run.owner is not None
            raise RunLeased(run_id, run.owner, run.expires_at)
        lease = self._take(run, ttl_s)
        return lease, run.spec, tuple(run.records)

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        _extend(self._owned(lease), records)

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        run = self._owned(lease)
        run.expires_at = self._clock() + ttl_s
        return Lease(lease.run_id, lease.owner, run.expires_at, run.request, _pending(run))

    async def request_limits(self, request: LimitsRequest) -> LimitsRequest:
        """The ``LimitRequests`` seam: store ``request`` as the run's next request."""
        run = self._get(request.run_id)
        stored = replace(request, seq=len(run.limit_requests) + 1)
        run.limit_requests.append(stored)
        return stored

    async def settle_requests(
        self, run_id: str, settled: Sequence[tuple[int, str]], *, at: float
    ) -> None:
        """The ``LimitRequests`` seam: mark the run's requests (seq, outcome) settled."""
        rows = self._get(run_id).limit_requests
        for seq, outcome in settled:
            if 0 < seq <= len(rows) and rows[seq - 1].applied_at is None:
                rows[seq - 1] = replace(rows[seq - 1], applied_at=at, outcome=outcome)

    async def requests(self, run_id: str) -> list[dict[str, Any]]:
        """The run's requests as the durable journals' ``requests`` rows (by ``seq``)."""
        return [request_dict(limits_row_of(r)) for r in self._get(run_id).limit_requests]

    async def request_end(
        self,
        run_id: str,
        request: EndRequest,
        *,
        seen: int,
        end: Callable[[EndRequest], RunEnd],
    ) -> RequestResult | None:
        """The ``EndRequests`` seam: store ``request`` and, when nobody holds the run, end it
        (see :class:`polyloop.seams.EndRequests`). Atomic (no await inside)."""
        run = self._get(run_id)
        e, r = run.end, run.request
        row = (
            run.status,
            run.owner,
            run.expires_at,
            None if e is None else e.stop_reason.value,
            None if e is None else e.stop_detail,
            *((None,) * 4 if r is None else request_row(r)),
        )
        answer, in_force, writes = request_answer(run_id, request, row, self._clock())
        if answer is None and len(run.records) != seen:
            return None  # written since the caller read it: read it again
        if writes:
            run.request = request
        if answer is not None or in_force is None:
            return answer
        record = end(in_force)
        _extend(run, (record,))
        return RequestResult(run_id, "ended", in_force, record.stop_reason, record.stop_detail)

    async def decide(self, run_id: str, decision: ApprovalDecided) -> ApprovalDecided:
        """The ``Approvals`` seam (:class:`polyloop.seams.Approvals`). Atomic (no await)."""
        run = self._get(run_id)
        approvals = [r for r in run.records if isinstance(r, ApprovalRequested | ApprovalDecided)]
        standing = _approvals.answer(run_id, decision, approvals, ended=run.end is not None)
        if standing is not None:
            return standing
        written = _approvals.to_write(decision, approvals)
        _extend(run, (written,))
        return written

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """The ``Approvals`` seam: the actions awaiting a decision, oldest request first."""
        rows = []
        for run_id, run in self._runs.items():
            if run.status != "awaiting_approval":
                continue
            requested = next(r for r in reversed(run.records) if isinstance(r, ApprovalRequested))
            intent = next(
                r
                for r in reversed(run.records)
                if isinstance(r, ActionIntent) and r.op_id == requested.op_id
            )
            rows.append((run_id, requested, intent))
        return _approvals.pending(rows)

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
        return Lease(run.spec.run_id, run.owner, run.expires_at, run.request, _pending(run))

    def _owned(self, lease: Lease) -> _Run:
        """The run ``lease`` is the lease of, or ``LeaseLost`` (the fence)."""
        run = self._get(lease.run_id)
        if run.owner != lease.owner:
            raise lease_lost(lease, f"held by {run.owner or 'nobody'}")
        return run


def _pending(run: _Run) -> tuple[LimitsRequest, ...]:
    return tuple(r for r in run.limit_requests if r.applied_at is None)


_APPROVALS = (ApprovalRequested, ApprovalDecided)  # a tuple: no union built per record


def _extend(run: _Run, records: Sequence[Record]) -> None:
    run.records.extend(records)
    for r in records:
        if isinstance(r, StepWritten):
            run.steps_used += 1
            run.actions_executed += r.step.action_status == "executed"
        elif isinstance(r, ModelResult):
            run.usage.add(r)
            run.step_usage.setdefault(r.step_idx, UsageSums()).add(r)
        elif isinstance(r, _APPROVALS):
            run.status = STATUS_AFTER[r.kind]
        elif isinstance(r, RunEnd):
            run.owner = None
            run.status = STATUS_AFTER[r.kind]
            run.end = r
            run.steps_used, run.actions_executed = r.steps_used, r.actions_executed


def _after(
    runs: Iterable[_Run | None], after: tuple[float, str], held: bool
) -> Iterator[_Run | None]:
    """The runs listed after ``after``: those following its run (``held``: one of them), else
    those whose ``(created_at, run_id)`` sort after it."""
    if not held:
        return (r for r in runs if r is not None and (r.spec.created_at, r.spec.run_id) > after)
    it = iter(runs)
    for run in it:
        if run is not None and run.spec.run_id == after[1]:
            break
    return it


def _listed(run: _Run) -> dict[str, Any]:
    spec, end, req = run.spec, run.end, run.request
    return {
        "run_id": spec.run_id,
        "status": run.status,
        "stop_reason": None if end is None else end.stop_reason.value,
        "stop_detail": None if end is None else end.stop_detail,
        "final_answer": None if end is None else end.final_answer,
        "steps_used": run.steps_used,
        "actions_executed": run.actions_executed,
        "created_at": spec.created_at,
        "ended_at": None if end is None else end.ended_at,
        "owner": run.owner,
        "lease_expires_at": None if run.owner is None else run.expires_at,
        "wording_version": spec.wording_version,
        "journal_schema_version": None,
        "request": None if req is None else req.kind,
        "request_reason": None if req is None else req.reason,
        "requested_by": None if req is None else req.by,
        "requested_at": None if req is None else req.at,
        "goal": spec.goal,
        "limits": spec.limits.to_dict(),
        "metadata": None if spec.metadata is None else dict(spec.metadata),
        **run_totals(None if end is None else end.totals, run.usage),
    }
