"""The state of one run being driven, and the writes every phase of it makes.

:class:`Driver` holds what an execution of a run knows (its config, lease, context, replayed
state, the action in flight) and the one way each kind of record is written: a step that does
not end the run (:meth:`Driver._append_step`, with the next step's model intent when nothing
stands between them), the end record with the step that causes it (:meth:`Driver._end`), and any
other record (:meth:`Driver._write`). The phase modules (:mod:`.model_call`, :mod:`.deciding`,
:mod:`.acting`, :mod:`.approving`, :mod:`.guarding`, :mod:`.wrap_up`, :mod:`.cancelling`,
:mod:`.liveness`, :mod:`.continuing`) take a Driver; :class:`.run.RunDriver` adds the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..seams import (
    Clock,
    Context,
    ContextBuilder,
    Environment,
    Interpreter,
    Journal,
    Model,
    ModelChain,
    NeedsApproval,
    Pricer,
    PriceTable,
    model_name,
)
from ..types import (
    DEFAULT_TEMPLATES,
    Action,
    ActionIntent,
    ActionResult,
    ConfigError,
    EndRequest,
    EscalationReport,
    Event,
    Lease,
    LimitsRequest,
    ModelIntent,
    ModelReply,
    Observer,
    Outcome,
    OutcomeUnknown,
    PendingAction,
    Pricing,
    Record,
    ReportHook,
    RetryPolicy,
    RunEnd,
    RunEnded,
    RunEndGuard,
    RunResult,
    RunSpec,
    StepAppended,
    StepRecord,
    StepWritten,
    StopReason,
    ToolSpec,
    fast_init,
)
from . import stopping
from .ids import new_id
from .replay import Replayed

__all__ = ["Driver", "KernelConfig", "StepCtx", "build_result", "pricing_of", "tool_names"]

log = logging.getLogger("polyloop")


@dataclass(frozen=True, slots=True)
class KernelConfig:
    """Everything the kernel needs that is fixed for a ``Loop`` (no per-run state)."""

    model: Model
    interpreter: Interpreter
    environment: Environment
    context_builder: ContextBuilder
    journal: Journal
    observers: tuple[Observer, ...]
    retry: RetryPolicy
    cancel_grace_s: float
    lease_ttl_s: float
    clock: Clock
    wording_version: str
    guards: tuple[RunEndGuard, ...] = ()
    wrap_up: bool = False
    """``Loop(wrap_up=True)``: a budget stop first makes the wrap-up call."""
    wrap_up_prompt: str = ""
    """The wrap-up call's message (``Templates.wrap_up``), given also when ``wrap_up`` is off:
    a resume finishes a wrap-up the journal shows begun, whatever the Loop resuming it says."""
    wrap_up_no_action: str = ""
    """The observation of a wrap-up reply that called a tool (``Templates.wrap_up_no_action``)."""
    report_hook: ReportHook | None = None
    """``Loop(report_hook=...)``: adds the caller's directions to an escalation report."""
    end_write_timeout_s: float = 10.0
    approval_timeout_s: float | None = None
    """``Loop(approval_timeout_s=...)``: an approval request expires after this many seconds
    (a sweeper may then deny it, reason "timed out"); None: never."""
    approval_denied: str = DEFAULT_TEMPLATES.approval_denied
    """The observation of a denied action (``Templates.approval_denied``)."""
    time_budget_grace_s: float = 5.0
    """``Loop(time_budget_grace_s=...)``: what a call may run past ``Limits.max_seconds``
    (:mod:`.deadline`)."""
    price_table: PriceTable | None = None
    """The prices of the models that have no ``pricing`` of their own, by name
    (:mod:`polyloop.models.prices`); None: such models have no price."""
    # Derived once here, not per run (checking a runtime Protocol costs more than a short
    # run's first step): the models a step may ask, in order (a FallbackModel's, or the one
    # model), the failure kinds that move to the next one, and the environment's
    # NeedsApproval method (None: no action ever needs approval), and each model's price
    # in the price table (None: not in it; a model's own pricing, read per run, comes first).
    models: tuple[Model, ...] = field(init=False)
    fallback_on: frozenset[str] = field(init=False)
    needs_approval: Callable[[Action], bool] | None = field(init=False)
    table_prices: tuple[Pricer | None, ...] = field(init=False)

    def __post_init__(self) -> None:
        model = self.model
        if isinstance(model, ModelChain):
            models: tuple[Model, ...] = tuple(model.models)
            fallback_on = frozenset(model.fallback_on)
        else:
            models, fallback_on = (model,), frozenset()
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "fallback_on", fallback_on)
        table = self.price_table
        names = (model_name(m) for m in models)
        prices = tuple(None if table is None or n is None else table(n) for n in names)
        object.__setattr__(self, "table_prices", prices)
        env = self.environment
        approval = env.needs_approval if isinstance(env, NeedsApproval) else None
        object.__setattr__(self, "needs_approval", approval)


@fast_init
@dataclass(frozen=True, slots=True)
class StepCtx:
    """The step in progress once its action intent is durable."""

    step_idx: int
    t0: float
    prompt_chars: int
    reply: ModelReply
    llm_call_id: str
    intent: ActionIntent
    replaced: int  # code points replaced in this step before the action's outcome
    resumed: bool = False  # the intent was found without a result: it may have run already
    model: str | None = None  # the name of the model that answered
    approved_by: str | None = None  # who approved the action (it needed approval)
    unknown_reports: int = 0  # executions of the action that raised OutcomeUnknown
    outcome_unknown: str | None = None  # the path such a report took: its step's field


def pricing_of(model: object) -> Pricing | None:
    """A model's ``pricing`` attribute (optional; a ``Pricing`` or None)."""
    pricing = getattr(model, "pricing", None)
    if pricing is not None and not isinstance(pricing, Pricing):
        raise ConfigError(f"{model!r}.pricing must be a polyloop.Pricing or None, got {pricing!r}")
    return pricing


def tool_names(specs: Sequence[ToolSpec]) -> frozenset[str]:
    """Names of the tools in OpenAI-format specs."""
    names = set()
    for spec in specs:
        fn = spec.get("function")
        name = fn.get("name") if isinstance(fn, dict) else spec.get("name")
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


class Driver:
    """One execution of one run: its state, and the writes of its records. Advancing it is
    :class:`.run.RunDriver`'s (the loop) and the phase modules' (one rule each)."""

    def __init__(
        self,
        cfg: KernelConfig,
        spec: RunSpec,
        lease: Lease,
        tool_specs: tuple[ToolSpec, ...],
        context: Context,
        state: Replayed,
        *,
        resumed: bool,
    ) -> None:
        self.cfg = cfg
        self.spec = spec
        self.run_id = spec.run_id
        self.lease = lease
        self.tool_specs = tool_specs
        self.tool_names = tool_names(tool_specs)
        self.context = context
        self.state = state
        self.resumed = resumed
        self.detach_requested = False
        self._observers = cfg.observers
        self._needs_approval = cfg.needs_approval
        self._ended = False
        # The action in flight, in its own task: from its start until its result is durable.
        self._action_task: asyncio.Future[Outcome | OutcomeUnknown] | None = None
        self._intent_written: StepCtx | None = None
        # A request to end the run (Loop.stop / Loop.cancel): from the lease it was started
        # with, a renewal's, or this process's Loop directly (take_request).
        self.request: EndRequest | None = lease.request
        # Requests to change the run's budgets (Loop.set_limits) not applied yet, from the
        # lease as request is; applied at the next step boundary (retune.apply_pending).
        self.limit_requests: tuple[LimitsRequest, ...] = lease.limits
        self._limits_taken = max((r.seq for r in lease.limits), default=0)
        self._task: asyncio.Task[object] | None = None  # the task driving the run
        self._cancel_sent = False  # a cancel request cancelled _task
        self._closing = False  # past the point where a cancel request may cancel _task
        self._beat: asyncio.TimerHandle | None = None
        self._renewal: asyncio.Future[None] | None = None
        self._models = cfg.models
        self._fallback_on = cfg.fallback_on
        self._model_names = tuple(model_name(m) for m in self._models)
        self._pricing: tuple[Pricer | None, ...] = tuple(
            p if (p := pricing_of(m)) is not None else t
            for m, t in zip(self._models, cfg.table_prices, strict=True)
        )
        # Active time: what earlier executions journaled, plus this one's since it began.
        self._active_base = state.active_s
        self._active_t0 = cfg.clock.monotonic()
        self._partial = False  # the attempt in flight has delivered a ModelDelta
        # The next step's first model intent, written with the step before it (see
        # _next_intent): the intent, the step's start and its prompt size.
        self._begun: tuple[ModelIntent, float, int] | None = None

    def take_request(self, request: EndRequest) -> None:
        """A request to end the run, from its lease or from this process's ``Loop``: a stop
        ends it at the next step boundary; a cancel cancels the task driving it now (an action
        in flight gets the cancellation grace). A cancel replaces a stop; nothing replaces a
        cancel. Returns at once."""
        if not request.replaces(self.request):
            return
        self.request = request
        task = self._task
        if request.kind != "cancel" or self._closing or self._cancel_sent:
            return
        if task is not None and not task.done():
            self._cancel_sent = True
            task.cancel(f"cancel requested by {request.by}")

    def take_limits(self, requests: tuple[LimitsRequest, ...]) -> None:
        """Requests to change the run's budgets, from a lease or this process's ``Loop``:
        those not taken before wait for the next step boundary. Returns at once."""
        new = tuple(r for r in requests if r.seq > self._limits_taken)
        if new:
            self.limit_requests += new
            self._limits_taken = new[-1].seq

    # -- writing ------------------------------------------------------------------------------
    async def _write(self, records: tuple[Record, ...]) -> None:
        try:
            await self.cfg.journal.append(self.lease, records)
        except asyncio.CancelledError:
            # The Journal seam finishes a cancelled write before re-raising: it is durable.
            self._durable(records)
            raise
        self._durable(records)

    def _durable(self, records: tuple[Record, ...]) -> None:
        for r in records:
            kind = type(r)  # the kernel built these records itself: exact types
            if kind is ActionResult:
                self._action_task = self._intent_written = None
            elif kind is RunEnd:
                self._ended = True
                assert isinstance(r, RunEnd)
                self.state.end = r

    def _add_to_context(self, step: StepRecord, reply: ModelReply | None, cut: int) -> StepWritten:
        """Add the step to the trajectory and the context; its record, with the run's active
        time as the context saw it (so that resume rebuilds the same context)."""
        st = self.state
        st.steps.append(step)
        active = self._active()
        self.context.add_step(st.turn(step, reply, cut, active))
        return StepWritten(step, active)

    async def _append_step(
        self, records: tuple[Record, ...], step: StepRecord, reply: ModelReply | None, cut: int
    ) -> None:
        """Write a step that does not end the run, and with it the next step's model intent
        when the next iteration will call the model (:meth:`_next_intent`)."""
        written = self._add_to_context(step, reply, cut)
        intent = self._next_intent()
        await self._write((*records, written) if intent is None else (*records, written, intent))
        if self._observers:
            self._emit(StepAppended(self.run_id, step))

    def _next_intent(self) -> ModelIntent | None:
        """The first model intent of the next step, to be written in one transaction with
        the step before it (one commit per step fewer), when nothing stands before the
        next model call: no request to end the run or detach it, A and B passed (so no
        wrap-up either), and no observers. The step has then begun once that write is
        durable: a request arriving during the write is honoured at the end of that next
        step, as one arriving while a model intent is written always was. None otherwise:
        the next iteration checks A and B and writes the intent itself.

        Not with observers: they see ``StepAppended`` after the step is durable and may
        detach the run there (``Loop.detach`` is synchronous), which must stop it before the
        next model call, with no model intent that was never sent (it would be counted as an
        attempt whose answer was lost)."""
        if self._observers or self.detach_requested or self.request is not None:
            return None
        if self.limit_requests:
            return None
        if self._admitted() is not None:
            return None
        st = self.state
        prompt_chars = self.context.prompt_chars
        if stopping.context_overflows(st.limits, prompt_chars) is not None:
            return None
        intent = ModelIntent(len(st.steps), new_id(), 1, self._model_names[0])
        self._begun = (intent, self.cfg.clock.monotonic(), prompt_chars)
        return intent

    def _admitted(self) -> StopReason | None:
        """A: the budget the run has spent, if any (:func:`.stopping.admit`)."""
        st = self.state
        return stopping.admit(
            st.limits, len(st.steps), st.actions_executed, st.tokens, st.cost_usd, self._active()
        )

    async def _end(
        self,
        reason: StopReason,
        detail: str | None = None,
        *,
        final_answer: str | None = None,
        records: tuple[Record, ...] = (),
        step: StepRecord | None = None,
        reply: ModelReply | None = None,
        cut: int = 0,
        pending: PendingAction | None = None,
        report: EscalationReport | None = None,
    ) -> RunResult:
        """Write the end record, in one transaction with the step that ends the run."""
        st = self.state
        if step is not None:
            records = (*records, self._add_to_context(step, reply, cut))
        end = st.end_record(
            reason,
            detail,
            self.cfg.clock.time(),
            self._active(),
            final_answer=final_answer,
            pending=pending,
            report=report,
        )
        await self._write((*records, end))
        st.end = end
        if self._observers:
            if step is not None:
                self._emit(StepAppended(self.run_id, step))
            self._emit(
                RunEnded(self.run_id, reason, end.stop_detail, end.steps_used, end.actions_executed)
            )
        return build_result(self.spec, st, self.context)

    # -- observers and the run's clock -------------------------------------------------------
    # The heartbeat renews the lease every third of its duration: a timer that starts a
    # renewal task only when one is due (a task per run that sleeps costs more than the run's
    # first steps).

    def _active(self) -> float:
        """Seconds the run has been active: earlier executions' plus this one's so far."""
        return self._active_base + (self.cfg.clock.monotonic() - self._active_t0)

    def _emit(self, event: Event) -> None:
        for observer in self._observers:
            try:
                observer(event)
            except Exception:
                log.exception("observer %r raised on %s; ignored", observer, type(event).__name__)


def build_result(spec: RunSpec, st: Replayed, context: Context | None) -> RunResult:
    """The :class:`RunResult` of an ended run."""
    end = st.end
    assert end is not None
    return RunResult(
        run_id=spec.run_id,
        stop_reason=end.stop_reason,
        stop_detail=end.stop_detail,
        final_answer=end.final_answer,
        steps=tuple(st.steps),
        steps_used=end.steps_used,
        actions_executed=end.actions_executed,
        started_at=spec.created_at,
        ended_at=end.ended_at,
        pending_action=end.pending_action,
        usage=st.usage,
        report=end.report,
        test_edits=tuple(st.ledger.test_edits),
        totals=end.totals if end.totals is not None else st.totals(st.active_s),
        messages=tuple(context.messages()) if context is not None else (),
        logprobs=tuple(st.logprobs),
    )
