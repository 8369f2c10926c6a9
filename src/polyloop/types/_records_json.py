"""The canonical JSON of journal records, made fast for the records every step writes.

``record_json(r) == canonical_json(record_to_dict(r))``, byte for byte, for every record: durable
journals store it as the body of each ``journal`` row.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from ._canonical import canonical_json
from ._model_io import ModelReply, ToolCall
from ._records import (
    ActionIntent,
    ActionResult,
    ModelIntent,
    ModelResult,
    Record,
    StepWritten,
)
from ._records_form import outcome_to, record_to_dict
from ._step import StepRecord
from ._values import Outcome

__all__ = ["record_json"]


# --- canonical JSON of the records every step writes -----------------------------------------
#
# ``record_json(r) == canonical_json(record_to_dict(r))``, byte for byte, for every record. The
# hot kinds are written by hand: each encoder below makes the same conversions as the matching
# ``_*_to`` helper (``dict(arguments)``, ``.value`` of an enum, ...), then writes the keys in
# sorted order, with each value exactly as canonical_json's encoder writes it (_json_value).


_json_str: Callable[[str], str] = json.encoder.encode_basestring
"""A str as canonical_json writes it: its encoder calls this very function for every str
(str subclasses such as StrEnum members included), with ``ensure_ascii=False`` escaping."""


def _json_value(v: Any) -> str:
    """One value exactly as canonical_json writes it inside a record. The exact types a record
    holds are written here as its encoder writes them (``int.__repr__`` and ``float.__repr__``,
    which ``repr`` is for these exact types); anything else (non-finite floats, int, float and
    str subclasses, containers, objects JSON cannot represent) goes through canonical_json."""
    t = type(v)
    if t is str:
        return _json_str(v)
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if t is int or (t is float and math.isfinite(v)):
        return repr(v)
    return canonical_json(v)


def _model_intent_json(r: ModelIntent) -> str:
    model = "" if r.model is None else f'"model":{_json_value(r.model)},'
    w = r.wrap_up
    wrap = "" if w is None else f',"wrap_up":{_json_value(w.value)}'
    return (
        f'{{"attempt":{_json_value(r.attempt)},"intent_id":{_json_value(r.intent_id)},'
        f'"kind":"model_intent",{model}"step_idx":{_json_value(r.step_idx)}{wrap}}}'
    )


def _tool_call_json(c: ToolCall) -> str:
    a = c.arguments
    arguments = a if isinstance(a, str) else dict(a)
    return (
        f'{{"arguments":{_json_value(arguments)},"id":{_json_value(c.id)},'
        f'"name":{_json_value(c.name)}}}'
    )


def _reply_json(r: ModelReply) -> str:
    calls = ",".join([_tool_call_json(c) for c in r.tool_calls])
    u = r.usage
    if u is None:
        usage = "null"
    else:
        n_cached, n_reasoning, cost = u.cached_tokens, u.reasoning_tokens, u.cost_usd
        cached = "" if n_cached is None else f'"cached_tokens":{_json_value(n_cached)},'
        cost_key = "" if cost is None else f'"cost_usd":{_json_value(cost)},'
        reasoning = "" if n_reasoning is None else f',"reasoning_tokens":{_json_value(n_reasoning)}'

        usage = (
            f'{{{cached}{cost_key}"input_tokens":{_json_value(u.input_tokens)},'
            f'"output_tokens":{_json_value(u.output_tokens)}{reasoning}}}'
        )
    model = "" if r.model is None else f'"model":{_json_value(r.model)},'
    return (
        f'{{"call_id":{_json_value(r.call_id)},{model}"reasoning":{_json_value(r.reasoning)},'
        f'"text":{_json_value(r.text)},"tool_calls":[{calls}],"usage":{usage}}}'
    )


def _replaced_json(n: Any) -> str:
    """The ``replaced_chars`` key of a record and its comma, or "" where record_to_dict leaves
    it out (0)."""
    return f'"replaced_chars":{_json_value(n)},' if n else ""


def _model_result_json(r: ModelResult) -> str:
    cost = "" if r.cost_usd is None else f'"cost_usd":{_json_value(r.cost_usd)},'
    return (
        f'{{"attempt":{_json_value(r.attempt)},{cost}"intent_id":{_json_value(r.intent_id)},'
        f'"kind":"model_result","latency_ms":{_json_value(r.latency_ms)},'
        f'"llm_call_id":{_json_value(r.llm_call_id)},{_replaced_json(r.replaced_chars)}'
        f'"reply":{_reply_json(r.reply)},"step_idx":{_json_value(r.step_idx)}}}'
    )


def _action_intent_json(r: ActionIntent) -> str:
    a = r.action
    arguments = None if a.arguments is None else dict(a.arguments)
    return (
        f'{{"action":{{"arguments":{_json_value(arguments)},"call_id":{_json_value(a.call_id)},'
        f'"text":{_json_value(a.text)},"tool_name":{_json_value(a.tool_name)}}},'
        f'"args_json":{_json_value(r.args_json)},"kind":"action_intent",'
        f'"known_tool":{_json_value(r.known_tool)},"op_id":{_json_value(r.op_id)},'
        f'{_replaced_json(r.replaced_chars)}"replay_policy":{_json_value(r.replay_policy.value)},'
        f'"step_idx":{_json_value(r.step_idx)}}}'
    )


def _outcome_json(o: Outcome) -> str:
    if o.failures or o.edits or o.escalation:  # a test run, an edit: the reference path
        return canonical_json(outcome_to(o))
    f = o.failure
    failure = (
        "null"
        if f is None
        else f'{{"check":{_json_value(f.check)},"error_type":{_json_value(f.error_type)},'
        f'"message":{_json_value(f.message)},"top_frame":{_json_value(f.top_frame)}}}'
    )
    return (
        f'{{"completed":{_json_value(o.completed)},"failure":{failure},'
        f'"marker":{_json_value(o.marker)},"observation":{_json_value(o.observation)},'
        f'"status":{_json_value(o.status.value)},"synthetic":{_json_value(o.synthetic)},'
        f'"truncated_chars":{_json_value(o.truncated_chars)}}}'
    )


def _action_result_json(r: ActionResult) -> str:
    return (
        f'{{"kind":"action_result","latency_ms":{_json_value(r.latency_ms)},'
        f'"op_id":{_json_value(r.op_id)},"outcome":{_outcome_json(r.outcome)},'
        f'{_replaced_json(r.replaced_chars)}"step_idx":{_json_value(r.step_idx)}}}'
    )


def _step_json(s: StepRecord) -> str:
    """``canonical_json(s.to_dict())``: one key per StepRecord field, in sorted order."""
    if type(s) is not StepRecord:  # a subclass may change to_dict
        return canonical_json(s.to_dict())
    status = s.action_status
    return (
        f'{{"action":{_json_value(s.action)},'
        f'"action_status":{_json_value(None if status is None else status.value)},'
        f'"completed":{_json_value(s.completed)},"llm_call_id":{_json_value(s.llm_call_id)},'
        f'"model":{_json_value(s.model)},'
        f'"observation":{_json_value(s.observation)},'
        f'"observation_synthetic":{_json_value(s.observation_synthetic)},'
        f'"observation_truncated_chars":{_json_value(s.observation_truncated_chars)},'
        f'"outcome_unknown":{_json_value(s.outcome_unknown)},'
        f'"parse_error":{_json_value(s.parse_error)},"parse_ok":{_json_value(s.parse_ok)},'
        f'"prompt_chars":{_json_value(s.prompt_chars)},'
        f'"raw_response":{_json_value(s.raw_response)},'
        f'"reasoning_chars":{_json_value(s.reasoning_chars)},'
        f'"replaced_chars":{_json_value(s.replaced_chars)},'
        f'"response_chars":{_json_value(s.response_chars)},'
        f'"schema_version":{_json_value(s.schema_version)},'
        f'"step_idx":{_json_value(s.step_idx)},"step_wall_ms":{_json_value(s.step_wall_ms)},'
        f'"tool_args_json":{_json_value(s.tool_args_json)},'
        f'"tool_name":{_json_value(s.tool_name)},"wrap_up":{_json_value(s.wrap_up)}}}'
    )


def _step_written_json(r: StepWritten) -> str:
    if r.active_s is None:
        return f'{{"kind":"step","step":{_step_json(r.step)}}}'
    return f'{{"active_s":{_json_value(r.active_s)},"kind":"step","step":{_step_json(r.step)}}}'


_HOT_KINDS: dict[type[Any], Callable[[Any], str]] = {
    ModelIntent: _model_intent_json,
    ModelResult: _model_result_json,
    ActionIntent: _action_intent_json,
    ActionResult: _action_result_json,
    StepWritten: _step_written_json,
}


def record_json(record: Record) -> str:
    """canonical_json(record_to_dict(record)), byte for byte, but faster for the records every
    step writes.

    The invariant is exact equality, for every record and every field value, and the same
    exception where the reference raises (TypeError for a value JSON cannot represent,
    ValueError for a cycle or an int too long to print). The five kinds every step writes
    (model intent and result, action intent and result, step) are encoded by hand, several
    times faster; subclasses and the other kinds take the reference path.

    Raises:
        TypeError: the record holds something JSON cannot represent.
        ValueError: the record holds a value that contains itself, or an int too long to
            print (``sys.set_int_max_str_digits``).
    """
    encode = _HOT_KINDS.get(type(record))
    if encode is not None:
        try:
            return encode(record)
        except Exception:
            # The reference path below raises the same exception the reference would, with
            # its message (or, should the fast path ever refuse a value, encodes it).
            pass
    return canonical_json(record_to_dict(record))
