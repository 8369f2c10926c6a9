"""D, E and F of the stop order (kernel.md §6): interpret the reply, then an invalid decision's
step (D), a final answer under the run-end guards (E), or the action's intent, written before
the environment is called (F; the action itself is :mod:`.acting`'s)."""

from __future__ import annotations

from ..types import (
    Action,
    ActionIntent,
    Escalation,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    ModelResult,
    Outcome,
    Record,
    ReplayPolicy,
    RunResult,
)
from . import acting, approving, guarding, stopping
from .driver import Driver, StepCtx
from .ids import new_id
from .steps import final_answer_step, invalid_step
from .text import clean_action, clean_decision, clean_escalation

__all__ = ["decide"]


async def decide(
    d: Driver,
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
    st = d.state
    clock = d.cfg.clock
    first: tuple[Record, ...] = () if result is None else (result,)
    args_json: str | None = None
    refused: Outcome | None = None  # the environment failed before the action started
    try:
        decision = d.cfg.interpreter.interpret(reply, d.tool_specs)
        # Cleaned before anything reads it: decoding JSON in the reply (a "\ud800" escape)
        # can make text that is not valid Unicode out of valid text.
        if isinstance(decision, Action):
            decision, args_json, bad = clean_action(decision)
            try:
                policy = d.cfg.environment.replay_policy(decision)
                if type(policy) is not ReplayPolicy:  # a str from a custom environment
                    policy = acting.as_policy(policy)
            except Exception as exc:  # a bug in the environment: the action does not run
                refused = acting.env_raised(d, exc, "replay_policy", acting.NOT_RUN)
                policy = ReplayPolicy.never
        elif isinstance(decision, InvalidDecision | FinalAnswer):
            decision, bad = clean_decision(decision)
        else:
            raise TypeError(f"the interpreter returned {decision!r}, not a Decision")
    except Exception:
        if first:
            await d._write(first)
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
            return await d._end(reason, records=first, step=step, reply=reply)
        await d._append_step(first, step, reply, 0)
        return None
    st.consecutive_invalid = 0  # any valid decision resets the counter
    if isinstance(decision, FinalAnswer):  # E: run-end guards may steer
        if first and d.cfg.guards:
            await d._write(first)
            first = ()
        verdicts, steer, in_feedback = await guarding.check(d, step_idx, decision.text)
        wall = (clock.monotonic() - t0) * 1000
        if isinstance(steer, Escalation):  # a guard handed the run to a person
            escalation, _ = clean_escalation(steer)
            step = final_answer_step(
                step_idx, reply, call_id, prompt_chars, wall, None, replaced + bad, model
            )
            report = guarding.handover_report(d, (*st.steps, step), escalation)
            return await d._end(
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
            await d._append_step((*first, *verdicts), step, reply, 0)
            return None
        step = final_answer_step(
            step_idx, reply, call_id, prompt_chars, wall, None, replaced + bad, model
        )
        return await d._end(
            stopping.FINAL_ANSWER,
            final_answer=decision.text,
            records=(*first, *verdicts),
            step=step,
            reply=reply,
        )
    # F: write the action intent (with the model result), then execute.
    action = decision
    known = action.tool_name is None or action.tool_name in d.tool_names
    intent = ActionIntent(step_idx, new_id(), action, args_json, policy, known, bad)
    sc = StepCtx(step_idx, t0, prompt_chars, reply, call_id, intent, replaced + bad, False, model)
    if d._needs_approval is not None and refused is None:
        try:
            parks = d._needs_approval(action)
        except Exception as exc:  # as for replay_policy: the action does not run
            refused = acting.env_raised(d, exc, "needs_approval", acting.NOT_RUN)
            parks = False
        if parks:
            return await approving.park(d, sc, first)  # raises ApprovalRequired
    if refused is not None:
        return await acting.not_started(d, sc, refused, first)
    d._intent_written = sc
    await d._write((*first, intent))
    return await acting.act(d, sc)
