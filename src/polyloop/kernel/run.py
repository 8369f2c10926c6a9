"""One run, driven through the stop order of kernel.md §6, writing ahead as durability.md says.

Per step the journal receives, each durable before the next thing happens:
``model_intent`` (one per attempt, before the model is called) → ``model_attempt_failed`` /
``model_failure``, or ``model_result`` in one transaction with the first record that acts on the
reply: the ``action_intent`` (before the environment is called), or the step of an invalid
decision or final answer (written alone first when run-end guards will read the answer) →
``action_result`` + ``step`` in one transaction. A step that ends the run is written in one
transaction with the end record; a step that does not is written in one transaction with the
next step's first ``model_intent`` whenever nothing stands between them (no request to end or
detach the run, A and B passed, no observers that could detach it: ``_next_intent``). So a
tool step costs two commits, not four: the reply is still durable before anything acts on it
(interpreting it is reading, not acting), the intent is still durable before the model is
called, and a crash before that commit is a model intent without result, which resume
answers by calling the model again (the lost attempt is marked ``uncertain`` in the
accounts).

In-memory state is updated *before* each write: a write that fails ends this execution with an
exception (the state is thrown away, the journal is what resume reads), and a write that is
cancelled still lands (the Journal seam's promise), so memory and journal never disagree.

The rules live in one module each, named for them: this one drives the loop (A, B, D, E and
the writes); :mod:`.stopping` decides every stop reason; :mod:`.model_call` is C (retries,
fallback, streaming, cost); :mod:`.acting` is F and G (the action, replay policies on resume);
:mod:`.guarding` E's run-end guards and the hand-over report; :mod:`.wrap_up` the graceful
last answer; :mod:`.liveness` cancellation, leases and heartbeats; :mod:`.requests` requests
to end the run made elsewhere; :mod:`.replay` rebuilds a run from its records;
:mod:`.steps` builds the step records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

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
    model_name,
)
from ..types import (
    DEFAULT_TEMPLATES,
    Action,
    ActionIntent,
    ActionResult,
    EndRequest,
    Escalation,
    EscalationReport,
    Event,
    FinalAnswer,
    InvalidDecision,
    JournalError,
    Lease,
    ModelIntent,
    ModelReply,
    ModelResult,
    Observer,
    Outcome,
    OutcomeUnknown,
    PendingAction,
    Record,
    ReplayPolicy,
    ReportHook,
    RetryPolicy,
    RunDetached,
    RunEnd,
    RunEnded,
    RunEndGuard,
    RunResult,
    RunSpec,
    RunStarted,
    StepAppended,
    StepRecord,
    StepWritten,
    StopReason,
    ToolSpec,
    fast_init,
)
from . import acting, approving, guarding, liveness, stopping
from . import model_call as calling
from . import wrap_up as wrapping
from .ids import new_id
from .replay import Interrupted, Replayed
from .requests import requested_ending
from .steps import (
    final_answer_step,
    invalid_step,
    model_failure_step,
)
from .text import clean_action, clean_decision, clean_escalation

__all__ = ["KernelConfig", "RunDriver", "new_id"]

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
    # Derived once here, not per run (checking a runtime Protocol costs more than a short
    # run's first step): the models a step may ask, in order (a FallbackModel's, or the one
    # model), the failure kinds that move to the next one, and the environment's
    # NeedsApproval method (None: no action ever needs approval).
    models: tuple[Model, ...] = field(init=False)
    fallback_on: frozenset[str] = field(init=False)
    needs_approval: Callable[[Action], bool] | None = field(init=False)

    def __post_init__(self) -> None:
        model = self.model
        if isinstance(model, ModelChain):
            models: tuple[Model, ...] = tuple(model.models)
            fallback_on = frozenset(model.fallback_on)
        else:
            models, fallback_on = (model,), frozenset()
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "fallback_on", fallback_on)
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


def tool_names(specs: Sequence[ToolSpec]) -> frozenset[str]:
    """Names of the tools in OpenAI-format specs."""
    names = set()
    for spec in specs:
        fn = spec.get("function")
        name = fn.get("name") if isinstance(fn, dict) else spec.get("name")
        if isinstance(name, str):
            names.add(name)
    return frozenset(names)


class RunDriver:
    """Advances one run until it ends, is detached, is cancelled, or an exception escapes."""

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
        self._task: asyncio.Task[object] | None = None  # the task driving the run
        self._cancel_sent = False  # a cancel request cancelled _task
        self._closing = False  # past the point where a cancel request may cancel _task
        self._beat: asyncio.TimerHandle | None = None
        self._renewal: asyncio.Future[None] | None = None
        self._models = cfg.models
        self._fallback_on = cfg.fallback_on
        self._model_names = tuple(model_name(m) for m in self._models)
        self._pricing = tuple(calling.pricing_of(m) for m in self._models)
        # Active time: what earlier executions journaled, plus this one's since it began.
        self._active_base = state.active_s
        self._active_t0 = cfg.clock.monotonic()
        self._partial = False  # the attempt in flight has delivered a ModelDelta
        # The next step's first model intent, written with the step before it (see
        # _next_intent): the intent, the step's start and its prompt size.
        self._begun: tuple[ModelIntent, float, int] | None = None

    # -- the loop -----------------------------------------------------------------------------
    async def drive(self, interrupted: Interrupted | None) -> RunResult:
        """Run to the end. Raises ``RunDetached`` after a detach, re-raises cancellation after
        writing the ``cancelled`` end record, and lets any other exception propagate with no
        end record (the run stays resumable). The lease is released on every way out.

        A cancel request (:meth:`take_request`) cancels the task driving the run: the run
        ends ``cancelled`` as on any cancellation, but nobody cancelled the caller, so its
        cancellation is taken back (``Task.uncancel``) and the result is returned; if the
        caller was cancelled too, ``CancelledError`` propagates as usual."""
        self._task = asyncio.current_task()
        liveness.arm_heartbeat(self)
        try:
            st = self.state
            self._emit(RunStarted(self.run_id, self.spec.goal, self.resumed, len(st.steps)))
            if self.request is not None:  # stored before this execution took the run
                return await self._end_requested(interrupted)
            result = await self._continue(interrupted) if interrupted is not None else None
            while result is None:
                if self._begun is None:  # else the next step has begun: its intent is durable
                    if stopping.requested(self.request) is not None:  # before A
                        return await self._end_requested(None)
                    if self.detach_requested:
                        raise RunDetached(self.run_id, len(st.steps))
                result = await self._iteration()
            return result
        except asyncio.CancelledError:
            self._closing = True
            await liveness.on_cancel(self)
            task = self._task
            if self._cancel_sent and task is not None and task.uncancel() == 0:
                return self._requested_cancel()  # only the request cancelled it
            raise
        finally:
            self._closing = True
            liveness.stop_heartbeat(self)
            if not self._ended:
                try:
                    await self.cfg.journal.release(self.lease)
                except Exception:  # the lease will expire; nothing else to do
                    log.warning("run %s: could not release its lease", self.run_id, exc_info=True)

    async def _iteration(self) -> RunResult | None:
        begun = self._begun
        if begun is not None:  # A and B were passed as the last step was written, with C's intent
            self._begun = None
            intent, t0, prompt_chars = begun
            return await calling.model_phase(
                self, intent.step_idx, t0, prompt_chars, intent.intent_id, 1, 0, written=True
            )
        st = self.state
        # A. Budget admission, at the start of the iteration.
        reason = self._admitted()
        if reason is not None:
            if self.cfg.wrap_up:
                return await wrapping.begin(self, reason)
            return await self._end(reason)
        # B. Context size: no step, no intent.
        prompt_chars = self.context.prompt_chars
        reason = stopping.context_overflows(st.limits, prompt_chars)
        if reason is not None:
            return await self._end(reason)
        # C. Model call (retry inside).
        t0 = self.cfg.clock.monotonic()
        return await calling.model_phase(self, len(st.steps), t0, prompt_chars, new_id(), 1, 0)

    async def _continue(self, it: Interrupted) -> RunResult | None:
        """Finish the step a crash interrupted, from where its records say it got."""
        t0 = self.cfg.clock.monotonic()
        prompt_chars = self.context.prompt_chars
        if it.wrap_up is not None:  # a wrap-up call: finish it as it began
            return await wrapping.resume(self, it, t0)
        if it.failure is not None:  # model_failure without its step: no model call
            step = model_failure_step(it.step_idx, prompt_chars, 0.0, it.replaced)
            return await self._end(
                stopping.MODEL_FAILED, it.failure.error.detail(it.failure.attempt), step=step
            )
        if it.result is None:  # model intent without result: same intent id, next attempt
            return await self._call_again(it, t0, prompt_chars)
        reply, call_id = it.result.reply, it.result.llm_call_id
        if it.action_intent is None:  # model result without step: re-interpret, no model call
            return await self._decide(
                it.step_idx, t0, prompt_chars, reply, call_id, replaced=it.replaced, model=it.model
            )
        sc = StepCtx(
            it.step_idx,
            t0,
            prompt_chars,
            reply,
            call_id,
            it.action_intent,
            it.replaced,
            True,
            it.model,
        )
        if it.unknown_reports:  # live executions reported their outcome unknown
            sc = replace(sc, unknown_reports=it.unknown_reports, outcome_unknown=it.unknown_path)
        if it.action_result is not None:  # result without step: build the step, never re-run
            return await acting.settle(self, sc, it.action_result, durable=True)
        if it.approval is not None:  # it awaited a person's decision
            return await approving.resume(self, sc, it)
        return await acting.replay_action(self, sc)

    async def _call_again(
        self,
        it: Interrupted,
        t0: float,
        prompt_chars: int,
        wrap_up: StopReason | None = None,
    ) -> RunResult | None:
        """C again for a step whose model intent has no result: the same intent id, the next
        attempt, the failures and fallbacks so far."""
        return await calling.model_phase(
            self,
            it.step_idx,
            t0,
            prompt_chars,
            it.intent_id,
            it.last_attempt + 1,
            it.failures,
            it.replaced,
            it.tier,
            wrap_up,
            shown=it.shown,
        )

    # -- D, E, F: interpret (the action itself: .acting) --------------------------------------
    async def _decide(
        self,
        step_idx: int,
        t0: float,
        prompt_chars: int,
        reply: ModelReply,
        call_id: str,
        result: ModelResult | None = None,
        replaced: int = 0,
        model: str | None = None,
    ) -> RunResult | None:
        """D, E, F. ``result``: the model result not yet written; it goes into the journal in
        the same transaction as the first record that acts on the reply (the action intent,
        the step, or the end), so it is durable before anything acts on it at one commit
        fewer per step. Run-end guards may take long, so before they run it is written alone;
        if interpreting the reply fails, it is written before the error propagates.
        ``replaced``: code points replaced in this step so far (the reply's, the errors of its
        failed attempts); the decision's are added to it."""
        st = self.state
        clock = self.cfg.clock
        first: tuple[Record, ...] = () if result is None else (result,)
        args_json: str | None = None
        try:
            decision = self.cfg.interpreter.interpret(reply, self.tool_specs)
            # Cleaned before anything reads it: decoding JSON in the reply (a "\ud800" escape)
            # can make text that is not valid Unicode out of valid text.
            if isinstance(decision, Action):
                decision, args_json, bad = clean_action(decision)
                policy = self.cfg.environment.replay_policy(decision)
                if type(policy) is not ReplayPolicy:  # a str from a custom environment
                    policy = ReplayPolicy(policy)
            elif isinstance(decision, InvalidDecision | FinalAnswer):
                decision, bad = clean_decision(decision)
            else:
                raise TypeError(f"the interpreter returned {decision!r}, not a Decision")
        except Exception:
            if first:
                await self._write(first)
            raise
        if isinstance(decision, InvalidDecision):  # D: skips the completion check
            st.consecutive_invalid += 1
            wall = (clock.monotonic() - t0) * 1000
            step = invalid_step(
                step_idx, reply, call_id, decision.feedback, prompt_chars, wall, replaced + bad,
                model,
            )  # fmt: skip
            reason = stopping.after_invalid(st.limits, st.consecutive_invalid)
            if reason is not None:
                return await self._end(reason, records=first, step=step, reply=reply)
            await self._append_step(first, step, reply, 0)
            return None
        st.consecutive_invalid = 0  # any valid decision resets the counter
        if isinstance(decision, FinalAnswer):  # E: run-end guards may steer
            if first and self.cfg.guards:
                await self._write(first)
                first = ()
            verdicts, steer, in_feedback = await guarding.check(self, step_idx, decision.text)
            wall = (clock.monotonic() - t0) * 1000
            if isinstance(steer, Escalation):  # a guard handed the run to a person
                escalation, _ = clean_escalation(steer)
                step = final_answer_step(
                    step_idx, reply, call_id, prompt_chars, wall, None, replaced + bad, model
                )
                report = guarding.handover_report(self, (*st.steps, step), escalation)
                return await self._end(
                    stopping.HANDED_OVER,
                    escalation.describe(),
                    records=(*first, *verdicts),
                    step=step,
                    reply=reply,
                    report=report,
                )
            if steer is not None:
                step = final_answer_step(
                    step_idx, reply, call_id, prompt_chars, wall, steer.feedback,
                    replaced + bad + in_feedback, model,
                )  # fmt: skip
                await self._append_step((*first, *verdicts), step, reply, 0)
                return None
            step = final_answer_step(
                step_idx, reply, call_id, prompt_chars, wall, None, replaced + bad, model
            )
            return await self._end(
                stopping.FINAL_ANSWER,
                final_answer=decision.text,
                records=(*first, *verdicts),
                step=step,
                reply=reply,
            )
        # F: write the action intent (with the model result), then execute.
        action = decision
        known = action.tool_name is None or action.tool_name in self.tool_names
        intent = ActionIntent(step_idx, new_id(), action, args_json, policy, known, bad)
        sc = StepCtx(
            step_idx, t0, prompt_chars, reply, call_id, intent, replaced + bad, False, model
        )
        if self._needs_approval is not None and self._needs_approval(action):
            return await approving.park(self, sc, first)  # raises ApprovalRequired
        self._intent_written = sc
        await self._write((*first, intent))
        return await acting.act(self, sc)

    # -- requests to end the run --------------------------------------------------------------
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

    async def _end_requested(self, interrupted: Interrupted | None) -> RunResult:
        """End the run as its request asks, with nothing in flight here (at a step boundary,
        or where a crash left it: an action intent without result is named, its outcome
        unknown)."""
        assert self.request is not None
        reason, detail, pending = requested_ending(self.request, interrupted)
        return await self._end(reason, detail, pending=pending)

    def _requested_cancel(self) -> RunResult:
        """The result of a run a cancel request cancelled (the caller was not cancelled)."""
        if self.state.end is None:
            raise JournalError(
                f"run {self.run_id!r}: cancelled on request, but its cancelled end record was "
                "not durable in time; the run stays resumable and its request stored (a resume "
                "ends it cancelled)"
            )
        return build_result(self.spec, self.state, self.context)

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
        self, records: tuple[Record, ...], step: StepRecord, reply: ModelReply, cut: int
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
        end = RunEnd(
            reason,
            detail,
            final_answer,
            len(st.steps),
            st.actions_executed,
            self.cfg.clock.time(),
            pending,
            report,
            st.totals(self._active()),
        )
        await self._write((*records, end))
        st.end = end
        if self._observers:
            if step is not None:
                self._emit(StepAppended(self.run_id, step))
            self._emit(RunEnded(self.run_id, reason, detail, end.steps_used, end.actions_executed))
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
    )
