"""The JSON form of journal records: :func:`record_to_dict` and :func:`record_from_dict`.

Each kind's form is one table (:data:`_FORMS`): its keys in field order, each with how its value
is written and read, whether a reader may find it missing (records written before the field
existed) and whether a writer leaves it out (its default, so that records that do not use it
are written exactly as before it existed). One loop writes every kind and one reads it.
``_records_json`` writes the same form faster for the kinds every step writes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter, methodcaller
from typing import Any, NamedTuple

from ._canonical import canonical_json
from ._checks import trusted_cost
from ._enums import ActionStatus, ReplayPolicy, StopReason
from ._errors import JournalError
from ._guards import GuardVerdict
from ._ledger import FailureKnown, FailureSeen, TestEdit
from ._limits import Limits
from ._model_io import Action, ModelReply, ToolCall
from ._records import (
    ActionIntent,
    ActionResult,
    ActionUnknown,
    ApprovalDecided,
    ApprovalRequested,
    ApprovedActionStarted,
    ErrorInfo,
    LimitsChanged,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelResult,
    PendingAction,
    Record,
    RunEnd,
    RunTotals,
    StepWritten,
)
from ._report import EscalationReport
from ._step import StepRecord
from ._usage import Usage, usage_from
from ._values import Escalation, Failure, FileEdit, Outcome

__all__ = ["outcome_to", "record_from_dict", "record_to_dict"]


# --- the forms of the values records hold ----------------------------------------------------


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


def _action_from(a: Mapping[str, Any]) -> Action:
    return Action(a["text"], a["tool_name"], a["arguments"], a["call_id"])


# --- one table per kind ----------------------------------------------------------------------

_NEEDED: Any = object()
"""The ``default`` of a key every record of its kind has: a reader that misses it refuses."""


class _Key(NamedTuple):
    """One key of a kind's JSON form: the record's field of the same name."""

    name: str
    write: Callable[[Any], Any] | None = None
    """The value's JSON form; None: the value as it is."""
    read: Callable[[Any], Any] | None = None
    """The value from its JSON form (given ``default`` when the key is missing); None: as it is."""
    default: Any = _NEEDED
    """What a reader takes for a missing key; :data:`_NEEDED`: the key must be there."""
    omit: Callable[[Any], bool] | None = None
    """A writer leaves the key out where this is true of the value; None: always written."""


def _or_none(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


def _is_none(value: Any) -> bool:
    return value is None


def _is_false(value: Any) -> bool:
    return not value


def _is_true(value: Any) -> bool:
    return value is True


def _true(value: Any) -> bool:
    return True


def _made(cls: Callable[..., Any]) -> Callable[[Any], Any]:
    """A value read from the dict of its fields by name (``Failure(**d)``)."""
    return lambda d: cls(**d)


_value = attrgetter("value")
_to_dict = methodcaller("to_dict")


def _when_set(
    name: str, write: Callable[[Any], Any] | None = None, read: Callable[[Any], Any] | None = None
) -> _Key:
    """A key added after its kind: left out while None, read as None when missing."""
    return _Key(name, write, read, None, _is_none)


def _maybe(
    name: str, write: Callable[[Any], Any] | None = None, read: Callable[[Any], Any] | None = None
) -> _Key:
    """A key always written, read as None when missing."""
    return _Key(name, write, read, None)


def _mark(name: str) -> _Key:
    """A flag added after its kind: written (as true) only when set, read as "is it true"."""
    return _Key(name, _true, _is_true, False, _is_false)


_STEP = _Key("step_idx")
_INTENT = (_STEP, _Key("intent_id"), _Key("attempt"))
_OP = (_STEP, _Key("op_id"))
_REPLACED = _Key("replaced_chars", default=0, omit=_is_false)
_ERROR = (_Key("error", _error_to, _made(ErrorInfo)), _Key("latency_ms"), _REPLACED)
_FAILURE = _Key("failure", _to_dict, _made(Failure))

_FORMS: dict[type[Any], tuple[_Key, ...]] = {
    ModelIntent: (
        *_INTENT,
        _when_set("model"),
        _when_set("wrap_up", _value, _or_none(StopReason)),
    ),
    ModelResult: (
        *_INTENT,
        _Key("llm_call_id"),
        _Key("reply", _reply_to, _reply_from),
        _Key("latency_ms"),
        _REPLACED,
        _when_set("cost_usd", read=trusted_cost),
    ),
    ModelAttemptFailed: (*_INTENT, *_ERROR, _mark("fallback"), _mark("partial_shown")),
    ModelFailure: (*_INTENT, *_ERROR),
    ActionIntent: (
        *_OP,
        _Key("action", _action_to, _action_from),
        _Key("args_json"),
        _Key("replay_policy", _value, ReplayPolicy),
        _Key("known_tool"),
        _REPLACED,
    ),
    ActionResult: (
        *_OP,
        _Key("outcome", outcome_to, _outcome_from),
        _Key("latency_ms"),
        _REPLACED,
    ),
    ActionUnknown: (*_OP, _Key("detail"), _Key("path"), _Key("attempt")),
    StepWritten: (_Key("step", _to_dict, StepRecord.from_dict), _when_set("active_s")),
    RunEnd: (
        _Key("stop_reason", _value, StopReason),
        _Key("stop_detail"),
        _Key("final_answer"),
        _Key("steps_used"),
        _Key("actions_executed"),
        _Key("ended_at"),
        _maybe("pending_action", _pending_to, _pending_from),
        _maybe("report", _or_none(_to_dict), _or_none(EscalationReport.from_dict)),
        _when_set("totals", _to_dict, _or_none(_made(RunTotals))),
    ),
    LimitsChanged: (_Key("limits", _to_dict, Limits.from_dict),),
    GuardVerdict: (_STEP, _Key("guard"), _Key("steer"), _maybe("feedback")),
    FailureSeen: (
        _STEP,
        _Key("fingerprint"),
        _FAILURE,
        _maybe("action"),
        _Key("round", default=0),
        _Key("known", default=False),
        _Key("failing", list, tuple, ()),
        _Key("changed", list, tuple, ()),
    ),
    FailureKnown: (_STEP, _Key("fingerprint"), _FAILURE),
    TestEdit: (_STEP, _Key("path"), _Key("tampering", list, tuple)),
    ApprovalRequested: (
        *_OP,
        _Key("requested_at"),
        _maybe("expires_at"),
        _when_set("active_s"),
    ),
    ApprovalDecided: (
        *_OP,
        _Key("approved", read=_is_true),
        _maybe("note"),
        _Key("by"),
        _Key("decided_at"),
    ),
    ApprovedActionStarted: _OP,
}

_KINDS: dict[str, tuple[type[Any], tuple[_Key, ...]]] = {
    cls.kind: (cls, keys) for cls, keys in _FORMS.items()
}


def _form(record: Record) -> tuple[_Key, ...]:
    keys = _FORMS.get(type(record))
    if keys is None:  # a subclass of a kind has its kind's form
        keys = next((_FORMS[c] for c in type(record).__mro__ if c in _FORMS), None)
        if keys is None:
            raise TypeError(f"not a journal record: {record!r}")
    return keys


def record_to_dict(record: Record) -> dict[str, Any]:
    """The JSON-ready form of a record, with its ``kind``.

    Raises:
        AttributeError: ``record`` has no ``kind``.
        TypeError: ``record`` is of no kind of :data:`Record` (nor a subclass of one).
    """
    kind = record.kind
    body: dict[str, Any] = {}
    for name, write, _, _, omit in _form(record):
        value = getattr(record, name)
        if omit is None or not omit(value):
            body[name] = value if write is None else write(value)
    body["kind"] = kind
    return body


def record_from_dict(d: Mapping[str, Any]) -> Record:
    """Read :func:`record_to_dict` output.

    Raises:
        JournalError: the kind is unknown or a field is missing or malformed.
    """
    kind = d.get("kind")
    form = _KINDS.get(kind) if isinstance(kind, str) else None
    if form is None:
        raise JournalError(f"unknown journal record kind {kind!r}")
    cls, keys = form
    try:
        values = []
        for name, _, read, default, _ in keys:
            value = d[name] if default is _NEEDED else d.get(name, default)
            values.append(value if read is None else read(value))
        record: Record = cls(*values)
    except JournalError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise JournalError(f"malformed {kind} record: {type(exc).__name__}: {exc}") from exc
    return record
