"""The escalation report of a ``repeated_failure`` run, built from its steps and ledger."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from ..types import (
    ActionStatus,
    Escalation,
    EscalationReport,
    FailureSeen,
    FingerprintEntry,
    Limits,
    ReportHook,
    RoundEntry,
    StepRecord,
    clean_text,
    detect_pattern,
    text_nested_deeper,
)
from . import stopping
from .decision import decide
from .ledger import Ledger

__all__ = ["build_report"]

_PATH_KEYS = ("path", "file", "filename", "file_path", "filepath")
_MAX_ATTEMPT_CHARS = 200
_HANDOVER_ATTEMPTS = 10  # the steps before a hand-over that the report lists


def _files_of(step: StepRecord) -> list[str]:
    """Paths an executed action named in its arguments (``path``, ``file``, …): what the
    report shows as touched when the environment reports no edits."""
    if step.action_status is not ActionStatus.executed or not step.tool_args_json:
        return []
    if text_nested_deeper(step.tool_args_json):  # an older writer's: never decoded recursively
        return []
    try:
        args = json.loads(step.tool_args_json)
    except ValueError:
        return []
    if not isinstance(args, dict):
        return []
    return [v for k, v in args.items() if k in _PATH_KEYS and isinstance(v, str)]


def _why(limits: Limits, signals: Sequence[str], ledger: Ledger) -> str:
    parts = []
    for signal in signals:
        if signal == "same_failure":
            parts.append(f"one failure seen {limits.same_failure_limit} times")
        elif signal == "no_progress":
            parts.append(
                f"no fewer failing checks for {limits.no_progress_rounds} rounds "
                f"(fewest {ledger.fewest})"
            )
        elif signal == "spreading":
            parts.append(f"a new file changed in each of the last {limits.spreading_rounds} rounds")
    return "; ".join(parts)


def _rounds(ledger: Ledger) -> tuple[RoundEntry, ...]:
    out = []
    first = 0
    for seen in ledger.rounds:
        counted = None if seen.known else seen.fingerprint
        out.append(
            RoundEntry(seen.round, first, seen.step_idx, seen.changed, seen.failing, counted)
        )
        first = seen.step_idx + 1
    return tuple(out)


def _touched(
    steps: Sequence[StepRecord], ledger: Ledger, counted: Sequence[FailureSeen], last: int
) -> tuple[list[str], list[int]]:
    """The files touched up to step ``last``, and how many had been touched at each counted
    round: the edits the environment reported, or else the paths the actions named."""
    touched: list[str] = []
    per_round: list[int] = []
    if ledger.files:
        for seen in ledger.rounds:
            touched.extend(p for p in seen.changed if p not in touched)
            if seen in counted:
                per_round.append(len(touched))
        return touched, per_round
    counted_steps = {seen.step_idx for seen in counted}
    for s in steps[: last + 1]:
        touched.extend(p for p in _files_of(s) if p not in touched)
        if s.step_idx in counted_steps:
            per_round.append(len(touched))
    return touched, per_round


def build_report(
    run_id: str,
    steps: Sequence[StepRecord],
    ledger: Ledger,
    limits: Limits,
    signals: Sequence[str],
    hook: ReportHook | None = None,
) -> EscalationReport:
    """Group the counted rounds by fingerprint, list the actions between the first and the
    last failure, the rounds and the known failures, name the pattern and the decision left
    (:mod:`.decision`), then add the caller's directions (``hook``)."""
    counted = [seen for seen in ledger.rounds if not seen.known] or ledger.rounds
    entries: dict[str, FingerprintEntry] = {}
    for seen in counted:
        old = entries.get(seen.fingerprint)
        entries[seen.fingerprint] = (
            FingerprintEntry(seen.fingerprint, seen.failure, 1, (seen.step_idx,))
            if old is None
            else FingerprintEntry(
                old.fingerprint, old.failure, old.count + 1, (*old.steps, seen.step_idx)
            )
        )
    first, last = counted[0].step_idx, ledger.rounds[-1].step_idx
    attempts = tuple(
        (s.action or "")[:_MAX_ATTEMPT_CHARS]
        for s in steps[first : last + 1]
        if s.action is not None
    )
    touched, per_round = _touched(steps, ledger, counted, last)
    pattern = detect_pattern([seen.fingerprint for seen in counted], per_round)
    rounds = _rounds(ledger)
    known = ledger.known_entries(limits)
    test_edits = tuple(ledger.test_edits)
    fingerprints = tuple(entries.values())
    decision = decide(
        pattern, signals, fingerprints, rounds, known, test_edits, limits.no_progress_rounds
    )
    report = EscalationReport(
        run_id=run_id,
        stop_reason=stopping.REPEATED_FAILURE.value,
        stopped_at_step=last,
        limit=limits.same_failure_limit or 0,
        pattern=pattern,
        fingerprints=fingerprints,
        attempts=attempts,
        files_touched=tuple(touched),
        question=decision.question,
        signals=tuple(signals),
        why=_why(limits, signals, ledger),
        rounds=rounds,
        known=known,
        test_edits=test_edits,
        conflict=decision.conflict,
        directions=decision.directions,
    )
    return report if hook is None else with_hook(report, hook)


def with_hook(report: EscalationReport, hook: ReportHook) -> EscalationReport:
    """``report`` with the directions ``hook`` adds after its own (their text cleaned).

    Raises:
        TypeError: the hook returned something other than a sequence of str.
    """
    added = hook(report)
    if isinstance(added, str) or not all(isinstance(d, str) for d in added):
        raise TypeError(f"report_hook must return a sequence of str, got {added!r}")
    if not added:
        return report
    more = tuple(clean_text(d)[0] for d in added)
    return dataclasses.replace(report, directions=(*report.directions, *more))


def build_handover_report(
    run_id: str,
    steps: Sequence[StepRecord],
    ledger: Ledger,
    limits: Limits,
    escalation: Escalation,
    hook: ReportHook | None = None,
) -> EscalationReport:
    """The report of an ``escalated`` run: who handed it over, why and with what evidence,
    with the fix loop's ledger so far when it has one (its rounds, known failures and test
    edits); the question is the reason, for the person to answer."""
    last = steps[-1].step_idx
    question = f"{escalation.source or 'The run'} needs a person: {escalation.reason}"
    why = f"handed over by {escalation.source or 'the run'}"
    if ledger.rounds:
        loop = build_report(run_id, steps, ledger, limits, ())
        report = dataclasses.replace(
            loop,
            stop_reason=stopping.HANDED_OVER.value,
            stopped_at_step=last,
            question=question,
            why=why,
            signals=(),
            escalation=escalation,
        )
    else:
        report = EscalationReport(
            run_id=run_id,
            stop_reason=stopping.HANDED_OVER.value,
            stopped_at_step=last,
            limit=limits.same_failure_limit or 0,
            pattern="none",
            fingerprints=(),
            attempts=tuple(
                s.action[:_MAX_ATTEMPT_CHARS] for s in steps[-_HANDOVER_ATTEMPTS:] if s.action
            ),
            question=question,
            why=why,
            known=ledger.known_entries(limits),
            test_edits=tuple(ledger.test_edits),
            escalation=escalation,
        )
    return report if hook is None else with_hook(report, hook)
