"""One run, driven through the stop order of kernel.md §6, writing ahead as durability.md says.

Per step the journal receives, each durable before the next thing happens:
``model_intent`` (one per attempt, before the model is called) → ``model_attempt_failed`` /
``model_failure``, or ``model_result`` in one transaction with the first record that acts on the
reply: the ``action_intent`` (before the environment is called), or the step of an invalid
decision or final answer (written alone first when run-end guards will read the answer) →
``action_result`` + ``step`` in one transaction. A step that ends the run is written in one
transaction with the end record. So a tool step costs three commits, not four: the reply is
still durable before anything acts on it (interpreting it is reading, not acting), and a crash
before that commit is a model intent without result, which resume answers by calling the model
again (the lost attempt is marked ``uncertain`` in the accounts).

In-memory state is updated *before* each write: a write that fails ends this execution with an
exception (the state is thrown away, the journal is what resume reads), and a write that is
cancelled still lands (the Journal seam's promise), so memory and journal never disagree.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..seams import (
    Clock,
    Context,
    ContextBuilder,
    Environment,
    Interpreter,
    Journal,
    Model,
    ModelChain,
    model_name,
)
from ..types import (
    Action,
    ActionFinished,
    ActionIntent,
    ActionResult,
    ActionStarted,
    ActionStatus,
    Complete,
    EndRequest,
    EnvironmentFailure,
    ErrorInfo,
    EscalationReport,
    Event,
    Failure,
    FailureSeen,
    FinalAnswer,
    GuardContext,
    GuardVerdict,
    InvalidDecision,
    JournalError,
    Lease,
    LeaseLost,
    MalformedValue,
    ModelAttemptFailed,
    ModelCallError,
    ModelCallFinished,
    ModelCallStarted,
    ModelDelta,
    ModelFailure,
    ModelIntent,
    ModelReply,
    ModelRequest,
    ModelResult,
    Observer,
    Outcome,
    OutcomeUnknown,
    PendingAction,
    Record,
    ReplayPolicy,
    RetryPolicy,
    RunDetached,
    RunEnd,
    RunEnded,
    RunEndGuard,
    RunResult,
    RunSpec,
    RunStarted,
    Steer,
    StepAppended,
    StepRecord,
    StepWritten,
    StopReason,
    ToolContext,
    ToolSpec,
    Turn,
    clean_text,
)
from . import stopping
from .replay import Interrupted, Replayed
from .report import build_report
from .requests import pending_action, request_detail, requested_ending
from .steps import (
    action_step,
    final_answer_step,
    invalid_step,
    model_failure_step,
    observation_cut,
)
from .text import clean_action, clean_decision, clean_error, clean_outcome, clean_reply

__all__ = ["KernelConfig", "RunDriver", "new_id"]

log = logging.getLogger("polyloop")


def _late_end_write(run_id: str, write: asyncio.Future[None]) -> None:
    """How a ``cancelled`` end record that outlived its wait ended."""
    if write.cancelled():
        log.warning(
            "run %s: the wait for the late cancelled end record was cancelled; it may have "
            "landed (resume tells)",
            run_id,
        )
    elif (exc := write.exception()) is not None:
        log.warning(
            "run %s: the late cancelled end record failed (%r); the run stays resumable",
            run_id,
            exc,
        )
    else:
        log.info("run %s: the late cancelled end record landed", run_id)


def new_id() -> str:
    """A fresh globally unique id (run ids, intent ids, op ids): 128 random bits, as hex."""
    return os.urandom(16).hex()


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
    end_write_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class _StepCtx:
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


def _error_info(exc: BaseException) -> tuple[ErrorInfo, int]:
    """A model call's exception as journaled, its texts cleaned; the count replaced."""
    if isinstance(exc, ModelCallError):
        info = ErrorInfo(
            type(exc).__name__, str(exc.message), str(exc.kind), exc.retryable, exc.retry_after
        )
    else:
        info = ErrorInfo(type(exc).__name__, str(exc))
    return clean_error(info)


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _unknown_then(name: str) -> str:
    return f"Tool {name!r} was not registered when this action was decided, so it was not executed."


def _self_cancelled() -> Outcome:
    message = "the environment's call was cancelled from within (the run was not cancelled)"
    failure = Failure(error_type="CancelledError", message=message)
    text = f"CancelledError: {message}"
    return Outcome(ActionStatus.env_error, text, synthetic=True, failure=failure)


def _env_failed(exc: EnvironmentFailure | MalformedValue, method: str = "execute") -> Outcome:
    """The ``env_error`` outcome of an environment that failed (``EnvironmentFailure``) or
    broke its contract in ``method`` (``MalformedValue``: raised while it built its Outcome, or
    made by :func:`_not_an_outcome`): the error is the synthetic observation and the stop
    detail, so the step is written and the run ends ``env_error`` instead of crashing."""
    name = type(exc).__name__
    message = str(exc)
    if isinstance(exc, MalformedValue):
        message = f"the environment's {method}() broke its contract: {message}"
    failure = Failure(error_type=name, message=message)
    return Outcome(ActionStatus.env_error, f"{name}: {message}", synthetic=True, failure=failure)


def _not_an_outcome(value: object, *, none_ok: bool = False) -> MalformedValue:
    expected = "an Outcome or None" if none_ok else "an Outcome"
    return MalformedValue(f"it returned {type(value).__name__}, not {expected}")


def _not_awaitable(value: object, method: str) -> MalformedValue:
    """The error of an environment whose ``method`` is not async (the seam's methods are
    coroutines): it ran synchronously, so what it returned is kept in the message."""
    seen = f"{value.status}: {value.observation}" if isinstance(value, Outcome) else repr(value)
    return MalformedValue(
        f"{method}() must be async, but it returned {type(value).__name__} directly (it ran, "
        f"and the action may have happened); what it returned: {seen}"
    )


def _env_detail(outcome: Outcome) -> str:
    f = outcome.failure
    if f is not None and f.error_type:
        return f"{f.error_type}: {f.message or ''}"
    return outcome.observation


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
        # A request to end the run (Loop.stop / Loop.cancel): from the lease it was started
        # with, a renewal's, or this process's Loop directly (take_request).
        self.request: EndRequest | None = lease.request
        self._task: asyncio.Task[object] | None = None  # the task driving the run
        self._cancel_sent = False  # a cancel request cancelled _task
        self._closing = False  # past the point where a cancel request may cancel _task
        self._observers = cfg.observers
        self._ended = False
        # The action in flight, in its own task: from its start until its result is durable.
        self._action_task: asyncio.Future[Outcome] | None = None
        self._intent_written: _StepCtx | None = None
        self._beat: asyncio.TimerHandle | None = None
        self._renewal: asyncio.Future[None] | None = None
        # The models a step may ask, in order: a FallbackModel's, or the one model.
        model = cfg.model
        if isinstance(model, ModelChain):
            self._models: tuple[Model, ...] = tuple(model.models)
            self._fallback_on = frozenset(model.fallback_on)
        else:
            self._models = (model,)
            self._fallback_on = frozenset()
        self._model_names = tuple(model_name(m) for m in self._models)
        self._partial = False  # the attempt in flight has delivered a ModelDelta

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
        self._arm_heartbeat()
        try:
            st = self.state
            self._emit(RunStarted(self.run_id, self.spec.goal, self.resumed, len(st.steps)))
            if self.request is not None:  # stored before this execution took the run
                return await self._end_requested(interrupted)
            result = await self._continue(interrupted) if interrupted is not None else None
            while result is None:
                if stopping.requested(self.request) is not None:  # before A
                    return await self._end_requested(None)
                if self.detach_requested:
                    raise RunDetached(self.run_id, len(st.steps))
                result = await self._iteration()
            return result
        except asyncio.CancelledError:
            self._closing = True
            await self._on_cancel()
            task = self._task
            if self._cancel_sent and task is not None and task.uncancel() == 0:
                return self._requested_cancel()  # only the request cancelled it
            raise
        finally:
            self._closing = True
            self._stop_heartbeat()
            if not self._ended:
                try:
                    await self.cfg.journal.release(self.lease)
                except Exception:  # the lease will expire; nothing else to do
                    log.warning("run %s: could not release its lease", self.run_id, exc_info=True)

    async def _iteration(self) -> RunResult | None:
        st = self.state
        # A. Budget admission, at the start of the iteration.
        reason = stopping.admit(st.limits, len(st.steps), st.actions_executed)
        if reason is not None:
            return await self._end(reason)
        # B. Context size: no step, no intent.
        prompt_chars = self.context.prompt_chars
        reason = stopping.context_overflows(st.limits, prompt_chars)
        if reason is not None:
            return await self._end(reason)
        # C. Model call (retry inside).
        t0 = self.cfg.clock.monotonic()
        return await self._model_phase(len(st.steps), t0, prompt_chars, new_id(), 1, 0)

    async def _continue(self, it: Interrupted) -> RunResult | None:
        """Finish the step a crash interrupted, from where its records say it got."""
        t0 = self.cfg.clock.monotonic()
        prompt_chars = self.context.prompt_chars
        if it.failure is not None:  # model_failure without its step: no model call
            step = model_failure_step(it.step_idx, prompt_chars, 0.0, it.replaced)
            return await self._end(
                stopping.MODEL_FAILED, it.failure.error.detail(it.failure.attempt), step=step
            )
        if it.result is None:  # model intent without result: same intent id, next attempt
            return await self._model_phase(
                it.step_idx,
                t0,
                prompt_chars,
                it.intent_id,
                it.last_attempt + 1,
                it.failures,
                it.replaced,
                it.tier,
            )
        reply, call_id = it.result.reply, it.result.llm_call_id
        if it.action_intent is None:  # model result without step: re-interpret, no model call
            return await self._decide(
                it.step_idx, t0, prompt_chars, reply, call_id, replaced=it.replaced, model=it.model
            )
        sc = _StepCtx(
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
        if it.action_result is not None:  # result without step: build the step, never re-run
            return await self._settle(sc, it.action_result, durable=True)
        return await self._replay_action(sc)

    async def _replay_action(self, sc: _StepCtx) -> RunResult | None:
        """An action intent without a result: obey its replay policy."""
        intent = sc.intent
        policy = intent.replay_policy
        name = intent.action.tool_name
        if (
            name is not None
            and not intent.known_tool
            and policy is ReplayPolicy.idempotent
            and self.cfg.environment.replay_policy(intent.action) is not ReplayPolicy.idempotent
        ):
            # The environment did not know the tool when the action was decided (it gave an
            # unknown tool's policy, 'idempotent': doing it again only says not_executed), and
            # knows it now with another policy: it was never executed, and running it now would
            # be a step the run never had.
            refused = Outcome(ActionStatus.not_executed, _unknown_then(name), synthetic=True)
            return await self._settle(sc, self._result(sc, refused, 0.0))
        if intent.known_tool and name is not None and name not in self.tool_names:
            policy = ReplayPolicy.never  # known then, gone now: cannot be replayed
        if policy is ReplayPolicy.never:
            return await self._end_unknown(intent, policy)
        self._intent_written = sc  # from here a cancellation reports its outcome unknown
        if policy is ReplayPolicy.reconcile:
            ctx = ToolContext(self.run_id, intent.step_idx, intent.op_id)
            try:
                checked = self.cfg.environment.reconcile(intent.action, ctx)
                if not inspect.isawaitable(checked):
                    raise _not_awaitable(checked, "reconcile")
                outcome = await checked
            except OutcomeUnknown:
                return await self._end_unknown(intent, policy)
            except MalformedValue as exc:
                outcome = _env_failed(exc, "reconcile")
            if outcome is not None and not isinstance(outcome, Outcome):
                outcome = _env_failed(_not_an_outcome(outcome, none_ok=True), "reconcile")
            if outcome is not None:
                return await self._settle(sc, self._result(sc, outcome, 0.0))
        return await self._act(sc)

    # -- C: the model call --------------------------------------------------------------------
    async def _model_phase(
        self,
        step_idx: int,
        t0: float,
        prompt_chars: int,
        intent_id: str,
        attempt: int,
        failures: int,
        replaced: int = 0,
        tier: int = 0,
    ) -> RunResult | None:
        """C, from ``attempt`` on. ``failures``: failed attempts of this step so far, since it
        last fell back; ``replaced``: code points replaced in their errors (part of the step's
        count); ``tier``: which of the models the attempt asks (a FallbackModel's; a resumed
        run given fewer models asks its last)."""
        cfg = self.cfg
        clock = cfg.clock
        last = len(self._models) - 1
        while True:
            tier = min(tier, last)
            name = self._model_names[tier]
            await self._write((ModelIntent(step_idx, intent_id, attempt, name),))
            on_delta = None
            self._partial = False
            if self._observers:
                self._emit(ModelCallStarted(self.run_id, step_idx, intent_id, attempt))
                on_delta = functools.partial(self._delta, step_idx, intent_id, attempt)
            request = ModelRequest(
                self.run_id, step_idx, attempt, self.context.messages(), self.tool_specs, on_delta
            )
            t = clock.monotonic()
            try:
                reply = await self._models[tier].complete(request)
                if not isinstance(reply, ModelReply):
                    raise TypeError(f"the model returned {type(reply).__name__}, not ModelReply")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                latency = (clock.monotonic() - t) * 1000
                info, bad = _error_info(exc)
                replaced += bad
                failures += 1
                if self._observers:
                    self._emit(
                        ModelCallFinished(
                            self.run_id,
                            step_idx,
                            intent_id,
                            attempt,
                            None,
                            latency,
                            f"{info.type}: {info.message}",
                        )
                    )
                if info.retryable and cfg.retry.allows_retry(failures, info.retry_after):
                    await self._write(
                        (ModelAttemptFailed(step_idx, intent_id, attempt, info, latency, bad),)
                    )
                    await clock.sleep(
                        cfg.retry.backoff_s(failures, info.retry_after, random.random())
                    )
                    attempt += 1
                    continue
                # The next model's turn, unless this one's partial output was already shown:
                # then recovery stays with it (a fallback would change an answer in view).
                if tier < last and info.kind in self._fallback_on and not self._partial:
                    fell = ModelAttemptFailed(
                        step_idx, intent_id, attempt, info, latency, bad, fallback=True
                    )
                    await self._write((fell,))
                    tier += 1
                    failures = 0
                    attempt += 1
                    continue
                await self._write((ModelFailure(step_idx, intent_id, attempt, info, latency, bad),))
                wall = (clock.monotonic() - t0) * 1000
                step = model_failure_step(step_idx, prompt_chars, wall, replaced)
                return await self._end(stopping.MODEL_FAILED, info.detail(attempt), step=step)
            latency = (clock.monotonic() - t) * 1000
            reply, bad = clean_reply(reply)  # before anything records or reads it
            call_id = reply.call_id or intent_id
            st = self.state
            if reply.usage is not None:
                st.usage = reply.usage if st.usage is None else st.usage + reply.usage
            if self._observers:
                self._emit(
                    ModelCallFinished(
                        self.run_id, step_idx, intent_id, attempt, call_id, latency, None
                    )
                )
            # The result is written with the first record that acts on it (see _decide).
            result = ModelResult(step_idx, intent_id, attempt, call_id, reply, latency, bad)
            return await self._decide(
                step_idx, t0, prompt_chars, reply, call_id, result, replaced + bad, name
            )

    # -- D, E, F: interpret and act -----------------------------------------------------------
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
            verdicts, steer, in_feedback = await self._check_guards(step_idx, decision.text)
            wall = (clock.monotonic() - t0) * 1000
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
        sc = _StepCtx(
            step_idx, t0, prompt_chars, reply, call_id, intent, replaced + bad, False, model
        )
        self._intent_written = sc
        await self._write((*first, intent))
        return await self._act(sc)

    async def _check_guards(
        self, step_idx: int, answer: str
    ) -> tuple[tuple[Record, ...], GuardVerdict | None, int]:
        """Ask the run-end guards in order; the first steer wins. Guards at their own steer
        limit are skipped. Returns the verdict records (written with the step), the steer, and
        the code points replaced in its feedback."""
        st = self.state
        records: list[Record] = []
        for guard in self.cfg.guards:
            steers = st.steer_counts.get(guard.name, 0)
            if steers >= guard.max_steers:
                continue
            ctx = GuardContext(self.run_id, self.spec.goal, tuple(st.steps), answer, steers)
            verdict = guard.check(ctx)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if isinstance(verdict, Steer):
                feedback, bad = clean_text(verdict.feedback)
                record = GuardVerdict(step_idx, guard.name, True, feedback)
                st.steer_counts[guard.name] = steers + 1
                records.append(record)
                return tuple(records), record, bad
            if not isinstance(verdict, Complete):
                raise TypeError(
                    f"run-end guard {guard.name!r} returned {verdict!r}, not Complete or Steer"
                )
            records.append(GuardVerdict(step_idx, guard.name, False))
        return tuple(records), None, 0

    async def _act(self, sc: _StepCtx) -> RunResult | None:
        await self._keep_lease_margin()
        task = self._task
        if task is not None and task.cancelling():
            # A cancellation requested since the last await (by the caller, or a cancel
            # request) is delivered here, so the action never starts, whether or not the
            # journal's write of its intent awaited; a count left by a cancellation someone
            # caught earlier only costs this yield.
            await asyncio.sleep(0)
        intent = sc.intent
        ctx = ToolContext(self.run_id, intent.step_idx, intent.op_id)
        if self._observers:
            self._emit(
                ActionStarted(
                    self.run_id,
                    intent.step_idx,
                    intent.op_id,
                    intent.action.tool_name,
                    intent.action.text,
                )
            )
        t = self.cfg.clock.monotonic()
        # Its own task, from its first line (what a tool's asyncio.timeout or TaskGroup takes
        # as the current task must be the action's, never the run's), shielded: on the run's
        # cancellation the action may finish within the grace period.
        task = self._action_task = asyncio.ensure_future(self._execute(intent.action, ctx))
        # Wait for it without passing the run's cancellation on to it (as asyncio.shield).
        done = asyncio.get_running_loop().create_future()
        task.add_done_callback(functools.partial(_wake, done))
        await done
        # Cancelled, though nobody cancelled the run: the environment's call cancelled itself
        # (it awaited something another party cancelled). An environment failure.
        outcome = _self_cancelled() if task.cancelled() else task.result()
        latency = (self.cfg.clock.monotonic() - t) * 1000
        return await self._settle(sc, self._result(sc, outcome, latency))

    async def _execute(self, action: Action, ctx: ToolContext) -> Outcome:
        try:
            pending = self.cfg.environment.execute(action, ctx)
            if not inspect.isawaitable(pending):  # a synchronous execute: it already ran
                raise _not_awaitable(pending, "execute")
            outcome = await pending
        except (EnvironmentFailure, MalformedValue) as exc:
            return _env_failed(exc)
        if not isinstance(outcome, Outcome):
            return _env_failed(_not_an_outcome(outcome))
        return outcome

    # -- G: settle the action -----------------------------------------------------------------
    def _result(self, sc: _StepCtx, outcome: Outcome, latency_ms: float) -> ActionResult:
        """The result record of the outcome the environment gave, its text cleaned first."""
        outcome, bad = clean_outcome(outcome)
        return ActionResult(sc.step_idx, sc.intent.op_id, outcome, latency_ms, bad)

    def _action_step(self, sc: _StepCtx, result: ActionResult) -> tuple[StepRecord, int]:
        """The step of an action whose outcome arrived (counting it if executed), and
        PolyLoop's cut of its observation."""
        st = self.state
        outcome = result.outcome
        if outcome.status is ActionStatus.executed:
            st.actions_executed += 1
        cut = observation_cut(outcome.observation, st.limits.max_observation_chars)
        wall = (self.cfg.clock.monotonic() - sc.t0) * 1000
        i = sc.intent
        step = action_step(
            sc.step_idx, sc.reply, sc.llm_call_id, i.action, i.args_json, outcome, cut,
            sc.prompt_chars, wall, sc.replaced + result.replaced_chars, sc.model,
        )  # fmt: skip
        return step, cut

    async def _settle(
        self, sc: _StepCtx, result: ActionResult, *, durable: bool = False
    ) -> RunResult | None:
        """G for the action of ``sc`` and its ``result`` (made by :meth:`_result`, or read
        from the journal: ``durable``, then it is not written again)."""
        st = self.state
        intent = sc.intent
        outcome, latency_ms = result.outcome, result.latency_ms
        step, cut = self._action_step(sc, result)
        records: tuple[Record, ...] = () if durable else (result,)
        if self._observers:
            self._emit(
                ActionFinished(
                    self.run_id,
                    sc.step_idx,
                    intent.op_id,
                    intent.action.tool_name,
                    outcome.status,
                    latency_ms,
                )
            )
        reason = stopping.after_action(outcome)
        report = None
        if reason is None and outcome.failure is not None and st.limits.same_failure_limit:
            seen = FailureSeen(
                sc.step_idx, outcome.failure.fingerprint(), outcome.failure, intent.action.text
            )
            records = (*records, seen)
            reason = stopping.failure_repeated(st.limits, st.note_failure(seen))
            if reason is not None:
                report = build_report(
                    self.run_id, (*st.steps, step), st.ledger, st.limits.same_failure_limit
                )
        if reason is not None:
            detail = _env_detail(outcome) if reason is StopReason.env_error else None
            return await self._end(
                reason,
                detail,
                records=records,
                step=step,
                reply=sc.reply,
                cut=cut,
                report=report,
            )
        await self._append_step(records, step, sc.reply, cut)
        return None

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

    def _add_to_context(self, step: StepRecord, reply: ModelReply | None, cut: int) -> None:
        st = self.state
        st.steps.append(step)
        self.context.add_step(Turn(step, reply, cut, len(st.steps), st.actions_executed, st.limits))

    async def _append_step(
        self, records: tuple[Record, ...], step: StepRecord, reply: ModelReply, cut: int
    ) -> None:
        self._add_to_context(step, reply, cut)
        await self._write((*records, StepWritten(step)))
        if self._observers:
            self._emit(StepAppended(self.run_id, step))

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
            self._add_to_context(step, reply, cut)
            records = (*records, StepWritten(step))
        end = RunEnd(
            reason,
            detail,
            final_answer,
            len(st.steps),
            st.actions_executed,
            self.cfg.clock.time(),
            pending,
            report,
        )
        await self._write((*records, end))
        st.end = end
        if self._observers:
            if step is not None:
                self._emit(StepAppended(self.run_id, step))
            self._emit(RunEnded(self.run_id, reason, detail, end.steps_used, end.actions_executed))
        return build_result(self.spec, st, self.context)

    async def _end_unknown(self, intent: ActionIntent, policy: ReplayPolicy) -> RunResult:
        pending = pending_action(intent, policy)
        return await self._end(StopReason.resume_state_unknown, pending.describe(), pending=pending)

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

    # -- cancellation -------------------------------------------------------------------------
    async def _on_cancel(self) -> None:
        """Write the ``cancelled`` end record (once), after giving an in-flight action up to
        ``cancel_grace_s`` to finish. Waits at most ``end_write_timeout_s`` for that write;
        past it, cancellation proceeds and the write may still land on its own (a journal
        finishes a write it started); if it never does, the run stays resumable."""
        if self._ended:
            return
        task = self._action_task
        if task is not None and task.done() and not task.cancelled():
            exc = task.exception()
            if exc is not None and not isinstance(exc, Exception):
                # The action raised KeyboardInterrupt or SystemExit: asyncio let it out of the
                # event loop, whose shutdown cancels this run. Nobody cancelled the run itself:
                # no end record, it stays resumable (as for any exception escaping a run).
                log.warning("run %s: its action raised %r; no end record", self.run_id, exc)
                return
        st = self.state
        records: tuple[Record, ...] = ()
        detail: str | None = None
        sc = self._intent_written
        if sc is not None:
            outcome = await self._grace()
            intent = sc.intent
            if outcome is not None:
                result = self._result(sc, outcome, 0.0)
                step, cut = self._action_step(sc, result)
                self._add_to_context(step, sc.reply, cut)
                records = (result, StepWritten(step))
            else:
                started = self._action_task is not None or sc.resumed  # it may have run
                pending = pending_action(intent, intent.replay_policy)
                detail = (
                    f"in-flight action {pending.describe()}: outcome unknown"
                    if started
                    else f"action {pending.describe()}: cancelled before it started"
                )
        if self._cancel_sent:  # a cancel request's reason comes first
            detail = request_detail(self.request, detail)
        end = RunEnd(
            StopReason.cancelled,
            detail,
            None,
            len(st.steps),
            st.actions_executed,
            self.cfg.clock.time(),
        )
        write = asyncio.ensure_future(self.cfg.journal.append(self.lease, (*records, end)))
        try:
            done, _ = await asyncio.wait({write}, timeout=self.cfg.end_write_timeout_s)
        except asyncio.CancelledError:
            done = {write} if write.done() else set()
        if not done or write.cancelled() or write.exception() is not None:
            exc = None if not done or write.cancelled() else write.exception()
            log.warning(
                "run %s: the cancelled end record was not durable in time (%r); it may still "
                "land (the journal finishes a started write), else the run stays resumable",
                self.run_id,
                exc,
            )
            if not done:  # say how the write ends, and retrieve its error
                write.add_done_callback(functools.partial(_late_end_write, self.run_id))
            return
        self._ended = True
        st.end = end
        self._emit(
            RunEnded(
                self.run_id, StopReason.cancelled, detail, end.steps_used, end.actions_executed
            )
        )

    async def _grace(self) -> Outcome | None:
        task = self._action_task
        if task is None:
            return None
        if not task.done():
            with contextlib.suppress(asyncio.CancelledError):  # cancelled again: stop waiting
                await asyncio.wait({task}, timeout=self.cfg.cancel_grace_s)
        if not task.done():
            task.cancel()
            return None
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    # -- leases and observers -----------------------------------------------------------------
    # The heartbeat renews the lease every third of its duration: a timer that starts a
    # renewal task only when one is due (a task per run that sleeps costs more than the run's
    # first steps).
    def _arm_heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        self._beat = loop.call_later(self.cfg.lease_ttl_s / 3, self._heartbeat_due)

    def _heartbeat_due(self) -> None:
        self._beat = None
        self._renewal = asyncio.ensure_future(self._heartbeat())

    def _stop_heartbeat(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None

    async def _heartbeat(self) -> None:
        ttl = self.cfg.lease_ttl_s
        try:
            self.lease = await self.cfg.journal.renew(self.lease, ttl_s=ttl)
            if self.lease.request is not None:  # how a request from elsewhere arrives
                self.take_request(self.lease.request)
        except LeaseLost:
            if not self._ended:  # an end record releases the lease: nothing was lost
                log.error("run %s lost its lease; its next write is refused", self.run_id)
            return
        except Exception:
            log.warning("run %s: lease renewal failed", self.run_id, exc_info=True)
        if self._renewal is asyncio.current_task():  # not stopped meanwhile
            self._renewal = None
            self._arm_heartbeat()

    async def _keep_lease_margin(self) -> None:
        """No action starts with less than a third of the lease left."""
        ttl = self.cfg.lease_ttl_s
        if self.lease.expires_at - time.time() < ttl / 3:
            self.lease = await self.cfg.journal.renew(self.lease, ttl_s=ttl)
            if self.lease.request is not None:
                self.take_request(self.lease.request)

    def _delta(self, step_idx: int, intent_id: str, attempt: int, kind: str, text: str) -> None:
        """A streaming adapter's ``on_delta``: one ModelDelta event."""
        self._partial = True
        self._emit(ModelDelta(self.run_id, step_idx, intent_id, attempt, kind, text))

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
        messages=tuple(context.messages()) if context is not None else (),
    )
