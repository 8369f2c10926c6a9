"""Journal records (durability.md): the kinds a run appends to its write-ahead journal.

Records are append-only and numbered per run by the journal (``seq``). Each has a ``kind``
string and a JSON form (:func:`~polyloop.types.record_to_dict` /
:func:`~polyloop.types.record_from_dict`, in ``_records_form``) that durable journals store;
the kinds and their fields are part of the journal's table schema. The run's row, its lease
and its result are in ``_runs``; what a run spent (``RunTotals``) and an action left without
an outcome (``PendingAction``) are here, as parts of the end record.

The records of a step that hold text from outside the run (a model reply or error, an action,
an outcome) carry ``replaced_chars``: the code points of that text that were not valid Unicode
and were replaced with U+FFFD before the record was built (``StepRecord.replaced_chars`` sums
them, so resume rebuilds the count). Its JSON key is left out when it is 0, so the records of
text without any such code point are written exactly as before it existed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from ._enums import ReplayPolicy, StopReason
from ._fast import fast_init
from ._guards import GuardVerdict
from ._ledger import FailureKnown, FailureSeen, TestEdit
from ._limits import Limits
from ._model_io import Action, ModelReply
from ._report import EscalationReport
from ._step import StepRecord
from ._values import Outcome

__all__ = [
    "ActionIntent",
    "ActionResult",
    "ActionUnknown",
    "ApprovalDecided",
    "ApprovalRequested",
    "ApprovedActionStarted",
    "ErrorInfo",
    "LimitsChanged",
    "ModelAttemptFailed",
    "ModelFailure",
    "ModelIntent",
    "ModelResult",
    "PendingAction",
    "Record",
    "RunEnd",
    "RunTotals",
    "StepWritten",
]


@fast_init
@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """A model-call error as journaled: class name, message, and the ModelCallError fields."""

    type: str
    message: str
    kind: str = "error"
    retryable: bool = False
    retry_after: float | None = None

    def detail(self, attempts: int) -> str:
        """The ``stop_detail`` of an ``llm_error`` run (kernel.md §7)."""
        return (
            f"{self.type}: {self.message} "
            f"[kind={self.kind}, retryable={self.retryable}, attempts={attempts}]"
        )


@fast_init
@dataclass(frozen=True, slots=True)
class ModelIntent:
    """Durable before the model is called. One per attempt; same ``intent_id`` for every
    attempt of a step, also after a resume."""

    kind: ClassVar[str] = "model_intent"
    step_idx: int
    intent_id: str
    attempt: int
    model: str | None = None
    """The ``name`` of the model this attempt is sent to (a :class:`~polyloop.FallbackModel`
    names the one of its models it asks); None for a model without a name. Left out of the
    JSON form when None."""
    wrap_up: StopReason | None = None
    """Set on the intent of a wrap-up call (``Loop(wrap_up=True)``): the budget that ends the
    run, so a resume finishes the wrap-up as it began. Left out of the JSON form when None."""


@fast_init
@dataclass(frozen=True, slots=True)
class ModelResult:
    """Durable before anything acts on the reply."""

    kind: ClassVar[str] = "model_result"
    step_idx: int
    intent_id: str
    attempt: int
    llm_call_id: str
    reply: ModelReply
    latency_ms: float
    replaced_chars: int = 0
    """Code points of the reply as the model returned it that were replaced with U+FFFD."""
    cost_usd: float | None = None
    """What this attempt cost in US dollars: the provider's reported cost, else its tokens at
    the model's ``Pricing``; None when neither is known. Left out of the JSON form when None."""


@fast_init
@dataclass(frozen=True, slots=True)
class ModelAttemptFailed:
    """An attempt that failed and will be retried."""

    kind: ClassVar[str] = "model_attempt_failed"
    step_idx: int
    intent_id: str
    attempt: int
    error: ErrorInfo
    latency_ms: float
    replaced_chars: int = 0
    """Code points of the error's texts that were replaced with U+FFFD."""
    fallback: bool = False
    """The next attempt goes to the next model of a :class:`~polyloop.FallbackModel` (this
    model's retries are spent, or its error is not retried). Left out of the JSON form when
    False."""
    partial_shown: bool = False
    """Part of this attempt's reply reached observers (``ModelDelta`` events) before it failed,
    so the step's later attempts stay with this model. Left out of the JSON form when False."""


@fast_init
@dataclass(frozen=True, slots=True)
class ModelFailure:
    """The final, unrecoverable failure of a step's model call (the step ends ``llm_error``)."""

    kind: ClassVar[str] = "model_failure"
    step_idx: int
    intent_id: str
    attempt: int
    error: ErrorInfo
    latency_ms: float
    replaced_chars: int = 0
    """Code points of the error's texts that were replaced with U+FFFD."""


@fast_init
@dataclass(frozen=True, slots=True)
class ActionIntent:
    """Durable before the environment is called. ``op_id`` is the tool's idempotency key;
    ``replay_policy`` is what resume obeys if no result follows."""

    kind: ClassVar[str] = "action_intent"
    step_idx: int
    op_id: str
    action: Action
    args_json: str | None
    replay_policy: ReplayPolicy
    known_tool: bool
    replaced_chars: int = 0
    """Code points of the action as the interpreter returned it that were replaced."""


@fast_init
@dataclass(frozen=True, slots=True)
class ActionResult:
    """Written in one transaction with the step record it produced."""

    kind: ClassVar[str] = "action_result"
    step_idx: int
    op_id: str
    outcome: Outcome
    latency_ms: float
    replaced_chars: int = 0
    """Code points of the outcome as the environment returned it that were replaced."""


@fast_init
@dataclass(frozen=True, slots=True)
class ActionUnknown:
    """The environment's ``execute`` raised ``OutcomeUnknown`` during a live run: execution
    number ``attempt`` (1, 2, …) of the action ``op_id`` cannot tell whether it happened.
    Written before the kernel takes ``path``: ``"ended"`` (the run ends
    ``resume_state_unknown``; in one transaction with the end record), ``"replayed"`` (it is
    executed again with the same ``op_id``) or ``"reconciled"`` (the environment is asked)."""

    kind: ClassVar[str] = "action_unknown"
    step_idx: int
    op_id: str
    detail: str
    path: str
    attempt: int


@dataclass(frozen=True, slots=True)
class StepWritten:
    """A step record appended to the trajectory."""

    kind: ClassVar[str] = "step"
    step: StepRecord
    active_s: float | None = None
    """Seconds the run had been active when the step was written (``Limits.max_seconds``):
    resume continues the count from the last one. Left out of the JSON form when None."""


@dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """The action intent before it (same ``op_id``, same transaction) awaits a person's
    decision: the run is parked (``runs.status = 'awaiting_approval'``, no lease held). Written
    by the run. ``expires_at``: when a sweeper may deny it as timed out (``Loop(
    approval_timeout_s=...)``; None: never). ``active_s``: the run's active seconds when it
    parked (``Limits.max_seconds`` does not count the time parked)."""

    kind: ClassVar[str] = "approval_requested"
    step_idx: int
    op_id: str
    requested_at: float
    expires_at: float | None = None
    active_s: float | None = None


@dataclass(frozen=True, slots=True)
class ApprovalDecided:
    """A person's decision on the action ``op_id`` (``Loop.approve`` / ``Loop.deny``, from any
    process). Exactly one per action: the journal writes it only while the action awaits one.
    ``note`` is the approver's note, or the reason of a denial (which the model is shown)."""

    kind: ClassVar[str] = "approval_decided"
    step_idx: int
    op_id: str
    approved: bool
    note: str | None
    by: str
    decided_at: float

    def describe(self) -> str:
        verdict = "approved" if self.approved else "denied"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.decided_at))
        note = f": {self.note}" if self.note else ""
        return f"{verdict} by {self.by} at {when}{note}"


@dataclass(frozen=True, slots=True)
class ApprovedActionStarted:
    """Written by the execution that acts on an approval, just before it executes the approved
    action: the write-ahead mark that the intent (written when the run parked) is being acted
    on now. Without it, a resume knows the approved action never started and executes it;
    with it and no result, the action may have happened and its replay policy decides."""

    kind: ClassVar[str] = "approved_action_started"
    step_idx: int
    op_id: str


@dataclass(frozen=True, slots=True)
class PendingAction:
    """An action whose outcome is unknown (its intent is durable, its result is not)."""

    step_idx: int
    op_id: str
    tool_name: str | None
    args_json: str | None
    action: str
    replay_policy: ReplayPolicy

    def describe(self) -> str:
        """``op_id=… tool=… args=<canonical JSON> policy=…`` as kernel.md §4 asks."""
        return (
            f"op_id={self.op_id} tool={self.tool_name} args={self.args_json} "
            f"policy={self.replay_policy.value}"
        )


@fast_init
@dataclass(frozen=True, slots=True)
class RunEnd:
    """The end record. Exactly one per run; written with the step that ends the run."""

    kind: ClassVar[str] = "end"
    stop_reason: StopReason
    stop_detail: str | None
    final_answer: str | None
    steps_used: int
    actions_executed: int
    ended_at: float
    pending_action: PendingAction | None = None
    report: EscalationReport | None = None
    totals: RunTotals | None = None
    """What the run spent (tokens, cost, active time); None in end records written before it
    was kept."""


@fast_init
@dataclass(frozen=True, slots=True)
class RunTotals:
    """What a run spent, summed over every model-call attempt and execution (the budgets
    ``max_tokens``, ``max_cost``, ``max_seconds`` read these)."""

    tokens: int = 0
    """Input plus output tokens the providers reported."""
    cost_usd: float = 0.0
    """US dollars (reported by the provider, else priced with the model's ``Pricing``)."""
    active_s: float = 0.0
    """Seconds some process was driving the run."""
    usage_missing: int = 0
    """Attempts that got a reply with no usage (their tokens count 0), or no price when the
    run has a ``max_cost`` (their cost counts 0)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "cost_usd": self.cost_usd,
            "active_s": self.active_s,
            "usage_missing": self.usage_missing,
        }


@dataclass(frozen=True, slots=True)
class LimitsChanged:
    """``resume(limits=…)`` overrode the limits stored with the run."""

    kind: ClassVar[str] = "limits"
    limits: Limits


Record: TypeAlias = (
    ModelIntent
    | ModelResult
    | ModelAttemptFailed
    | ModelFailure
    | ActionIntent
    | ActionResult
    | ActionUnknown
    | StepWritten
    | RunEnd
    | LimitsChanged
    | GuardVerdict
    | FailureSeen
    | FailureKnown
    | TestEdit
    | ApprovalRequested
    | ApprovalDecided
    | ApprovedActionStarted
)
