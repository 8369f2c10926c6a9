"""Durable human approval of actions (a tool declared with ``approval=``).

Live, when a decision's action needs approval (the environment's ``needs_approval``, the
:class:`~polyloop.seams.NeedsApproval` seam), F writes the action intent and an
``ApprovalRequested`` in one transaction (with the model result when it is the first record
acting on it), and the run **parks**: ``ApprovalRequired`` propagates, no end record, the lease
released, ``runs.status = 'awaiting_approval'``. Nothing is executed and no process is held.

A person decides from any process (``Loop.approve`` / ``Loop.deny``; the journal's ``decide``
writes exactly one ``ApprovalDecided`` per action). ``resume`` then, by what the journal holds
after the intent:

* no decision: ``ApprovalRequired`` again, nothing called, nothing written;
* denied: the action is not executed; its step is ``not_executed`` with the synthetic
  observation ``Templates.approval_denied`` naming the reason, so the model can adapt;
* approved, not started: ``ApprovedActionStarted`` is written (the write-ahead mark that the
  intent written when the run parked is acted on now), then the action executes, its
  ``ToolContext.approved_by`` naming the approver;
* approved and started, no result: the action may have happened: its replay policy decides,
  as for any action intent without a result (``never`` → ``resume_state_unknown``).

Parked time is outside ``max_seconds``: the request carries the run's active seconds, and no
execution counts the time until the next resume.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..types import (
    ActionIntent,
    ActionStatus,
    ApprovalRequested,
    ApprovalRequired,
    ApprovedActionStarted,
    Outcome,
    Record,
    RunResult,
)
from . import acting
from .driver import Driver, StepCtx
from .replay import Interrupted

__all__ = ["awaiting", "park", "required", "resume"]


def required(d: Driver, sc: StepCtx, requested: ApprovalRequested) -> ApprovalRequired:
    return awaiting(d.run_id, len(d.state.steps), sc.intent, requested)


def awaiting(
    run_id: str, steps_used: int, intent: ActionIntent, requested: ApprovalRequested
) -> ApprovalRequired:
    """The ``ApprovalRequired`` of a run parked on ``intent``."""
    arguments = intent.action.arguments
    return ApprovalRequired(
        run_id,
        steps_used,
        step_idx=intent.step_idx,
        op_id=intent.op_id,
        tool_name=intent.action.tool_name,
        arguments=dict(arguments) if isinstance(arguments, Mapping) else None,
        args_json=intent.args_json,
        expires_at=requested.expires_at,
    )


async def park(d: Driver, sc: StepCtx, first: tuple[Record, ...]) -> RunResult:
    """Write the intent and its approval request, then park the run (raise)."""
    now = d.cfg.clock.time()
    timeout = d.cfg.approval_timeout_s
    requested = ApprovalRequested(
        sc.step_idx,
        sc.intent.op_id,
        now,
        None if timeout is None else now + timeout,
        d._active(),
    )
    await d._write((*first, sc.intent, requested))
    raise required(d, sc, requested)


async def resume(d: Driver, sc: StepCtx, it: Interrupted) -> RunResult | None:
    """An action intent that awaited approval, without a result (see the module)."""
    assert it.approval is not None
    decision = it.decision
    if decision is None:
        raise required(d, sc, it.approval)
    if not decision.approved:
        name = sc.intent.action.tool_name
        text = d.cfg.approval_denied.format(
            name=name if name is not None else "the action",
            reason=decision.note or "(no reason given)",
            by=decision.by,
        )
        outcome = Outcome(ActionStatus.not_executed, text, synthetic=True)
        return await acting.settle(d, sc, acting.result_record(d, sc, outcome, 0.0))
    sc = dataclasses.replace(sc, approved_by=decision.by)
    if it.approved_started:  # it may have run: as any intent without a result
        return await acting.replay_action(d, sc)
    await d._write((ApprovedActionStarted(sc.step_idx, sc.intent.op_id),))
    d._intent_written = sc  # from here a cancellation reports its outcome unknown
    return await acting.act(d, sc)
