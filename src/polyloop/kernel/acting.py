"""F and G of the stop order (kernel.md §6): the action — its intent durable, the environment
called (or, on resume, the replay policy obeyed), the outcome journaled with its step, then the
completion check and the failure guard (:mod:`.stopping` decides)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import logging
import random

from ..types import (
    Action,
    ActionFinished,
    ActionIntent,
    ActionResult,
    ActionStarted,
    ActionStatus,
    ActionUnknown,
    EnvironmentFailure,
    Escalate,
    Escalation,
    Failure,
    MalformedValue,
    Outcome,
    OutcomeUnknown,
    Record,
    ReplayPolicy,
    RunResult,
    StepRecord,
    StopReason,
    ToolContext,
)
from . import deadline, eager, guarding, liveness, stopping
from .driver import Driver, StepCtx
from .report import build_report
from .requests import pending_action
from .steps import (
    action_step,
    observation_cut,
)
from .text import clean_outcome

__all__ = [
    "NOT_KNOWN",
    "NOT_RUN",
    "act",
    "as_policy",
    "end_unknown",
    "env_detail",
    "env_failed",
    "env_raised",
    "execute",
    "handed_over",
    "not_an_outcome",
    "not_awaitable",
    "not_started",
    "reconciled",
    "replay_action",
    "result_record",
    "self_cancelled",
    "settle",
    "step_record",
    "unknown_reported",
    "unknown_then",
    "wake",
]

log = logging.getLogger("polyloop")


def wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


def unknown_then(name: str) -> str:
    return f"Tool {name!r} was not registered when this action was decided, so it was not executed."


def self_cancelled() -> Outcome:
    message = "the environment's call was cancelled from within (the run was not cancelled)"
    failure = Failure(error_type="CancelledError", message=message)
    text = f"CancelledError: {message}"
    return Outcome(ActionStatus.env_error, text, synthetic=True, failure=failure)


NOT_RUN = "; the action was not executed"
"""What :func:`env_failed` adds for a method that failed before the action started."""
NOT_KNOWN = "; whether the action happened is not known"
"""What :func:`env_failed` adds for ``reconcile``: the action's outcome is still unknown."""


def env_failed(exc: Exception, method: str = "execute", then: str = "") -> Outcome:
    """The ``env_error`` outcome of an environment that failed (``EnvironmentFailure``),
    broke its contract in ``method`` (``MalformedValue``: raised while it built its Outcome, or
    made by :func:`not_an_outcome`), or raised any other exception (:func:`env_raised`): the
    error, ``<ErrorClass>: <message>`` (naming ``method`` when it is not ``execute``) with
    ``then`` added, is the synthetic observation and the stop detail, so the step is written
    and the run ends ``env_error`` instead of crashing."""
    name = type(exc).__name__
    message = str(exc) or "(no message)"
    if isinstance(exc, MalformedValue):
        message = f"the environment's {method}() broke its contract: {message}"
    elif method != "execute":
        message = f"{message} (raised by the environment's {method}())"
    message += then
    failure = Failure(error_type=name, message=message)
    return Outcome(ActionStatus.env_error, f"{name}: {message}", synthetic=True, failure=failure)


def env_raised(d: Driver, exc: Exception, method: str, then: str = "") -> Outcome:
    """The ``env_error`` outcome of an environment whose ``method`` raised ``exc`` (design
    0004, 决策三 F: the step is recorded whatever the environment does): :func:`env_failed`'s,
    with the traceback of an exception the seam does not name (a bug) in the log. Only
    ``Exception``: cancellation, ``KeyboardInterrupt`` and ``SystemExit`` propagate."""
    if not isinstance(exc, EnvironmentFailure | MalformedValue):
        log.error(
            "run %s: the environment's %s() raised %s; the step is recorded env_error",
            d.run_id,
            method,
            type(exc).__name__,
            exc_info=exc,
        )
    return env_failed(exc, method, then)


def as_policy(value: object) -> ReplayPolicy:
    """A replay policy a custom environment gave as a str.

    Raises:
        MalformedValue: it is not one of the policies' names.
    """
    try:
        return ReplayPolicy(value)  # type: ignore[arg-type]
    except ValueError:
        raise MalformedValue(f"it returned {value!r}, not a ReplayPolicy") from None


def not_an_outcome(value: object, *, none_ok: bool = False) -> MalformedValue:
    expected = "an Outcome or None" if none_ok else "an Outcome"
    return MalformedValue(f"it returned {type(value).__name__}, not {expected}")


def not_awaitable(value: object, method: str) -> MalformedValue:
    """The error of an environment whose ``method`` is not async (the seam's methods are
    coroutines): it ran synchronously, so what it returned is kept in the message."""
    seen = f"{value.status}: {value.observation}" if isinstance(value, Outcome) else repr(value)
    return MalformedValue(
        f"{method}() must be async, but it returned {type(value).__name__} directly (it ran, "
        f"and the action may have happened); what it returned: {seen}"
    )


def handed_over(exc: Escalate) -> Outcome:
    """The outcome of an action whose environment raised ``Escalate``: it ran (its effects
    may have happened), and the run is handed to a person."""
    text = f"Escalate: {exc.reason}"
    escalation = Escalation(exc.reason, exc.evidence)
    return Outcome(ActionStatus.executed, text, synthetic=True, escalation=escalation)


def env_detail(outcome: Outcome) -> str:
    f = outcome.failure
    if f is not None and f.error_type:
        return f"{f.error_type}: {f.message or ''}"
    return outcome.observation


async def replay_action(d: Driver, sc: StepCtx) -> RunResult | None:
    """An action intent without a result: obey its replay policy."""
    intent = sc.intent
    policy = intent.replay_policy
    name = intent.action.tool_name
    if name is not None and not intent.known_tool and policy is ReplayPolicy.idempotent:
        try:
            now = d.cfg.environment.replay_policy(intent.action)
        except Exception as exc:  # as at decision time: env_error, nothing runs
            failed = env_raised(d, exc, "replay_policy", NOT_RUN)
            return await settle(d, sc, result_record(d, sc, failed, 0.0))
        if now is not ReplayPolicy.idempotent:
            # The environment did not know the tool when the action was decided (it gave an
            # unknown tool's policy, 'idempotent': doing it again only says not_executed),
            # and knows it now with another policy: it was never executed, and running it
            # now would be a step the run never had.
            refused = Outcome(ActionStatus.not_executed, unknown_then(name), synthetic=True)
            return await settle(d, sc, result_record(d, sc, refused, 0.0))
    if intent.known_tool and name is not None and name not in d.tool_names:
        policy = ReplayPolicy.never  # known then, gone now: cannot be replayed
    if policy is ReplayPolicy.never:
        return await end_unknown(d, intent, policy)
    d._intent_written = sc  # from here a cancellation reports its outcome unknown
    if policy is ReplayPolicy.reconcile:
        try:
            outcome = await reconciled(d, sc)
        except OutcomeUnknown:
            return await end_unknown(d, intent, policy)
        if outcome is not None:
            return await settle(d, sc, result_record(d, sc, outcome, 0.0))
    elif sc.unknown_reports >= d.cfg.retry.max_attempts:
        # Live executions reported the outcome unknown as often as the retry policy allows
        # (a resume under a smaller ``max_attempts``): not executed once more.
        return await end_unknown(d, intent, policy, _executions(d, sc.unknown_reports))
    return await act(d, sc)


async def reconciled(d: Driver, sc: StepCtx) -> Outcome | None:
    """The environment's answer whether the action of ``sc`` happened: its Outcome (an
    ``env_error`` one when the hook broke its contract) or None (it did not).

    Raises:
        OutcomeUnknown: the environment cannot tell.
    """
    intent = sc.intent
    ctx = ToolContext(d.run_id, intent.step_idx, intent.op_id, sc.approved_by)
    try:
        checked = d.cfg.environment.reconcile(intent.action, ctx)
        if not inspect.isawaitable(checked):
            raise not_awaitable(checked, "reconcile")
        outcome = await checked
    except MalformedValue as exc:
        return env_failed(exc, "reconcile")
    except OutcomeUnknown:
        raise
    except Exception as exc:  # it failed, or has a bug: whether the action happened is unknown
        return env_raised(d, exc, "reconcile", NOT_KNOWN)
    if outcome is not None and not isinstance(outcome, Outcome):
        return env_failed(not_an_outcome(outcome, none_ok=True), "reconcile")
    return outcome


async def act(d: Driver, sc: StepCtx) -> RunResult | None:
    await liveness.keep_lease_margin(d)
    task = d._task
    if task is not None and task.cancelling():
        # A cancellation requested since the last await (by the caller, or a cancel
        # request) is delivered here, so the action never starts, whether or not the
        # journal's write of its intent awaited; a count left by a cancellation someone
        # caught earlier only costs this yield.
        await asyncio.sleep(0)
    intent = sc.intent
    end = d.state.limits.max_seconds
    budget = None if end is None else deadline.cap(d, end)
    ctx = ToolContext(d.run_id, intent.step_idx, intent.op_id, sc.approved_by, budget)
    if d._observers:
        d._emit(
            ActionStarted(
                d.run_id,
                intent.step_idx,
                intent.op_id,
                intent.action.tool_name,
                intent.action.text,
            )
        )
    t = d.cfg.clock.monotonic()
    # Its own task, from its first line (what a tool's asyncio.timeout or TaskGroup takes
    # as the current task must be the action's, never the run's), shielded: on the run's
    # cancellation the action may finish within the grace period. Started eagerly: a tool
    # that never suspends has finished when start returns (no turn of the event loop).
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    task = d._action_task = eager.start(loop, execute(d, intent.action, ctx, done))
    if not task.done():
        # Wait for it without passing the run's cancellation on to it (as asyncio.shield).
        # The task wakes the run itself as its last line (one turn of the event loop fewer
        # than a done callback); the callback covers a task cancelled before its first line.
        task.add_done_callback(functools.partial(wake, done))
        await done
    # Cancelled, though nobody cancelled the run: the environment's call cancelled itself
    # (it awaited something another party cancelled). An environment failure.
    outcome = self_cancelled() if task.cancelled() else task.result()
    if isinstance(outcome, OutcomeUnknown):
        return await unknown_reported(d, sc, outcome)
    latency = (d.cfg.clock.monotonic() - t) * 1000
    return await settle(d, sc, result_record(d, sc, outcome, latency))


async def execute(
    d: Driver, action: Action, ctx: ToolContext, done: asyncio.Future[None] | None = None
) -> Outcome | OutcomeUnknown:
    """The environment's call, in the action's task; ``done`` is woken as it ends. The
    ``OutcomeUnknown`` it raised is handed back (to :func:`act`: the run's rule for an action
    whose outcome is not known)."""
    try:
        pending = d.cfg.environment.execute(action, ctx)
        if not inspect.isawaitable(pending):  # a synchronous execute: it already ran
            raise not_awaitable(pending, "execute")
        outcome = await pending
    except OutcomeUnknown as exc:
        return exc
    except Escalate as exc:
        return handed_over(exc)
    except Exception as exc:  # the step is recorded whatever the environment raised
        return env_raised(d, exc, "execute")
    finally:
        if done is not None and not done.done():
            done.set_result(None)
    if not isinstance(outcome, Outcome):
        return env_failed(not_an_outcome(outcome))
    return outcome


def result_record(d: Driver, sc: StepCtx, outcome: Outcome, latency_ms: float) -> ActionResult:
    """The result record of the outcome the environment gave, its text cleaned first."""
    outcome, bad = clean_outcome(outcome)
    return ActionResult(sc.step_idx, sc.intent.op_id, outcome, latency_ms, bad)


def step_record(d: Driver, sc: StepCtx, result: ActionResult) -> tuple[StepRecord, int]:
    """The step of an action whose outcome arrived (counting it if executed), and
    PolyLoop's cut of its observation."""
    st = d.state
    outcome = result.outcome
    if outcome.status is ActionStatus.executed:
        st.actions_executed += 1
    cut = observation_cut(outcome.observation, st.limits.max_observation_chars)
    wall = (d.cfg.clock.monotonic() - sc.t0) * 1000
    i = sc.intent
    step = action_step(
        sc.step_idx, sc.reply, sc.llm_call_id, i.action, i.args_json, outcome, cut,
        sc.prompt_chars, wall, sc.replaced + result.replaced_chars, sc.model, sc.outcome_unknown,
    )  # fmt: skip
    return step, cut


async def settle(
    d: Driver, sc: StepCtx, result: ActionResult, *, durable: bool = False
) -> RunResult | None:
    """G for the action of ``sc`` and its ``result`` (made by :meth:`_result`, or read
    from the journal: ``durable``, then it is not written again)."""
    st = d.state
    intent = sc.intent
    outcome, latency_ms = result.outcome, result.latency_ms
    step, cut = step_record(d, sc, result)
    records: tuple[Record, ...] = () if durable else (result,)
    if d._observers:
        d._emit(
            ActionFinished(
                d.run_id,
                sc.step_idx,
                intent.op_id,
                intent.action.tool_name,
                outcome.status,
                latency_ms,
            )
        )
    reason = stopping.after_action(outcome)
    report = None
    seen = st.ledger.observe(
        sc.step_idx, outcome, intent.action.text, st.limits, judged=reason is None
    )
    records = (*records, *seen.records)
    if reason is StopReason.task_completed and d.cfg.guards:  # guards may not accept it
        records, steered, report = await guarding.judge_completion(
            d, sc, result, step, cut, records, durable
        )
        if steered is not None:
            await d._append_step(records, steered, sc.reply, cut)
            return None
        if report is not None:
            reason = stopping.HANDED_OVER
    if reason is None:
        signals = stopping.failure_signals(
            st.limits, seen.seen, seen.stale_rounds, seen.spreading_rounds
        )
        reason = stopping.failure_repeated(signals)
        if reason is not None:
            report = build_report(
                d.run_id, (*st.steps, step), st.ledger, st.limits, signals, d.cfg.report_hook
            )
    elif reason is StopReason.escalated and outcome.escalation is not None:
        name = intent.action.tool_name
        source = outcome.escalation.source or (f"tool {name}" if name else "the action")
        escalation = dataclasses.replace(outcome.escalation, source=source)
        report = guarding.handover_report(d, (*st.steps, step), escalation)
    if reason is not None:
        detail = env_detail(outcome) if reason is StopReason.env_error else None
        if report is not None and report.escalation is not None:
            detail = report.escalation.describe()
        return await d._end(
            reason,
            detail,
            records=records,
            step=step,
            reply=sc.reply,
            cut=cut,
            report=report,
        )
    await d._append_step(records, step, sc.reply, cut)
    return None


async def not_started(
    d: Driver, sc: StepCtx, outcome: Outcome, first: tuple[Record, ...]
) -> RunResult:
    """End the run with the ``env_error`` step of an action whose environment failed before
    it started (``replay_policy`` or ``needs_approval`` raised): no action intent or result is
    written (nothing ran, so a resume has nothing to decide about), the step and the end
    record in one transaction with the model result ``first``."""
    result = result_record(d, sc, outcome, 0.0)
    step, cut = step_record(d, sc, result)
    reason = stopping.after_action(result.outcome)
    assert reason is not None  # an env_error outcome ends the run
    detail = env_detail(result.outcome)
    return await d._end(reason, detail, records=first, step=step, reply=sc.reply, cut=cut)


async def unknown_reported(d: Driver, sc: StepCtx, exc: OutcomeUnknown) -> RunResult | None:
    """A live execution of the action of ``sc`` raised ``OutcomeUnknown``: the rule resume
    applies to an action intent without a result, by its replay policy. ``never`` ends the run
    ``resume_state_unknown`` (no step); ``idempotent`` executes it again with the same
    ``op_id`` after the retry policy's backoff; ``reconcile`` asks the environment (its
    Outcome is the result; None: executed again; ``OutcomeUnknown``: the run ends). At most
    ``retry.max_attempts`` executions of the op in all, counted across resumes: when the last
    one reports unknown, the run ends. Each report is an ``action_unknown`` record, durable
    before its path is taken (``ended``: with the end record)."""
    intent = sc.intent
    policy = intent.replay_policy
    attempt = sc.unknown_reports + 1
    reported = f" reported={json.dumps(str(exc), ensure_ascii=False)}"
    last = attempt >= d.cfg.retry.max_attempts
    if policy is ReplayPolicy.never or (policy is ReplayPolicy.idempotent and last):
        rec = ActionUnknown(intent.step_idx, intent.op_id, str(exc), "ended", attempt)
        more = "" if policy is ReplayPolicy.never else _executions(d, attempt)
        return await end_unknown(d, intent, policy, reported + more, (rec,))
    path = "reconciled" if policy is ReplayPolicy.reconcile else "replayed"
    await d._write((ActionUnknown(intent.step_idx, intent.op_id, str(exc), path, attempt),))
    sc = d._intent_written = dataclasses.replace(sc, unknown_reports=attempt, outcome_unknown=path)
    if policy is ReplayPolicy.reconcile:
        try:
            outcome = await reconciled(d, sc)
        except OutcomeUnknown as again:
            why = f"{reported}; reconcile: {json.dumps(str(again), ensure_ascii=False)}"
            return await end_unknown(d, intent, policy, why)
        if outcome is not None:
            return await settle(d, sc, result_record(d, sc, outcome, 0.0))
        if last:  # it did not happen, and may not be executed once more
            return await end_unknown(d, intent, policy, reported + _executions(d, attempt))
    else:
        await d.cfg.clock.sleep(d.cfg.retry.backoff_s(attempt, None, random.random()))
    return await act(d, sc)


def _executions(d: Driver, n: int) -> str:
    return f"; outcome unknown after {n} executions (retry max_attempts={d.cfg.retry.max_attempts})"


async def end_unknown(
    d: Driver,
    intent: ActionIntent,
    policy: ReplayPolicy,
    more: str = "",
    records: tuple[Record, ...] = (),
) -> RunResult:
    """End the run ``resume_state_unknown`` naming the action (``more`` added to the detail)."""
    pending = pending_action(intent, policy)
    return await d._end(
        stopping.OUTCOME_UNKNOWN, pending.describe() + more, records=records, pending=pending
    )
