"""NativeToolCallInterpreter: one tool call is an action, plain text a final answer."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from polyloop.interpreters import NativeToolCallInterpreter
from polyloop.seams import Interpreter
from polyloop.types import (
    DEFAULT_TEMPLATES,
    MAX_NESTING,
    Action,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    Templates,
    ToolCall,
)

# Templates whose output shows exactly which template was used and with what.
MARKED = dataclasses.replace(
    Templates(),
    version="test",
    malformed_arguments="MALFORMED name={name} error={error}",
    arguments_too_deep="TOO-DEEP name={name} limit={limit}",
    several_tool_calls="SEVERAL count={count} names={names}",
    empty_reply="EMPTY",
    text_without_tool_call="NO-CALL",
)


def reply(*calls: ToolCall, text: str = "") -> ModelReply:
    return ModelReply(text=text, tool_calls=calls)


def interpret(r: ModelReply, **options: Any) -> Any:
    return NativeToolCallInterpreter(templates=MARKED, **options).interpret(r, ())


def test_interpreter_implements_the_seam() -> None:
    assert isinstance(NativeToolCallInterpreter(), Interpreter)


def test_one_call_with_dict_arguments_is_an_action() -> None:
    decision = interpret(reply(ToolCall("count", {"n": 3, "by": "a"}, "call_abc")))
    assert decision == Action(
        text='count({"by":"a","n":3})',
        tool_name="count",
        arguments={"n": 3, "by": "a"},
        call_id="call_abc",
    )


def test_json_string_arguments_are_parsed_and_shown_canonically() -> None:
    decision = interpret(reply(ToolCall("write", '{ "text": "héllo",  "a": [1, 2] }', "c1")))
    assert decision == Action(
        text='write({"a":[1,2],"text":"héllo"})',
        tool_name="write",
        arguments={"text": "héllo", "a": [1, 2]},
        call_id="c1",
    )


@pytest.mark.parametrize("raw", ["", "   ", "\n\t"])
def test_blank_argument_string_means_no_arguments(raw: str) -> None:
    decision = interpret(reply(ToolCall("noop", raw, "c1")))
    assert decision == Action(text="noop({})", tool_name="noop", arguments={}, call_id="c1")


@pytest.mark.parametrize("call_id", [None, ""])
def test_missing_call_id_is_none(call_id: str | None) -> None:
    decision = interpret(reply(ToolCall("noop", {}, call_id)))
    assert isinstance(decision, Action)
    assert decision.call_id is None


def test_malformed_json_arguments_are_an_invalid_decision() -> None:
    decision = interpret(reply(ToolCall("write", '{"text": "unterminated', "c1")))
    assert isinstance(decision, InvalidDecision)
    assert decision.feedback.startswith("MALFORMED name=write error=Unterminated string")


@pytest.mark.parametrize(
    ("raw", "kind"),
    [("[1, 2]", "an array"), ("3", "a number"), ("null", "null"), ('"x"', "a string")],
)
def test_json_that_is_not_an_object_is_an_invalid_decision(raw: str, kind: str) -> None:
    decision = interpret(reply(ToolCall("write", raw)))
    assert decision == InvalidDecision(
        f"MALFORMED name=write error=expected a JSON object, got {kind}"
    )


def test_arguments_nested_too_deeply_to_parse_are_an_invalid_decision() -> None:
    decision = interpret(reply(ToolCall("write", "[" * 100_000)))
    assert decision == InvalidDecision("TOO-DEEP name=write limit=100")


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize("form", ["mapping", "json_text"])
def test_arguments_nested_past_max_nesting_are_refused_before_anything_recursive(
    form: str,
) -> None:
    """Up to ``MAX_NESTING`` levels (the arguments object is the first) is an action; one more,
    as a mapping or as JSON text (brackets inside strings do not count), is refused."""
    for levels, refused in ((MAX_NESTING, False), (MAX_NESTING + 1, True), (990, True)):
        value = _nested(levels)
        text = '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)
        decision = interpret(reply(ToolCall("write", value if form == "mapping" else text)))
        if refused:
            assert decision == InvalidDecision(f"TOO-DEEP name=write limit={MAX_NESTING}")
        else:
            assert isinstance(decision, Action) and decision.arguments == value
    brackets = {"text": "[" * 5_000, "more": "{" * 5_000}
    assert interpret(reply(ToolCall("write", json.dumps(brackets)))).arguments == brackets


@pytest.mark.parametrize("raw", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}'])
def test_non_json_constants_are_an_invalid_decision(raw: str) -> None:
    decision = interpret(reply(ToolCall("write", raw)))
    assert isinstance(decision, InvalidDecision)
    assert "is not valid JSON" in decision.feedback


def test_default_wording_for_malformed_arguments() -> None:
    decision = NativeToolCallInterpreter().interpret(reply(ToolCall("write", "{")), ())
    assert isinstance(decision, InvalidDecision)
    assert decision.feedback.startswith("Your call to 'write' had arguments that are not valid")


def test_two_calls_are_an_invalid_decision() -> None:
    decision = interpret(reply(ToolCall("a", {}, "1"), ToolCall("b", "{}", "2")))
    assert decision == InvalidDecision("SEVERAL count=2 names=a, b")


def test_fifty_calls_are_one_invalid_decision() -> None:
    calls = tuple(ToolCall(f"t{i}", {}, f"id{i}") for i in range(50))
    decision = interpret(reply(*calls))
    assert isinstance(decision, InvalidDecision)
    assert decision.feedback.startswith("SEVERAL count=50 names=t0, t1, ")
    assert decision.feedback.endswith("t48, t49")


def test_several_calls_with_default_wording() -> None:
    decision = NativeToolCallInterpreter().interpret(
        reply(ToolCall("a", {}), ToolCall("a", {})), ()
    )
    assert decision == InvalidDecision(
        DEFAULT_TEMPLATES.several_tool_calls.format(count=2, names="a, a")
    )


def test_text_without_call_is_the_final_answer_unchanged() -> None:
    assert interpret(reply(text="  The answer is 42.\n")) == FinalAnswer("  The answer is 42.\n")


def test_text_without_call_is_invalid_when_text_is_not_final() -> None:
    assert interpret(reply(text="I think so."), text_is_final=False) == InvalidDecision("NO-CALL")


@pytest.mark.parametrize("text_is_final", [True, False])
@pytest.mark.parametrize("text", ["", "   \n"])
def test_empty_reply_is_an_invalid_decision(text: str, text_is_final: bool) -> None:
    decision = interpret(reply(text=text), text_is_final=text_is_final)
    assert decision == InvalidDecision("EMPTY")


def test_reasoning_alone_is_an_empty_reply() -> None:
    decision = interpret(ModelReply(text="", reasoning="let me think"))
    assert decision == InvalidDecision("EMPTY")


def test_text_next_to_one_call_does_not_stop_the_action() -> None:
    decision = interpret(reply(ToolCall("noop", {}, "c"), text="Let me check."))
    assert isinstance(decision, Action)
    assert decision.tool_name == "noop"


def test_unknown_tool_names_are_actions_not_invalid_decisions() -> None:
    specs = ({"type": "function", "function": {"name": "real", "parameters": {}}},)
    decision = NativeToolCallInterpreter().interpret(reply(ToolCall("imaginary", "{}")), specs)
    assert decision == Action(text="imaginary({})", tool_name="imaginary", arguments={})


def test_same_reply_gives_the_same_decision() -> None:
    r = reply(ToolCall("w", '{"b": 2, "a": 1}', "x"))
    interpreter = NativeToolCallInterpreter()
    assert interpreter.interpret(r, ()) == interpreter.interpret(r, ())
