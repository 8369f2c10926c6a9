"""The action of a run that has not ended whose outcome is not recorded, as ``polyloop show``
tells it: the action a parked run awaits a decision on (since when, until when), the one a
person decided on and nobody has resumed yet, or the one in flight when its process died."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyloop.types import (
    ActionIntent,
    ActionResult,
    ApprovalDecided,
    ApprovalRequested,
    ApprovedActionStarted,
    Record,
    RunEnd,
)

from ._common import when

__all__ = ["open_action", "open_action_lines"]


def open_action(records: Sequence[Record]) -> dict[str, Any] | None:
    """The last action intent with no result, for a run with no end record (None otherwise):
    ``state`` (``awaiting_approval``: it awaits a person's decision; ``decided``: decided, not
    yet resumed; ``in_flight``: its outcome is unknown, the replay policy tells what a resume
    does), ``step_idx``, ``op_id``, ``tool_name``, ``args_json``, ``action``,
    ``replay_policy``, and for an approval ``requested_at``/``expires_at`` (epoch seconds,
    None: never) and the decision (``approved``, ``decided_by``, ``decided_at``, ``note``)."""
    if records and isinstance(records[-1], RunEnd):
        return None
    intent: ActionIntent | None = None
    requested: ApprovalRequested | None = None
    decided: ApprovalDecided | None = None
    started = False
    for r in records:
        if isinstance(r, ActionIntent):
            intent, requested, decided, started = r, None, None, False
        elif intent is None or getattr(r, "op_id", None) != intent.op_id:
            continue
        elif isinstance(r, ActionResult):
            intent = None
        elif isinstance(r, ApprovalRequested):
            requested = r
        elif isinstance(r, ApprovalDecided):
            decided = r
        elif isinstance(r, ApprovedActionStarted):
            started = True
    if intent is None:
        return None
    state = "in_flight"
    if requested is not None and not started:
        state = "awaiting_approval" if decided is None else "decided"
    out: dict[str, Any] = {
        "state": state,
        "step_idx": intent.step_idx,
        "op_id": intent.op_id,
        "tool_name": intent.action.tool_name,
        "args_json": intent.args_json,
        "action": intent.action.text,
        "replay_policy": intent.replay_policy.value,
    }
    if requested is not None:
        out["requested_at"] = requested.requested_at
        out["expires_at"] = requested.expires_at
    if decided is not None:
        out.update(
            approved=decided.approved,
            decided_by=decided.by,
            decided_at=decided.decided_at,
            note=decided.note,
        )
    return out


def open_action_lines(
    action: dict[str, Any] | None, run_id: str, where: str, hint: str = ""
) -> list[str]:
    """What ``show`` prints of :func:`open_action` (``where``: `` --journal PATH`` or "";
    ``hint``: what continues the run, :func:`._approval.continue_hint`, shown for a decided
    action)."""
    if action is None:
        return []
    what = (
        f"step {action['step_idx']}  op_id {action['op_id']}  "
        f"{action['tool_name'] or action['action']} {action['args_json'] or ''}".rstrip()
    )
    if action["state"] == "awaiting_approval":
        expires = action["expires_at"]
        until = "" if expires is None else f", denied as timed out from {when(expires)}"
        return [
            f"awaiting approval since {when(action['requested_at'])}{until}: {what}",
            f"  approve: polyloop approve {run_id} {action['op_id']}{where}   "
            f"deny: polyloop deny {run_id} {action['op_id']} --reason TEXT{where}",
        ]
    if action["state"] == "decided":
        verdict = "approved" if action["approved"] else "denied"
        return [
            f"{verdict} by {action['decided_by']} at {when(action['decided_at'])}, not yet "
            f"resumed: {what}",
            *([f"  {hint}"] if hint else []),
        ]
    return [
        f"in flight, outcome not recorded (replay policy {action['replay_policy']}: what a "
        f"resume does with it): {what}"
    ]
