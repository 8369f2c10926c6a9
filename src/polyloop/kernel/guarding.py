"""Rule E's run-end guards, and the report a hand-over (``Escalate``) ends a run with.

The guards are asked in order when the model gives a final answer, and those with
``on_task_completed`` also when an action completed the run (G: :func:`judge_completion`);
the first ``Steer`` (or ``Escalate``) wins, and a guard at its own steer limit is skipped.
Each verdict is a ``GuardVerdict`` record, written with the step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect

from ..types import (
    ActionResult,
    Complete,
    CompletionKind,
    Escalate,
    Escalation,
    EscalationReport,
    GuardContext,
    GuardVerdict,
    Record,
    Steer,
    StepRecord,
    clean_text,
)
from .driver import Driver, StepCtx
from .report import build_handover_report
from .text import clean_escalation

__all__ = ["check", "handover_report", "judge_completion"]


async def check(
    d: Driver,
    step_idx: int,
    answer: str,
    completion: CompletionKind = "final_answer",
    step: StepRecord | None = None,
    sc: StepCtx | None = None,
) -> tuple[tuple[Record, ...], GuardVerdict | Escalation | None, int]:
    """Ask the run-end guards about ``answer`` (for a completion by the action of ``sc``,
    whose ``step`` ends the history, only those with ``on_task_completed``). Returns the
    verdict records (written with the step), the steer or the hand-over, and the code points
    replaced in its feedback."""
    st = d.state
    records: list[Record] = []
    steps = tuple(st.steps) if step is None else (*st.steps, step)
    action = None if sc is None else sc.intent.action
    tool = None if action is None else action.tool_name
    args = None if action is None or tool is None else action.arguments
    for guard in d.cfg.guards:
        steers = st.steer_counts.get(guard.name, 0)
        if steers >= guard.max_steers or (sc is not None and not guard.on_task_completed):
            continue
        ctx = GuardContext(d.run_id, d.spec.goal, steps, answer, steers, completion, tool, args)
        try:
            verdict = guard.check(ctx)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Escalate as exc:
            escalation = Escalation(exc.reason, exc.evidence, f"guard {guard.name}")
            return tuple(records), escalation, 0
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


async def judge_completion(
    d: Driver,
    sc: StepCtx,
    result: ActionResult,
    step: StepRecord,
    cut: int,
    records: tuple[Record, ...],
    durable: bool,
) -> tuple[tuple[Record, ...], StepRecord | None, EscalationReport | None]:
    """G, on a ``task_completed`` end of the action of ``sc``: ask the guards that opted in
    (``on_task_completed``). ``records``: those to write with its ``step`` (the action's
    ``result`` first unless ``durable``); ``cut``: PolyLoop's cut of its observation. The
    result is made durable here before a guard runs (a guard may take long; a crash in it
    must not execute the action again). Returns the records to write with the step, the
    steered step when a guard steered (the run goes on: the feedback, a blank line, then the
    tool's text as its observation), and the hand-over report when a guard raised
    ``Escalate``. A cancellation of the run while a guard runs writes the step as the action
    left it (no verdict) before the cancellation goes on, so the run ends ``cancelled`` with
    its executed step."""
    if not any(g.on_task_completed for g in d.cfg.guards):
        return records, None, None
    completion: CompletionKind = "marker" if result.outcome.marker else "environment"
    try:
        if not durable:
            # A write the run's cancellation interrupts is finished by the Journal seam (it
            # is durable): the result is then not written again below.
            rest = records[1:]
            try:
                await d._write((result,))
            finally:
                records = rest
        verdicts, steer, bad = await check(d, sc.step_idx, sc.reply.text, completion, step, sc)
    except asyncio.CancelledError:  # the run is cancelled: its executed step is kept, unjudged
        await d._write((*records, d._add_to_context(step, sc.reply, cut)))
        raise
    records = (*records, *verdicts)
    if isinstance(steer, Escalation):
        escalation, _ = clean_escalation(steer)
        return records, None, handover_report(d, (*d.state.steps, step), escalation)
    if steer is None:
        return records, None, None
    observation = f"{steer.feedback}\n\n{step.observation or ''}"
    steered = dataclasses.replace(
        step, observation=observation, replaced_chars=step.replaced_chars + bad
    )
    return records, steered, None


def handover_report(
    d: Driver, steps: tuple[StepRecord, ...], escalation: Escalation
) -> EscalationReport:
    """The report of a run ``escalation`` hands to a person: the evidence and the ledger."""
    st = d.state
    return build_handover_report(
        d.run_id, steps, st.ledger, st.limits, escalation, d.cfg.report_hook
    )
