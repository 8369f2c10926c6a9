"""Text from outside the run, made valid Unicode at the seam where it enters.

The model, the interpreter, the environment (and a run-end guard) are the caller's code or
talk to the outside world; what they return may hold code points that are not valid Unicode
(lone surrogates: a JSON ``\\ud800`` escape in a reply, a non-UTF-8 file name decoded with
``surrogateescape``, ...). No journal can write those. The kernel passes every value it gets
back from a seam through one of these functions *before* anything records, measures or acts
on it: each such code point becomes U+FFFD (:func:`polyloop.types.clean_text`), and the
number replaced is recorded with the record that holds the text and summed into the step's
``replaced_chars``. Valid text is returned as the same object, checked without a copy when it
is ASCII: the common case costs a few ``str.isascii`` calls per step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..types import (
    Action,
    Decision,
    ErrorInfo,
    Escalation,
    Failure,
    FileEdit,
    FinalAnswer,
    InvalidDecision,
    MalformedValue,
    ModelReply,
    Outcome,
    ToolCall,
    canonical_json,
    clean_json,
    clean_text,
    json_text,
    nested_deeper,
)

_T = TypeVar("_T")

__all__ = [
    "clean_action",
    "clean_decision",
    "clean_error",
    "clean_escalation",
    "clean_outcome",
    "clean_reply",
]


def _opt(text: str | None) -> tuple[str | None, int]:
    return (None, 0) if text is None else clean_text(text)


def _ascii(text: str | None) -> bool:
    return text is None or text.isascii()


def _ascii_reply(reply: ModelReply) -> bool:
    """All of the reply's text is ASCII (so valid): the common case, checked fast."""
    if not (
        reply.text.isascii()
        and _ascii(reply.reasoning)
        and _ascii(reply.call_id)
        and _ascii(reply.model)
    ):
        return False
    for c in reply.tool_calls:
        a = c.arguments
        if not (type(a) is str and a.isascii() and c.name.isascii() and _ascii(c.id)):
            return False
    return True


def clean_reply(reply: ModelReply) -> tuple[ModelReply, int]:
    """The reply with its text, reasoning, call id, model name and every tool call's name, id and
    arguments (a str, or every key and string in a mapping) cleaned; the count replaced.

    Arguments given as a mapping nested more than ``MAX_NESTING`` levels become their JSON
    text (exactly ``ToolCall.arguments_text``, written without recursion), so that nothing
    after this walks them recursively: the reply is journaled and sent back to the model as
    a string, and the interpreter refuses it as nested too deeply.

    Raises:
        MalformedValue: a mapping of arguments holds a value JSON cannot represent (a set, an
            object, a mapping that contains itself): only a custom model can send that, and
            the reply breaks its contract; the kernel counts it as the attempt's failure."""
    if _ascii_reply(reply):
        return reply, 0
    text, n = clean_text(reply.text)
    reasoning, k = _opt(reply.reasoning)
    n += k
    call_id, k = _opt(reply.call_id)
    n += k
    model, k = _opt(reply.model)
    n += k
    calls = reply.tool_calls
    changed = False
    if calls:
        cleaned = []
        for c in calls:
            name, a = clean_text(c.name)
            cid, b = _opt(c.id)
            args = c.arguments
            if not isinstance(args, str):
                try:
                    if nested_deeper(args):
                        args = json_text(dict(args))
                        changed = True
                    else:
                        canonical_json(args if type(args) is dict else dict(args))
                except (TypeError, ValueError, RecursionError) as exc:
                    raise MalformedValue(
                        f"the arguments of the call to {c.name!r} cannot be written as JSON "
                        f"({exc}): a ToolCall's arguments must be JSON values"
                    ) from None
            args, m = clean_json(args)
            if a or b or m or args is not c.arguments:
                n += a + b + m
                c = ToolCall(name, args, cid)
            cleaned.append(c)
        if n or changed:
            calls = tuple(cleaned)
    if not n and not changed:
        return reply, 0
    return dataclasses.replace(
        reply, text=text, reasoning=reasoning, call_id=call_id, tool_calls=calls, model=model
    ), n


def clean_action(action: Action) -> tuple[Action, str | None, int]:
    """The action with its text, tool name, call id and arguments cleaned, the canonical JSON
    of its (cleaned) arguments (None without arguments), and the count replaced.

    Raises:
        TypeError, ValueError: the arguments are not JSON-representable (as canonical_json).
    """
    args: Mapping[str, Any] | None = action.arguments
    args_json = None if args is None else canonical_json(args if type(args) is dict else dict(args))
    if (
        action.text.isascii()
        and _ascii(args_json)
        and _ascii(action.tool_name)
        and _ascii(action.call_id)
    ):
        return action, args_json, 0
    text, n = clean_text(action.text)
    tool_name, k = _opt(action.tool_name)
    n += k
    call_id, k = _opt(action.call_id)
    n += k
    # The JSON just made holds every key and string of the arguments once: when it is valid,
    # so are they, and the arguments are not walked.
    if args is not None and args_json is not None and clean_text(args_json)[1]:
        args, k = clean_json(args)
        n += k
        args_json = canonical_json(args)  # keys may sort differently once replaced
    if not n:
        return action, args_json, 0
    cleaned = dataclasses.replace(
        action, text=text, tool_name=tool_name, arguments=args, call_id=call_id
    )
    return cleaned, args_json, n


def clean_decision(decision: Decision) -> tuple[Decision, int]:
    """A final answer's text or an invalid decision's feedback cleaned (an action: use
    :func:`clean_action`); anything else is returned as it is, for the caller to refuse."""
    if isinstance(decision, FinalAnswer):
        text, n = clean_text(decision.text)
        return (dataclasses.replace(decision, text=text), n) if n else (decision, 0)
    if isinstance(decision, InvalidDecision):
        feedback, n = clean_text(decision.feedback)
        return (dataclasses.replace(decision, feedback=feedback), n) if n else (decision, 0)
    return decision, 0


def _clean_failure(failure: Failure) -> tuple[Failure, int]:
    check, a = _opt(failure.check)
    error_type, b = _opt(failure.error_type)
    top_frame, c = _opt(failure.top_frame)
    message, d = _opt(failure.message)
    n = a + b + c + d
    return (Failure(check, error_type, top_frame, message), n) if n else (failure, 0)


def _clean_edit(edit: FileEdit) -> tuple[FileEdit, int]:
    path, n = clean_text(edit.path)
    return (dataclasses.replace(edit, path=path), n) if n else (edit, 0)


def clean_outcome(outcome: Outcome) -> tuple[Outcome, int]:
    """The outcome with its observation, failures and edited paths cleaned; the count
    replaced."""
    observation, n = clean_text(outcome.observation)
    failure = outcome.failure
    if failure is None and not n and not outcome.edits and outcome.escalation is None:
        return outcome, 0
    failures, k = _clean_all(outcome.failures, _clean_failure)
    n += k
    if failures and failure == outcome.failures[0]:
        failure = failures[0]  # the same failure, counted once
    elif failure is not None:
        failure, k = _clean_failure(failure)
        n += k
    edits, k = _clean_all(outcome.edits, _clean_edit)
    n += k
    escalation = outcome.escalation
    if escalation is not None:
        escalation, k = clean_escalation(escalation)
        n += k
    if not n:
        return outcome, 0
    cleaned = dataclasses.replace(
        outcome,
        observation=observation,
        failure=failure,
        failures=failures,
        edits=edits,
        escalation=escalation,
    )
    return cleaned, n


def clean_escalation(escalation: Escalation) -> tuple[Escalation, int]:
    """An escalation's reason, source and evidence (every key and string) cleaned."""
    reason, n = clean_text(escalation.reason)
    source, k = clean_text(escalation.source)
    evidence, m = clean_json(escalation.evidence)
    n += k + m
    return (Escalation(reason, evidence, source), n) if n else (escalation, 0)


def _clean_all(
    items: tuple[_T, ...], clean: Callable[[_T], tuple[_T, int]]
) -> tuple[tuple[_T, ...], int]:
    n = 0
    out = []
    for item in items:
        item, k = clean(item)
        n += k
        out.append(item)
    return (tuple(out), n) if n else (items, 0)


def clean_error(info: ErrorInfo) -> tuple[ErrorInfo, int]:
    """A model-call error's class name, message and kind cleaned; the count replaced."""
    type_name, n = clean_text(info.type)
    message, k = clean_text(info.message)
    n += k
    kind, k = clean_text(info.kind)
    n += k
    if not n:
        return info, 0
    return dataclasses.replace(info, type=type_name, message=message, kind=kind), n
