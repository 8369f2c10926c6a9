"""The kernel's entry points: start a run, resume a run, detach a run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..seams import Approvals, Context
from ..types import (
    MAX_NESTING,
    AlreadyDecided,
    ApprovalDecided,
    ConfigError,
    EndRequest,
    JournalError,
    Limits,
    LimitsChanged,
    LimitsRequest,
    Message,
    RequestKind,
    RequestResult,
    RunEnd,
    RunResult,
    RunSpec,
    ToolSpec,
    first_invalid,
    nested_deeper,
)
from . import approving, retune
from .driver import KernelConfig, build_result
from .ids import new_id
from .replay import Replayed, replay
from .requests import default_by, request_end
from .run import RunDriver

__all__ = ["Kernel"]


def _refuse_invalid_text(verb: str, **inputs: Any) -> None:
    """The caller's own text must be valid Unicode: PolyLoop stores it as given and never
    alters it, and no journal can store a lone surrogate. ``ConfigError`` naming the argument
    and the bad code point otherwise, before anything is written; also for a value nested more
    than ``MAX_NESTING`` levels (the journal's JSON is written and read back recursively)."""
    for name, value in inputs.items():
        if nested_deeper(value):
            raise ConfigError(
                f"{verb}: {name} nests more than {MAX_NESTING} levels of objects and arrays, "
                "deeper than PolyLoop stores; flatten it; nothing was written"
            )
        where = first_invalid(value, name)
        if where is not None:
            raise ConfigError(
                f"{verb}: {where} is not valid Unicode (a lone surrogate, which no journal can "
                "store); fix that text first (e.g. decode bytes with errors='replace'); nothing "
                "was written"
            )


class Kernel:
    """Runs and resumes runs for one configuration. Holds no per-run state except the
    registry of active runs (for :meth:`detach`); concurrent runs are allowed."""

    def __init__(self, cfg: KernelConfig) -> None:
        self.cfg = cfg
        self._active: dict[str, RunDriver] = {}

    async def start(
        self,
        goal: str,
        *,
        limits: Limits,
        run_id: str | None,
        history: Sequence[Message],
        metadata: Mapping[str, Any] | None,
    ) -> RunResult:
        cfg = self.cfg
        history = tuple(history)
        _refuse_invalid_text(
            "Loop.run", run_id=run_id, goal=goal, history=history, metadata=metadata
        )
        tool_specs = tuple(cfg.environment.tool_specs())
        spec = RunSpec(
            run_id=run_id if run_id is not None else new_id(),
            goal=goal,
            limits=limits,
            created_at=cfg.clock.time(),
            history=history,
            metadata=metadata,
            wording_version=cfg.wording_version,
        )
        context = cfg.context_builder.new(goal=goal, history=history, tool_specs=tool_specs)
        lease = await cfg.journal.create(spec, ttl_s=cfg.lease_ttl_s)
        driver = RunDriver(cfg, spec, lease, tool_specs, context, Replayed(limits), resumed=False)
        return await self._drive(driver, None)

    async def resume(self, run_id: str, *, limits: Limits | None) -> RunResult:
        cfg = self.cfg
        _refuse_invalid_text("Loop.resume", run_id=run_id)
        spec, records = await cfg.journal.read(run_id)
        if records and isinstance(records[-1], RunEnd):
            return self._rebuilt(spec, records)  # ended is absorbing: read only, no lease
        # Check the records and the stored history before taking the lease, so a damaged
        # journal is never written to.
        seen = replay(spec.run_id, spec.limits, records, None)
        it = seen.interrupted
        if it is not None and it.approval is not None and it.decision is None:
            # Parked, no decision yet: say so without taking the lease (a decider needs none,
            # and the run's row is not touched while it waits).
            assert it.action_intent is not None
            raise approving.awaiting(run_id, len(seen.steps), it.action_intent, it.approval)
        tool_specs = tuple(cfg.environment.tool_specs())
        # The goal and history are written once, with the run: the context built from them now
        # is the one the run goes on with (records alone are read again under the lease).
        context = self._context(spec, tool_specs)
        lease, spec, records = await cfg.journal.acquire(run_id, ttl_s=cfg.lease_ttl_s)
        try:
            state = replay(spec.run_id, spec.limits, records, context)
            if state.end is not None:  # it ended between our read and our lease
                await cfg.journal.release(lease)
                return build_result(spec, state, context)
            if limits is not None and limits != state.limits:
                await cfg.journal.append(lease, (LimitsChanged(limits),))
                state.limits = limits
        except BaseException:
            await cfg.journal.release(lease)
            raise
        driver = RunDriver(cfg, spec, lease, tool_specs, context, state, resumed=True)
        return await self._drive(driver, state.interrupted)

    def detach(self, run_id: str) -> bool:
        """Ask an active run to stop at its next step boundary; False if it is not active here."""
        driver = self._active.get(run_id)
        if driver is None:
            return False
        driver.detach_requested = True
        return True

    async def request(
        self, run_id: str, kind: RequestKind, reason: str | None, by: str | None
    ) -> RequestResult:
        """Store a request to end ``run_id`` and act on it (:mod:`polyloop.kernel.requests`):
        a run this kernel drives gets it at once; another live owner at its next heartbeat;
        a run nobody holds is ended now."""
        verb = f"Loop.{kind}"
        _refuse_invalid_text(verb, run_id=run_id, reason=reason, by=by)
        if kind == "stop" and not (isinstance(reason, str) and reason.strip()):
            raise ConfigError(f"{verb}: give a reason (it becomes the run's stop_detail)")
        if reason is not None and not isinstance(reason, str):
            raise ConfigError(f"{verb}: reason must be a str, got {type(reason).__name__}")
        asked = EndRequest(kind, reason, by or default_by(), self.cfg.clock.time())

        def deliver(answer: RequestResult) -> None:
            driver = self._active.get(run_id)
            if driver is not None and answer.happened in ("requested", "already_requested"):
                driver.take_request(answer.request or asked)

        return await request_end(self.cfg.journal, self.cfg.clock, run_id, asked, deliver)

    async def set_limits(
        self, run_id: str, limits: Mapping[str, Any], reason: str, by: str | None
    ) -> tuple[LimitsRequest, bool]:
        """Store a request to change ``run_id``'s budgets and act on it
        (:mod:`polyloop.kernel.retune`): a run this kernel drives gets it at once."""
        _refuse_invalid_text("Loop.set_limits", run_id=run_id, reason=reason, by=by)
        cfg = self.cfg
        stored, live = await retune.request_limits(
            cfg.journal, cfg.clock, run_id, limits, by or default_by(), reason, cfg.lease_ttl_s
        )
        driver = self._active.get(run_id)
        if live and driver is not None:
            driver.take_limits((stored,))
        return stored, live

    async def decide(
        self, run_id: str, op_id: str, approved: bool, note: str | None, by: str | None
    ) -> ApprovalDecided:
        """Journal a person's decision on a parked run's action (:mod:`.approving`)."""
        verb = "Loop.approve" if approved else "Loop.deny"
        journal = self._approvals(verb)
        _refuse_invalid_text(verb, run_id=run_id, op_id=op_id, note=note, by=by)
        if not isinstance(op_id, str) or not op_id:
            raise ConfigError(f"{verb}: op_id must be the pending action's op_id, got {op_id!r}")
        if not approved and not (isinstance(note, str) and note.strip()):
            raise ConfigError(f"{verb}: give a reason (the model is shown it)")
        if note is not None and not isinstance(note, str):
            raise ConfigError(f"{verb}: the note must be a str, got {type(note).__name__}")
        mine = ApprovalDecided(0, op_id, approved, note, by or default_by(), self.cfg.clock.time())
        standing = await journal.decide(run_id, mine)
        if (standing.approved, standing.note, standing.by, standing.decided_at) != (
            mine.approved,
            mine.note,
            mine.by,
            mine.decided_at,
        ):
            raise AlreadyDecided(run_id, standing)
        return standing

    async def pending_approvals(self) -> list[dict[str, Any]]:
        return await self._approvals("Loop.pending_approvals").pending_approvals()

    def _approvals(self, verb: str) -> Approvals:
        journal = self.cfg.journal
        if not isinstance(journal, Approvals):
            raise ConfigError(
                f"{verb}: the journal {type(journal).__name__} cannot take approval decisions "
                "(it has no decide/pending_approvals); use the memory, SQLite or PostgreSQL "
                "journal"
            )
        return journal

    async def _drive(self, driver: RunDriver, interrupted: Any) -> RunResult:
        self._active[driver.run_id] = driver
        try:
            return await driver.drive(interrupted)
        finally:
            self._active.pop(driver.run_id, None)

    def _rebuilt(self, spec: RunSpec, records: Sequence[Any]) -> RunResult:
        context = self._context(spec, tuple(self.cfg.environment.tool_specs()))
        state = replay(spec.run_id, spec.limits, records, context)
        return build_result(spec, state, context)

    def _context(self, spec: RunSpec, tool_specs: tuple[ToolSpec, ...]) -> Context:
        """A new context from the run's stored goal and history; ``JournalError`` if the
        stored history cannot make one (the journal is damaged)."""
        try:
            return self.cfg.context_builder.new(
                goal=spec.goal, history=spec.history, tool_specs=tool_specs
            )
        except Exception as exc:
            raise JournalError(
                f"run {spec.run_id!r}: no context can be built from its stored goal and "
                f"history by this Loop's context builder ({type(exc).__name__}: {exc}); "
                "resume it with the context builder (and system prompt) it was started "
                "with; the journal was not modified"
            ) from exc
