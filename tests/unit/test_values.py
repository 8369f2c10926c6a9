"""The value types that cross the seams check their fields at construction: a field that breaks
the contract raises ``MalformedValue`` (a TypeError and a ValueError) naming the field."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest

from polyloop import (
    Action,
    ActionStatus,
    Failure,
    FileEdit,
    FinalAnswer,
    InvalidDecision,
    MalformedValue,
    ModelReply,
    Outcome,
    PolyLoopError,
    ToolCall,
    Usage,
)

EXECUTED = ActionStatus.executed

BROKEN: dict[str, tuple[Callable[[], Any], str]] = {
    "Outcome.status": (lambda: Outcome("done", "x"), "Outcome.status must be an ActionStatus"),  # type: ignore[arg-type]
    "Outcome.observation": (lambda: Outcome(EXECUTED, None), "Outcome.observation must be a str"),  # type: ignore[arg-type]
    "Outcome.completed": (
        lambda: Outcome(EXECUTED, "x", completed=None),  # type: ignore[arg-type]
        "Outcome.completed must be a bool, got None",
    ),
    "Outcome.completed int": (
        lambda: Outcome(EXECUTED, "x", completed=1),  # type: ignore[arg-type]
        "Outcome.completed must be a bool, got 1 (int)",
    ),
    "Outcome.marker": (
        lambda: Outcome(EXECUTED, "x", marker="yes"),  # type: ignore[arg-type]
        "Outcome.marker must be a bool",
    ),
    "Outcome.synthetic": (
        lambda: Outcome(EXECUTED, "x", synthetic=0),  # type: ignore[arg-type]
        "Outcome.synthetic must be a bool",
    ),
    "Outcome.truncated_chars": (
        lambda: Outcome(EXECUTED, "x", truncated_chars=-1),
        "Outcome.truncated_chars must be an int >= 0, got -1",
    ),
    "Outcome.truncated_chars float": (
        lambda: Outcome(EXECUTED, "x", truncated_chars=1.5),  # type: ignore[arg-type]
        "Outcome.truncated_chars must be an int >= 0",
    ),
    "Outcome.truncated_chars bool": (
        lambda: Outcome(EXECUTED, "x", truncated_chars=True),
        "Outcome.truncated_chars must be an int >= 0",
    ),
    "Outcome.failure": (
        lambda: Outcome(EXECUTED, "x", failure="boom"),  # type: ignore[arg-type]
        "Outcome.failure must be a Failure or None",
    ),
    "Failure.message": (lambda: Failure(message=3), "Failure.message must be a str or None"),  # type: ignore[arg-type]
    "Failure.check": (lambda: Failure(check=b"t"), "Failure.check must be a str or None"),  # type: ignore[arg-type]
    "Action.text": (lambda: Action(None), "Action.text must be a str"),  # type: ignore[arg-type]
    "Action.tool_name": (lambda: Action("t()", 5), "Action.tool_name must be a str or None"),  # type: ignore[arg-type]
    "Action.arguments": (
        lambda: Action("t()", "t", [("a", 1)]),  # type: ignore[arg-type]
        "Action.arguments must be a mapping or None",
    ),
    "Action.call_id": (lambda: Action("t()", "t", {}, 7), "Action.call_id must be a str or None"),  # type: ignore[arg-type]
    "FinalAnswer.text": (lambda: FinalAnswer(None), "FinalAnswer.text must be a str"),  # type: ignore[arg-type]
    "InvalidDecision.feedback": (
        lambda: InvalidDecision(["no"]),  # type: ignore[arg-type]
        "InvalidDecision.feedback must be a str",
    ),
    "ToolCall.name": (lambda: ToolCall(None, {}), "ToolCall.name must be a str"),  # type: ignore[arg-type]
    "ToolCall.arguments": (
        lambda: ToolCall("t", 5),  # type: ignore[arg-type]
        "ToolCall.arguments must be a mapping or a JSON str",
    ),
    "ToolCall.id": (lambda: ToolCall("t", "{}", 1), "ToolCall.id must be a str or None"),  # type: ignore[arg-type]
    "ModelReply.text": (lambda: ModelReply(None), "ModelReply.text must be a str"),  # type: ignore[arg-type]
    "ModelReply.reasoning": (
        lambda: ModelReply("", reasoning=1),  # type: ignore[arg-type]
        "ModelReply.reasoning must be a str or None",
    ),
    "ModelReply.call_id": (
        lambda: ModelReply("", call_id=b"id"),  # type: ignore[arg-type]
        "ModelReply.call_id must be a str or None",
    ),
    "ModelReply.usage": (
        lambda: ModelReply("", usage={"input_tokens": 1}),  # type: ignore[arg-type]
        "ModelReply.usage must be a Usage or None",
    ),
    "ModelReply.tool_calls item": (
        lambda: ModelReply("", tool_calls=({"name": "t"},)),  # type: ignore[arg-type]
        "each of ModelReply.tool_calls must be a ToolCall",
    ),
    "Outcome.failures": (
        lambda: Outcome(EXECUTED, "x", failures=(Failure(), "boom")),  # type: ignore[arg-type]
        "each of Outcome.failures must be a Failure",
    ),
    "Outcome.edits": (
        lambda: Outcome(EXECUTED, "x", edits="a.py"),  # type: ignore[arg-type]
        "Outcome.edits must be a tuple of FileEdit",
    ),
    "FileEdit.path": (lambda: FileEdit(None), "FileEdit.path must be a str"),  # type: ignore[arg-type]
    "FileEdit.test_file": (lambda: FileEdit("a", 1), "FileEdit.test_file must be a bool"),  # type: ignore[arg-type]
    "FileEdit.tampering": (
        lambda: FileEdit("a", True, ("renamed",)),
        "each of FileEdit.tampering must be one of",
    ),
    "ModelReply.tool_calls str": (
        lambda: ModelReply("", tool_calls="t"),  # type: ignore[arg-type]
        "ModelReply.tool_calls must be a sequence of ToolCall",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_field_that_breaks_the_contract_is_refused_at_construction_naming_it(
    name: str,
) -> None:
    build, message = BROKEN[name]
    with pytest.raises(MalformedValue) as info:
        build()
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_malformed_value_is_a_type_and_value_error_of_polyloop() -> None:
    assert issubclass(MalformedValue, PolyLoopError)
    assert issubclass(MalformedValue, TypeError) and issubclass(MalformedValue, ValueError)


def test_the_failures_of_an_outcome_give_its_failure_and_its_failing_set() -> None:
    a, b = Failure("t::a", "AssertionError"), Failure("t::b", "KeyError")
    o = Outcome(EXECUTED, "2 failed", failures=[a, b])  # type: ignore[arg-type]
    assert o.failures == (a, b) and o.failure == a and o.failing == (a, b)
    assert Outcome(EXECUTED, "x", failure=b).failing == (b,)
    assert Outcome(EXECUTED, "x").failing == ()
    edit = FileEdit("tests/t.py", True, ["skip_added"])  # type: ignore[arg-type]
    assert edit.tampering == ("skip_added",)
    assert Outcome(EXECUTED, "x", edits=[edit]).edits == (edit,)  # type: ignore[arg-type]


def test_values_keeping_the_contract_are_built_as_given() -> None:
    failure = Failure("t::x", "AssertionError", "a.py:1", "assert 0")
    o = Outcome("executed", "x", True, True, True, 3, failure)  # type: ignore[arg-type]
    assert o.status is ActionStatus.executed and o.failure is failure
    assert Action("t()", "t", MappingProxyType({"a": 1}), "c").arguments == {"a": 1}
    reply = ModelReply("", "r", [ToolCall("t", "{}")], "c", Usage(1, 2))  # type: ignore[arg-type]
    assert reply.tool_calls == (ToolCall("t", "{}"),)
    assert ToolCall("t", MappingProxyType({})).arguments_text == "{}"
    assert FinalAnswer("a").text == "a" and InvalidDecision("f").feedback == "f"
