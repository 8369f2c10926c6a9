"""The escalation report of a ``repeated_failure`` run, built from its steps and ledger."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..types import (
    ActionStatus,
    EscalationReport,
    FailureSeen,
    FingerprintEntry,
    StepRecord,
    StopReason,
    detect_pattern,
)

__all__ = ["build_report"]

_PATH_KEYS = ("path", "file", "filename", "file_path", "filepath")
_MAX_ATTEMPT_CHARS = 200


def _files_of(step: StepRecord) -> list[str]:
    """Paths an executed action named in its arguments (``path``, ``file``, …)."""
    if step.action_status is not ActionStatus.executed or not step.tool_args_json:
        return []
    try:
        args = json.loads(step.tool_args_json)
    except ValueError:
        return []
    if not isinstance(args, dict):
        return []
    return [v for k, v in args.items() if k in _PATH_KEYS and isinstance(v, str)]


def build_report(
    run_id: str, steps: Sequence[StepRecord], ledger: Sequence[FailureSeen], limit: int
) -> EscalationReport:
    """Group the ledger by fingerprint, list the actions between the first and the last
    failure, and name the pattern (unchanged / alternating / spreading)."""
    entries: dict[str, FingerprintEntry] = {}
    for seen in ledger:
        old = entries.get(seen.fingerprint)
        entries[seen.fingerprint] = (
            FingerprintEntry(seen.fingerprint, seen.failure, 1, (seen.step_idx,))
            if old is None
            else FingerprintEntry(
                old.fingerprint, old.failure, old.count + 1, (*old.steps, seen.step_idx)
            )
        )
    first, last = ledger[0].step_idx, ledger[-1].step_idx
    attempts = tuple(
        (s.action or "")[:_MAX_ATTEMPT_CHARS]
        for s in steps[first : last + 1]
        if s.action is not None
    )
    touched: list[str] = []
    files_per_round: list[int] = []
    failure_steps = {seen.step_idx for seen in ledger}
    for s in steps[: last + 1]:
        for path in _files_of(s):
            if path not in touched:
                touched.append(path)
        if s.step_idx in failure_steps:
            files_per_round.append(len(touched))
    pattern = detect_pattern([seen.fingerprint for seen in ledger], files_per_round)
    return EscalationReport(
        run_id=run_id,
        stop_reason=StopReason.repeated_failure.value,
        stopped_at_step=last,
        limit=limit,
        pattern=pattern,
        fingerprints=tuple(entries.values()),
        attempts=attempts,
        files_touched=tuple(touched),
    )
