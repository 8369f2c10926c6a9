"""What the viewer shows, read through the journal's public read API.

Everything is read with ``list_runs()``, ``steps(run_id)`` and ``read(run_id)`` (the Journal
seam), so any journal that has them can be viewed. A run that has ended never changes: its
loaded form is cached (a few runs at a time), so paging through a long run reads it once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from polyloop import PendingAction, StepRecord, StopReason
from polyloop.journal._reading import UsageSums
from polyloop.types import (
    ActionIntent,
    ActionResult,
    EscalationReport,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelResult,
    Record,
    RunEnd,
    RunSpec,
    StepWritten,
)

T = TypeVar("T")

KNOWN_STOP_REASONS: tuple[str, ...] = tuple(str(r) for r in StopReason)


class ReadableJournal(Protocol):
    """The read side the viewer needs (``SQLiteJournal`` has it)."""

    async def list_runs(self, *, run_id: str | None = None) -> list[dict[str, Any]]:
        """Every run, or only ``run_id`` (a list of one or none)."""
        ...

    async def steps(self, run_id: str) -> list[StepRecord]: ...

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]: ...


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run as the lists show it (a ``list_runs()`` row)."""

    run_id: str
    status: str
    """``running`` or ``ended`` (the journal's)."""
    state: str
    """``ended``, ``live`` (some process is advancing it now: the journal's ``running``),
    ``detached`` (not ended, nobody holds it: resumable) or ``stale`` (not ended, its owner's
    lease expired or its owner is dead: resumable), as the journal's ``list_runs()`` derives
    it."""
    stop_reason: str | None
    stop_detail: str | None
    final_answer: str | None
    steps_used: int
    actions_executed: int
    created_at: float
    ended_at: float | None
    goal: str
    metadata: dict[str, Any] | None
    limits: dict[str, Any]
    request: str | None = None
    """The request to end the run stored in its row (``stop``, ``cancel``), or None: pending
    while the run has not ended; on an ended run, the one that ended it or came too late."""
    request_reason: str | None = None
    requested_by: str | None = None
    requested_at: float | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    """What the run spent, as ``list_runs()`` gives it: ``tokens_used``, ``cost_usd``,
    ``active_seconds``, ``usage_missing``, ``input_tokens``, ``output_tokens``,
    ``cached_tokens``, ``reasoning_tokens`` (None: not known or not reported)."""

    @property
    def live(self) -> bool:
        """Some process is advancing the run now."""
        return self.state == "live"

    def duration_s(self, now: float) -> float:
        """Seconds from creation to the end (to ``now`` while in progress)."""
        end = self.ended_at if self.ended_at is not None else now
        return max(end - self.created_at, 0.0)

    def token(self) -> tuple[Any, ...]:
        """Changes whenever the run's shown state does."""
        return (
            self.status,
            self.steps_used,
            self.actions_executed,
            self.stop_reason,
            self.state,
            self.request,
        )


def run_row(d: dict[str, Any], now: float) -> RunRow:
    state = d.get("state")
    if state is None:  # a journal that does not derive it: from the lease alone
        expires = d.get("lease_expires_at")
        if d["status"] != "running":
            state = d["status"]
        elif d.get("owner") is None:
            state = "detached"
        else:
            state = "running" if (expires or 0.0) > now else "stale"
    return RunRow(
        run_id=d["run_id"],
        status=d["status"],
        state="live" if state == "running" else str(state),
        stop_reason=d.get("stop_reason"),
        stop_detail=d.get("stop_detail"),
        final_answer=d.get("final_answer"),
        steps_used=int(d.get("steps_used") or 0),
        actions_executed=int(d.get("actions_executed") or 0),
        created_at=float(d["created_at"]),
        ended_at=None if d.get("ended_at") is None else float(d["ended_at"]),
        goal=d.get("goal") or "",
        metadata=d.get("metadata") if isinstance(d.get("metadata"), dict) else None,
        limits=d.get("limits") or {},
        request=d.get("request"),
        request_reason=d.get("request_reason"),
        requested_by=d.get("requested_by"),
        requested_at=None if d.get("requested_at") is None else float(d["requested_at"]),
        usage={key: d.get(key) for key in RUN_USAGE_FIELDS},
    )


RUN_USAGE_FIELDS: tuple[str, ...] = (
    "tokens_used",
    "cost_usd",
    "active_seconds",
    "usage_missing",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
)
"""The usage fields of a ``list_runs()`` row (the ``runs`` totals, then the attempts' sums)."""


@dataclass(slots=True)
class StepView:
    """A step with what the journal knows around it."""

    step: StepRecord
    text: str | None = None
    """The reply's visible text (None: not recorded, use ``step.raw_response``)."""
    reasoning: str | None = None
    tool_calls: int = 0
    tool_cut: int = 0
    """Characters the tool itself cut from its output (not in ``observation`` at all)."""
    failed_attempts: list[str] = field(default_factory=list)
    """Model-call attempts of this step that failed (retried or final), as ``type: message``."""
    action_latency_ms: float | None = None
    usage: dict[str, Any] | None = None
    """What the step's model calls spent (``STEP_USAGE_FIELDS``: tokens and ``cost_usd``,
    None where not reported); None for a step without a model reply."""

    @property
    def hidden_tail(self) -> int:
        """Characters at the end of ``observation`` the model did not see (PolyLoop's cut)."""
        obs = self.step.observation or ""
        return min(max(self.step.observation_truncated_chars - self.tool_cut, 0), len(obs))

    @property
    def kind(self) -> str:
        """``invalid``, ``model_failure``, ``answer`` or the action status."""
        s = self.step
        if not s.parse_ok:
            return "model_failure" if s.llm_call_id is None else "invalid"
        if s.action_status is None:
            return "answer"
        return str(s.action_status)


@dataclass(slots=True)
class RunDetail:
    """A run with its steps, the end record's extras and what is in flight."""

    run: RunRow
    steps: list[StepView]
    pending: PendingAction | None = None
    report: EscalationReport | None = None
    in_flight: str | None = None
    """For an unended run: what the journal says was started and has no result yet."""
    model_failure: str | None = None


def build_detail(run: RunRow, records: Sequence[Record]) -> RunDetail:
    """Fold a run's journal records into steps with their replies and outcomes."""
    replies: dict[int, ModelResult] = {}
    spent: dict[int, UsageSums] = {}
    failed: dict[int, list[str]] = {}
    outcomes: dict[int, ActionResult] = {}
    intents: dict[int, ActionIntent] = {}
    steps: list[StepRecord] = []
    detail = RunDetail(run, [])
    last_model_intent: ModelIntent | None = None
    for r in records:
        if isinstance(r, ModelResult):
            replies[r.step_idx] = r
            spent.setdefault(r.step_idx, UsageSums()).add(r)
            last_model_intent = None
        elif isinstance(r, ModelIntent):
            last_model_intent = r
        elif isinstance(r, ModelAttemptFailed | ModelFailure):
            failed.setdefault(r.step_idx, []).append(f"{r.error.type}: {r.error.message}")
            last_model_intent = None
            if isinstance(r, ModelFailure):
                detail.model_failure = f"{r.error.type}: {r.error.message}"
        elif isinstance(r, ActionIntent):
            intents[r.step_idx] = r
        elif isinstance(r, ActionResult):
            outcomes[r.step_idx] = r
        elif isinstance(r, StepWritten):
            steps.append(r.step)
        elif isinstance(r, RunEnd):
            detail.pending = r.pending_action
            detail.report = r.report
    for s in steps:
        view = StepView(s, failed_attempts=failed.get(s.step_idx, []))
        sums = spent.get(s.step_idx)
        view.usage = None if sums is None else sums.step_fields()
        reply = replies.get(s.step_idx)
        if reply is not None:
            view.text = reply.reply.text
            view.reasoning = reply.reply.reasoning
            view.tool_calls = len(reply.reply.tool_calls)
        outcome = outcomes.get(s.step_idx)
        if outcome is not None:
            view.tool_cut = outcome.outcome.truncated_chars
            view.action_latency_ms = outcome.latency_ms
        detail.steps.append(view)
    if run.status != "ended":
        done = {s.step_idx for s in steps}
        open_actions = [i for i in intents.values() if i.step_idx not in done]
        if open_actions:
            a = open_actions[-1]
            detail.in_flight = (
                f"step {a.step_idx}: action {a.action.tool_name or '(no tool name)'} "
                f"(op_id {a.op_id}) started, no result yet"
            )
        elif last_model_intent is not None:
            detail.in_flight = (
                f"step {last_model_intent.step_idx}: model call "
                f"(attempt {last_model_intent.attempt}) started, no reply yet"
            )
    return detail


class Runner:
    """An event loop in a thread of its own, for calling the async journal from WSGI threads."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="polyloop-view", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


class Source:
    """The viewer's reads, with a cache for runs that can no longer change."""

    def __init__(self, journal: ReadableJournal, *, cache_runs: int = 4) -> None:
        self.journal = journal
        self._cache_size = cache_runs
        self._details: OrderedDict[str, tuple[tuple[Any, ...], RunDetail]] = OrderedDict()
        self._walls: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    async def runs(self) -> list[RunRow]:
        now = time.time()
        return [run_row(d, now) for d in await self.journal.list_runs()]

    async def run(self, run_id: str) -> RunRow | None:
        rows = await self.journal.list_runs(run_id=run_id)
        return run_row(rows[0], time.time()) if rows else None

    async def detail(self, run: RunRow) -> RunDetail:
        token = run.token()
        with self._lock:
            hit = self._details.get(run.run_id)
            if hit is not None and hit[0] == token:
                self._details.move_to_end(run.run_id)
                hit[1].run = run
                return hit[1]
        _, records = await self.journal.read(run.run_id)
        detail = build_detail(run, records)
        with self._lock:
            self._details[run.run_id] = (token, detail)
            self._details.move_to_end(run.run_id)
            while len(self._details) > self._cache_size:
                self._details.popitem(last=False)
        return detail

    async def step_walls(self, runs: Sequence[RunRow]) -> list[float]:
        """``step_wall_ms`` of every step of ``runs`` (ended runs' are cached)."""
        out: list[float] = []
        for run in runs:
            with self._lock:
                cached = self._walls.get(run.run_id) if run.status == "ended" else None
            if cached is None:
                cached = [s.step_wall_ms for s in await self.journal.steps(run.run_id)]
                if run.status == "ended":
                    with self._lock:
                        self._walls[run.run_id] = cached
            out.extend(cached)
        return out
