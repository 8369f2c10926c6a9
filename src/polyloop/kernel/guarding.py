"""Rule E's run-end guards, and the report a hand-over (``Escalate``) ends a run with.

The guards are asked in order when the model gives a final answer; the first ``Steer`` (or
``Escalate``) wins, and a guard at its own steer limit is skipped. Each verdict is a
``GuardVerdict`` record, written with the step.
"""

from __future__ import annotations

import inspect

from ..types import (
    Complete,
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
from .driver import Driver
from .report import build_handover_report

__all__ = ["check", "handover_report"]


async def check(
    d: Driver, step_idx: int, answer: str
) -> tuple[tuple[Record, ...], GuardVerdict | Escalation | None, int]:
    """Ask the run-end guards about ``answer``. Returns the verdict records (written with the
    step), the steer or the hand-over, and the code points replaced in its feedback."""
    st = d.state
    records: list[Record] = []
    for guard in d.cfg.guards:
        steers = st.steer_counts.get(guard.name, 0)
        if steers >= guard.max_steers:
            continue
        ctx = GuardContext(d.run_id, d.spec.goal, tuple(st.steps), answer, steers)
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


def handover_report(
    d: Driver, steps: tuple[StepRecord, ...], escalation: Escalation
) -> EscalationReport:
    """The report of a run ``escalation`` hands to a person: the evidence and the ledger."""
    st = d.state
    return build_handover_report(
        d.run_id, steps, st.ledger, st.limits, escalation, d.cfg.report_hook
    )
