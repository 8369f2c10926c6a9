"""Journal records (durability.md), the run row, leases and results.

Records are append-only and numbered per run by the journal (``seq``). Each has a ``kind``
string and a JSON form (:func:`record_to_dict` / :func:`record_from_dict`) that durable
journals store; the kinds and their fields are part of the journal's table schema.

The records of a step that hold text from outside the run (a model reply or error, an action,
an outcome) carry ``replaced_chars``: the code points of that text that were not valid Unicode
and were replaced with U+FFFD before the record was built (``StepRecord.replaced_chars`` sums
them, so resume rebuilds the count). Its JSON key is left out when it is 0, so the records of
text without any such code point are written exactly as before it existed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from ._checks import trusted_cost
from ._enums import ActionStatus, ReplayPolicy, StopReason
from ._errors import JournalError
from ._fast import fast_init
from ._guards import GuardVerdict
from ._ledger import FailureKnown, FailureSeen, TestEdit
from ._report import EscalationReport
from ._requests import EndRequest
from ._step import StepRecord
from ._usage import Usage, usage_from
from ._values import (
    Action,
    Escalation,
    Failure,
    FileEdit,
    Limits,
    Message,
    ModelReply,
    Outcome,
    ToolCall,
    canonical_json,
)

__all__ = [
    "ActionIntent",
    "ActionResult",
    "ActionUnknown",
    "ApprovalDecided",
    "ApprovalRequested",
    "ApprovedActionStarted",
    "ErrorInfo",
    "Lease",
    "LimitsChanged",
    "ModelAttemptFailed",
    "ModelFailure",
    "ModelIntent",
    "ModelResult",
    "PendingAction",
    "Record",
    "RunEnd",
    "RunResult",
    "RunSpec",
    "RunTotals",
    "StepWritten",
    "Turn",
    "record_from_dict",
    "record_to_dict",
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


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a run was started with; the journal's ``runs`` row holds it."""

    run_id: str
    goal: str
    limits: Limits
    created_at: float
    history: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] | None = None
    wording_version: str = ""


@fast_init
@dataclass(frozen=True, slots=True)
class Lease:
    """The right to advance one run, held by one execution until ``expires_at`` (epoch s).

    ``owner`` names the execution (host id, pid, process start time, random token); two
    executions never share one. Journals fence every write of a run with its lease.

    ``request``: the request to end the run stored in its ``runs`` row when the journal handed
    this lease out (``acquire``, ``renew``), or None; journals that take no requests leave it
    None. The owner learns of a request from it, with no read of its own.
    """

    run_id: str
    owner: str
    expires_at: float
    request: EndRequest | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    """The result of a run (kernel.md §9). Also rebuilt by ``Loop.resume`` of an ended run.

    ``stop_reason`` is ``cancelled`` on a result that ``Loop.run`` returned only after a cancel
    request (``Loop.cancel``); a cancellation of the caller's task re-raises instead, and then
    only a rebuilt result of the cancelled run carries it.
    """

    run_id: str
    stop_reason: StopReason
    stop_detail: str | None
    final_answer: str | None
    steps: tuple[StepRecord, ...]
    steps_used: int
    actions_executed: int
    started_at: float
    """Epoch seconds the run was created."""
    ended_at: float
    """Epoch seconds the end record was written."""
    pending_action: PendingAction | None = None
    """The unresolved action of a ``resume_state_unknown`` run."""
    usage: Usage | None = None
    """Token totals over all model calls whose provider reported usage; None if none did."""
    report: EscalationReport | None = None
    """Why a ``repeated_failure`` or ``escalated`` run was stopped (``to_markdown()``,
    ``to_json()``)."""
    totals: RunTotals = field(default_factory=lambda: RunTotals())
    """What the run spent: tokens, cost, active seconds (the budgets of ``Limits``)."""
    test_edits: tuple[TestEdit, ...] = ()
    """Every edit of a test file the run's actions reported (``FileEdit.test_file``), in
    order: a run that completed after one may have weakened its tests instead of fixing."""
    messages: tuple[Message, ...] = field(default=(), repr=False)
    """The conversation as the model last saw it (plus the final reply), for the next phase."""


# --- JSON forms ------------------------------------------------------------------------------


def _reply_to(r: ModelReply) -> dict[str, Any]:
    out: dict[str, Any] = {
        "text": r.text,
        "reasoning": r.reasoning,
        "tool_calls": [
            {
                "name": c.name,
                "arguments": c.arguments if isinstance(c.arguments, str) else dict(c.arguments),
                "id": c.id,
            }
            for c in r.tool_calls
        ],
        "call_id": r.call_id,
        "usage": None if r.usage is None else _usage_to(r.usage),
    }
    if r.model is not None:
        out["model"] = r.model
    return out


def _usage_to(u: Usage) -> dict[str, Any]:
    """The JSON form of a Usage; ``cached_tokens``/``reasoning_tokens`` only when reported, so
    the usage of a provider that reports neither is written as before they existed."""
    out: dict[str, Any] = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
    if u.cached_tokens is not None:
        out["cached_tokens"] = u.cached_tokens
    if u.reasoning_tokens is not None:
        out["reasoning_tokens"] = u.reasoning_tokens
    if u.cost_usd is not None:
        out["cost_usd"] = u.cost_usd
    return out


def _reply_from(d: Mapping[str, Any]) -> ModelReply:
    usage = d.get("usage")
    return ModelReply(
        text=d["text"],
        reasoning=d.get("reasoning"),
        tool_calls=tuple(ToolCall(c["name"], c["arguments"], c.get("id")) for c in d["tool_calls"]),
        call_id=d.get("call_id"),
        usage=usage_from(usage),
        model=d.get("model"),
    )


def _edit_to(e: FileEdit) -> dict[str, Any]:
    return {"path": e.path, "test_file": e.test_file, "tampering": list(e.tampering)}


def outcome_to(o: Outcome) -> dict[str, Any]:
    """The JSON form of an Outcome. ``failures`` and ``edits`` are left out when empty, so an
    outcome without them is written exactly as before they existed."""
    f = o.failure
    d: dict[str, Any] = {
        "status": o.status.value,
        "observation": o.observation,
        "completed": o.completed,
        "marker": o.marker,
        "synthetic": o.synthetic,
        "truncated_chars": o.truncated_chars,
        "failure": None if f is None else f.to_dict(),
    }
    if o.failures:
        d["failures"] = [x.to_dict() for x in o.failures]
    if o.edits:
        d["edits"] = [_edit_to(e) for e in o.edits]
    if o.escalation is not None:
        d["escalation"] = o.escalation.to_dict()
    return d


def _as_written_then(value: Any, kind: type) -> Any:
    """A field of an Outcome as releases before its construction checks may have journaled
    it, in the type it has now: ``marker`` was any JSON scalar, read by its truth value (1 is
    True); ``truncated_chars`` a bool (True is 1); a ``Failure`` field any JSON value when no
    fingerprint was taken (it reads as its canonical JSON). Anything else is left for the
    checks to refuse as damage."""
    if kind is bool and type(value) is not bool and isinstance(value, int | float | str):
        return bool(value)
    if kind is int and type(value) is bool:
        return int(value)
    if kind is str and value is not None and not isinstance(value, str):
        return canonical_json(value)
    return value


def _outcome_from(d: Mapping[str, Any]) -> Outcome:
    f = d.get("failure")
    failure = None
    if f is not None:
        failure = Failure(**{key: _as_written_then(value, str) for key, value in f.items()})
    return Outcome(
        status=ActionStatus(d["status"]),
        observation=d["observation"],
        completed=d["completed"],
        marker=_as_written_then(d["marker"], bool),
        synthetic=d["synthetic"],
        truncated_chars=_as_written_then(d["truncated_chars"], int),
        failure=failure,
        failures=tuple(Failure(**x) for x in d.get("failures", ())),
        edits=tuple(
            FileEdit(e["path"], e["test_file"], tuple(e["tampering"])) for e in d.get("edits", ())
        ),
        escalation=None if d.get("escalation") is None else Escalation(**d["escalation"]),
    )


def _action_to(a: Action) -> dict[str, Any]:
    return {
        "text": a.text,
        "tool_name": a.tool_name,
        "arguments": None if a.arguments is None else dict(a.arguments),
        "call_id": a.call_id,
    }


def _error_to(e: ErrorInfo) -> dict[str, Any]:
    return {
        "type": e.type,
        "message": e.message,
        "kind": e.kind,
        "retryable": e.retryable,
        "retry_after": e.retry_after,
    }


def _pending_to(p: PendingAction | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "step_idx": p.step_idx,
        "op_id": p.op_id,
        "tool_name": p.tool_name,
        "args_json": p.args_json,
        "action": p.action,
        "replay_policy": p.replay_policy.value,
    }


def _pending_from(d: Mapping[str, Any] | None) -> PendingAction | None:
    if d is None:
        return None
    return PendingAction(
        d["step_idx"],
        d["op_id"],
        d["tool_name"],
        d["args_json"],
        d["action"],
        ReplayPolicy(d["replay_policy"]),
    )


_MARKS = ("fallback", "partial_shown")  # ModelAttemptFailed's flags, in field order


def record_to_dict(record: Record) -> dict[str, Any]:
    """The JSON-ready form of a record, with its ``kind``."""
    match record:
        case ModelIntent(step_idx, intent_id, attempt, model, wrap_up):
            body: dict[str, Any] = {
                "step_idx": step_idx,
                "intent_id": intent_id,
                "attempt": attempt,
            }
            if model is not None:
                body["model"] = model
            if wrap_up is not None:
                body["wrap_up"] = wrap_up.value
        case ModelResult():
            body = {
                "step_idx": record.step_idx,
                "intent_id": record.intent_id,
                "attempt": record.attempt,
                "llm_call_id": record.llm_call_id,
                "reply": _reply_to(record.reply),
                "latency_ms": record.latency_ms,
            }
            if record.replaced_chars:
                body["replaced_chars"] = record.replaced_chars
            if record.cost_usd is not None:
                body["cost_usd"] = record.cost_usd
        case ModelAttemptFailed() | ModelFailure():
            body = {
                "step_idx": record.step_idx,
                "intent_id": record.intent_id,
                "attempt": record.attempt,
                "error": _error_to(record.error),
                "latency_ms": record.latency_ms,
            }
            if record.replaced_chars:
                body["replaced_chars"] = record.replaced_chars
            if isinstance(record, ModelAttemptFailed):
                body.update((k, True) for k in _MARKS if getattr(record, k))
        case ActionIntent():
            body = {
                "step_idx": record.step_idx,
                "op_id": record.op_id,
                "action": _action_to(record.action),
                "args_json": record.args_json,
                "replay_policy": record.replay_policy.value,
                "known_tool": record.known_tool,
            }
            if record.replaced_chars:
                body["replaced_chars"] = record.replaced_chars
        case ActionResult():
            body = {
                "step_idx": record.step_idx,
                "op_id": record.op_id,
                "outcome": outcome_to(record.outcome),
                "latency_ms": record.latency_ms,
            }
            if record.replaced_chars:
                body["replaced_chars"] = record.replaced_chars
        case ActionUnknown():
            body = {
                "step_idx": record.step_idx,
                "op_id": record.op_id,
                "detail": record.detail,
                "path": record.path,
                "attempt": record.attempt,
            }
        case StepWritten(step, active_s):
            body = {"step": step.to_dict()}
            if active_s is not None:
                body["active_s"] = active_s
        case RunEnd():
            body = {
                "stop_reason": record.stop_reason.value,
                "stop_detail": record.stop_detail,
                "final_answer": record.final_answer,
                "steps_used": record.steps_used,
                "actions_executed": record.actions_executed,
                "ended_at": record.ended_at,
                "pending_action": _pending_to(record.pending_action),
                "report": None if record.report is None else record.report.to_dict(),
            }
            if record.totals is not None:
                body["totals"] = record.totals.to_dict()
        case LimitsChanged(limits):
            body = {"limits": limits.to_dict()}
        case GuardVerdict():
            body = {
                "step_idx": record.step_idx,
                "guard": record.guard,
                "steer": record.steer,
                "feedback": record.feedback,
            }
        case FailureSeen():
            body = {
                "step_idx": record.step_idx,
                "fingerprint": record.fingerprint,
                "failure": record.failure.to_dict(),
                "action": record.action,
                "round": record.round,
                "known": record.known,
                "failing": list(record.failing),
                "changed": list(record.changed),
            }
        case FailureKnown():
            body = {
                "step_idx": record.step_idx,
                "fingerprint": record.fingerprint,
                "failure": record.failure.to_dict(),
            }
        case TestEdit():
            body = {
                "step_idx": record.step_idx,
                "path": record.path,
                "tampering": list(record.tampering),
            }
        case ApprovalRequested():
            body = {
                "step_idx": record.step_idx,
                "op_id": record.op_id,
                "requested_at": record.requested_at,
                "expires_at": record.expires_at,
            }
            if record.active_s is not None:
                body["active_s"] = record.active_s
        case ApprovalDecided():
            body = {
                "step_idx": record.step_idx,
                "op_id": record.op_id,
                "approved": record.approved,
                "note": record.note,
                "by": record.by,
                "decided_at": record.decided_at,
            }
        case ApprovedActionStarted():
            body = {"step_idx": record.step_idx, "op_id": record.op_id}
    body["kind"] = record.kind
    return body


def record_from_dict(d: Mapping[str, Any]) -> Record:
    """Read :func:`record_to_dict` output.

    Raises:
        JournalError: the kind is unknown or a field is missing or malformed.
    """
    kind = d.get("kind")
    try:
        if kind == "model_intent":
            wrap = d.get("wrap_up")
            return ModelIntent(
                d["step_idx"],
                d["intent_id"],
                d["attempt"],
                d.get("model"),
                None if wrap is None else StopReason(wrap),
            )
        if kind == "model_result":
            return ModelResult(
                d["step_idx"],
                d["intent_id"],
                d["attempt"],
                d["llm_call_id"],
                _reply_from(d["reply"]),
                d["latency_ms"],
                d.get("replaced_chars", 0),
                trusted_cost(d.get("cost_usd")),
            )
        if kind in ("model_attempt_failed", "model_failure"):
            fields = (
                d["step_idx"],
                d["intent_id"],
                d["attempt"],
                ErrorInfo(**d["error"]),
                d["latency_ms"],
                d.get("replaced_chars", 0),
            )
            if kind == "model_failure":
                return ModelFailure(*fields)
            return ModelAttemptFailed(*fields, *(d.get(k, False) is True for k in _MARKS))
        if kind == "action_intent":
            a = d["action"]
            return ActionIntent(
                d["step_idx"],
                d["op_id"],
                Action(a["text"], a["tool_name"], a["arguments"], a["call_id"]),
                d["args_json"],
                ReplayPolicy(d["replay_policy"]),
                d["known_tool"],
                d.get("replaced_chars", 0),
            )
        if kind == "action_result":
            return ActionResult(
                d["step_idx"],
                d["op_id"],
                _outcome_from(d["outcome"]),
                d["latency_ms"],
                d.get("replaced_chars", 0),
            )
        if kind == "action_unknown":
            return ActionUnknown(d["step_idx"], d["op_id"], d["detail"], d["path"], d["attempt"])
        if kind == "step":
            return StepWritten(StepRecord.from_dict(d["step"]), d.get("active_s"))
        if kind == "end":
            return RunEnd(
                StopReason(d["stop_reason"]),
                d["stop_detail"],
                d["final_answer"],
                d["steps_used"],
                d["actions_executed"],
                d["ended_at"],
                _pending_from(d.get("pending_action")),
                None if d.get("report") is None else EscalationReport.from_dict(d["report"]),
                None if d.get("totals") is None else RunTotals(**d["totals"]),
            )
        if kind == "guard_verdict":
            return GuardVerdict(d["step_idx"], d["guard"], d["steer"], d.get("feedback"))
        if kind == "failure_seen":
            return FailureSeen(
                d["step_idx"],
                d["fingerprint"],
                Failure(**d["failure"]),
                d.get("action"),
                d.get("round", 0),
                d.get("known", False),
                tuple(d.get("failing", ())),
                tuple(d.get("changed", ())),
            )
        if kind == "failure_known":
            return FailureKnown(d["step_idx"], d["fingerprint"], Failure(**d["failure"]))
        if kind == "test_edit":
            return TestEdit(d["step_idx"], d["path"], tuple(d["tampering"]))
        if kind == "limits":
            return LimitsChanged(Limits.from_dict(d["limits"]))
        if kind == "approval_requested":
            return ApprovalRequested(
                d["step_idx"], d["op_id"], d["requested_at"], d.get("expires_at"), d.get("active_s")
            )
        if kind == "approval_decided":
            return ApprovalDecided(
                d["step_idx"],
                d["op_id"],
                d["approved"] is True,
                d.get("note"),
                d["by"],
                d["decided_at"],
            )
        if kind == "approved_action_started":
            return ApprovedActionStarted(d["step_idx"], d["op_id"])
    except JournalError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"malformed {kind} record: {type(exc).__name__}: {exc}") from exc
    raise JournalError(f"unknown journal record kind {kind!r}")


@fast_init
@dataclass(frozen=True, slots=True)
class Turn:
    """What a context builder is given to add one step to the conversation.

    Args:
        step: the step record (its ``parse_error`` or ``observation`` is what the model is told).
        reply: the model reply of the step (None for a model-failure step: nothing to add).
        observation_cut: characters PolyLoop cut from the end of ``step.observation`` for the
            model (``Limits.max_observation_chars``); 0 when it sees it all.
        steps_used: steps in the trajectory including this one.
        actions_executed: executed actions including this one.
        limits: the limits in force for this step (for an opt-in budget hint).
        failure_seen: how often the failure the failure guard counted at this step has been
            counted so far, this step included (0 when it counted none), for the hint.
        totals: what the run had spent when the step was written (tokens, cost, active
            seconds), for the hint of the token, cost and time budgets; None when the run has
            none of those budgets.
    """

    step: StepRecord
    reply: ModelReply | None
    observation_cut: int
    steps_used: int
    actions_executed: int
    limits: Limits
    failure_seen: int = 0
    totals: RunTotals | None = None
