"""What every journal decides the same way about a person's decision on a parked run's action
(the ``Approvals`` seam, :class:`polyloop.seams.Approvals`), from the run's approval records."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from ..types import (
    ActionIntent,
    ApprovalDecided,
    ApprovalRequested,
    NotAwaitingApproval,
    Record,
    record_from_dict,
)

__all__ = ["APPROVAL_KINDS", "answer", "decision_of", "pending", "pending_of", "to_write"]

APPROVAL_KINDS = ("approval_requested", "approval_decided")
"""The record kinds :func:`answer` reads."""


def answer(
    run_id: str, decision: ApprovalDecided, records: Iterable[Record], *, ended: bool
) -> ApprovalDecided | None:
    """The decision that stands on ``decision.op_id``, or None when ``decision`` is to be
    written (then with the ``step_idx`` of its request: see :func:`to_write`). ``records``: the
    run's approval records in ``seq`` order. Raises ``NotAwaitingApproval``."""
    last: ApprovalRequested | None = None
    last_decided: ApprovalDecided | None = None
    for r in records:
        if isinstance(r, ApprovalDecided):
            if r.op_id == decision.op_id:
                return r
            if last is not None and r.op_id == last.op_id:
                last_decided = r
        if isinstance(r, ApprovalRequested):
            last, last_decided = r, None
    if last is not None and last.op_id == decision.op_id and not ended:
        return None
    if ended:
        why = "the run has ended"
    elif last is not None and last_decided is None:
        why = f"it awaits approval of op_id {last.op_id} (step {last.step_idx})"
    elif last is not None and last_decided is not None:
        verdict = "approved" if last_decided.approved else "denied"
        why = (
            f"it awaits no approval: op_id {last.op_id} (step {last.step_idx}) was already "
            f"{verdict}, and the run waits to be resumed"
        )
    else:
        why = "it awaits no approval"
    raise NotAwaitingApproval(
        f"run {run_id!r}: no action with op_id {decision.op_id} awaits approval ({why}); "
        "nothing was written"
    )


def to_write(decision: ApprovalDecided, records: Iterable[Record]) -> ApprovalDecided:
    """``decision`` with the step of the request it answers."""
    for r in records:
        if isinstance(r, ApprovalRequested) and r.op_id == decision.op_id:
            return dataclasses.replace(decision, step_idx=r.step_idx)
    return decision


def pending_row(run_id: str, requested: ApprovalRequested, intent: ActionIntent) -> dict[str, Any]:
    """One row of ``pending_approvals``."""
    return {
        "run_id": run_id,
        "step_idx": requested.step_idx,
        "op_id": requested.op_id,
        "tool_name": intent.action.tool_name,
        "args_json": intent.args_json,
        "action": intent.action.text,
        "requested_at": requested.requested_at,
        "expires_at": requested.expires_at,
    }


def decision_of(
    run_id: str, decision: ApprovalDecided, status: str, bodies: Iterable[str]
) -> tuple[ApprovalDecided, bool]:
    """What ``decision`` does to a run in ``status`` whose approval records' JSON is
    ``bodies`` (``_sql.APPROVAL_RECORDS``, in order), as a SQL journal decides it in its
    transaction: (the decision to answer with, whether to write it). Raises as :func:`answer`."""
    approvals = [record_from_dict(json.loads(body)) for body in bodies]
    standing = answer(run_id, decision, approvals, ended=status == "ended")
    if standing is not None:
        return standing, False
    return to_write(decision, approvals), True


def pending(rows: Iterable[tuple[str, ApprovalRequested, ActionIntent]]) -> list[dict[str, Any]]:
    """``pending_approvals``' answer from (run id, its last request, the action's intent) per
    parked run: oldest request first."""
    return sorted((pending_row(*row) for row in rows), key=lambda row: row["requested_at"])


def pending_of(rows: Iterable[tuple[str, str, str]]) -> list[dict[str, Any]]:
    """:func:`pending` from ``_sql.PENDING_APPROVALS`` rows (the records' JSON)."""
    decoded = []
    for run_id, requested, intent in rows:
        a, i = record_from_dict(json.loads(requested)), record_from_dict(json.loads(intent))
        assert isinstance(a, ApprovalRequested) and isinstance(i, ActionIntent)
        decoded.append((run_id, a, i))
    return pending(decoded)
