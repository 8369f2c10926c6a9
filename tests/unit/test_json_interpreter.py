"""JsonTextInterpreter: one JSON object in the reply text is a tool call or the final answer."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop.interpreters import JsonTextInterpreter
from polyloop.seams import Interpreter
from polyloop.types import (
    DEFAULT_TEMPLATES,
    Action,
    ConfigError,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    Templates,
    ToolCall,
    canonical_json,
)

# Templates whose output shows exactly which template was used and with what.
MARKED = dataclasses.replace(
    Templates(),
    version="test",
    json_expected="EXPECTED key={final_key}",
    json_no_object="NO-OBJECT | {expected}",
    json_malformed="MALFORMED error={error} | {expected}",
    json_not_object="NOT-OBJECT kind={kind} | {expected}",
    json_no_decision="NO-DECISION keys={keys} | {expected}",
    json_conflicting_keys="CONFLICT {first}+{second} | {expected}",
    json_call_and_final="CALL-AND-FINAL key={final_key} | {expected}",
    json_bad_tool="BAD-TOOL key={key} kind={kind} | {expected}",
    json_bad_arguments="BAD-ARGS key={key} name={name} kind={kind} | {expected}",
    json_bad_final="BAD-FINAL key={final_key} kind={kind} | {expected}",
    json_native_tool_calls="NATIVE names={names} | {expected}",
)


def interpret(text: str, **options: Any) -> Any:
    return JsonTextInterpreter(templates=MARKED, **options).interpret(ModelReply(text=text), ())


def feedback(text: str, **options: Any) -> str:
    decision = interpret(text, **options)
    assert isinstance(decision, InvalidDecision), decision
    return str(decision.feedback)


def test_interpreter_implements_the_seam() -> None:
    assert isinstance(JsonTextInterpreter(), Interpreter)


# --- finding the object -------------------------------------------------------------------------


def test_a_bare_object_is_a_tool_call() -> None:
    decision = interpret('{"tool": "count", "arguments": {"n": 3, "by": "a"}}')
    assert decision == Action(
        text='count({"by":"a","n":3})', tool_name="count", arguments={"n": 3, "by": "a"}
    )
    assert decision.call_id is None


def test_prose_around_the_object_is_ignored() -> None:
    text = 'I will count now.\n{"tool": "count", "arguments": {"n": 1}}\nThat should do it.'
    assert interpret(text) == Action('count({"n":1})', "count", {"n": 1})


@pytest.mark.parametrize("tag", ["json", "JSON", ""])
def test_a_fenced_block_with_prose_around_it(tag: str) -> None:
    text = f'Let me look.\n```{tag}\n{{"tool": "read", "arguments": {{"path": "a.txt"}}}}\n```\nOk?'
    assert interpret(text) == Action('read({"path":"a.txt"})', "read", {"path": "a.txt"})


def test_nested_braces_and_braces_inside_strings() -> None:
    text = (
        'Here: {"tool": "write", "arguments": {"text": "a } b { c \\" }", '
        '"meta": {"deep": {"er": [1, {"x": "}"}]}}}} trailing } brace'
    )
    decision = interpret(text)
    assert isinstance(decision, Action)
    assert decision.arguments == {
        "text": 'a } b { c " }',
        "meta": {"deep": {"er": [1, {"x": "}"}]}},
    }
    assert decision.text == 'write({"meta":{"deep":{"er":[1,{"x":"}"}]}},"text":"a } b { c \\" }"})'


def test_prose_braces_before_the_object_are_skipped() -> None:
    text = 'Sets look like {1, 2}; a {placeholder} too. {"tool": "t", "arguments": {}}'
    assert interpret(text) == Action("t({})", "t", {})


def test_the_first_fenced_block_wins_over_an_earlier_bare_object() -> None:
    text = (
        'Not this: {"tool": "bare", "arguments": {}}\n'
        '```json\n{"tool": "first", "arguments": {}}\n```\n'
        '```json\n{"tool": "second", "arguments": {}}\n```'
    )
    decision = interpret(text)
    assert isinstance(decision, Action)
    assert decision.tool_name == "first"


def test_several_bare_objects_the_first_that_parses_wins() -> None:
    text = '{"tool": "a", "arguments": {}} or maybe {"tool": "b", "arguments": {}}'
    decision = interpret(text)
    assert isinstance(decision, Action)
    assert decision.tool_name == "a"


def test_code_in_other_languages_is_not_read() -> None:
    text = 'Example:\n```python\nd = {"tool": "evil", "arguments": {}}\n```\n{"final_answer": "ok"}'
    assert interpret(text) == FinalAnswer("ok")


def test_an_untagged_block_that_is_not_json_is_skipped() -> None:
    text = '```\n$ ls -la\n```\n{"tool": "t", "arguments": {}}'
    assert interpret(text) == Action("t({})", "t", {})


def test_an_unclosed_fence_is_read_as_prose() -> None:
    text = '```json\n{"tool": "t", "arguments": {"a": 1}}'
    assert interpret(text) == Action('t({"a":1})', "t", {"a": 1})


def test_unicode_is_kept() -> None:
    decision = interpret('{"tool": "say", "arguments": {"text": "héllo ✓"}}')
    assert isinstance(decision, Action)
    assert decision.text == 'say({"text":"héllo ✓"})'


# --- no parseable object ------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n", "I am done, thanks.", "use {curly} braces"])
def test_no_object_is_invalid(text: str) -> None:
    assert feedback(text) == "NO-OBJECT | EXPECTED key=final_answer"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"tool": "t", "arguments": {"a": 1}', "Expecting ',' delimiter"),  # truncated
        ("{'tool': 't'}", "Expecting property name enclosed in double quotes"),
        ('{"tool": "t",}', "Expecting property name"),
        ('```json\n{"tool": "t" "arguments": {}}\n```', "Expecting ',' delimiter"),
        ('```json\n{"tool": "t"}\n{"tool": "u"}\n```', "Extra data"),
        ('{"tool": "t", "arguments": {"x": NaN}}', "NaN is not valid JSON"),
    ],
)
def test_malformed_json_is_invalid_with_the_parser_error(text: str, error: str) -> None:
    message = feedback(text)
    assert message.startswith(f"MALFORMED error={error}")
    assert message.endswith("| EXPECTED key=final_answer")


def test_a_malformed_object_does_not_make_its_inner_object_the_decision() -> None:
    assert feedback('{"tool": "t", "arguments": {"a": 1},}').startswith("MALFORMED")


def test_hostile_nesting_is_invalid_not_a_crash() -> None:
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    assert feedback(deep).startswith("MALFORMED")
    assert feedback("{" * 100_000).startswith("NO-OBJECT")  # no key: not even meant as JSON


@pytest.mark.parametrize(
    ("block", "kind"),
    [("[1, 2]", "an array"), ('"hi"', "a string"), ("3", "a number"), ("null", "null")],
)
def test_a_json_block_that_is_not_an_object_is_invalid(block: str, kind: str) -> None:
    assert (
        feedback(f"```json\n{block}\n```") == f"NOT-OBJECT kind={kind} | EXPECTED key=final_answer"
    )


# --- the shape of the object --------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "t", "args": {"a": 1}}',
        '{"tool": "t", "args": {"a": 1}}',
        '{"name": "t", "arguments": {"a": 1}}',
    ],
)
def test_name_and_args_are_aliases(text: str) -> None:
    assert interpret(text) == Action('t({"a":1})', "t", {"a": 1})


def test_missing_arguments_mean_none() -> None:
    assert interpret('{"tool": "ping"}') == Action("ping({})", "ping", {})


def test_extra_keys_are_ignored() -> None:
    text = '{"thought": "count first", "tool": "count", "arguments": {}}'
    assert interpret(text) == Action("count({})", "count", {})


def test_the_final_answer_form() -> None:
    assert interpret('{"final_answer": "  42\\n"}') == FinalAnswer("  42\n")


def test_the_final_key_is_configurable() -> None:
    assert interpret('{"answer": "42"}', final_key="answer") == FinalAnswer("42")
    assert feedback('{"final_answer": "42"}', final_key="answer") == (
        'NO-DECISION keys="final_answer" | EXPECTED key=answer'
    )


@pytest.mark.parametrize("final_key", ["", " ", "tool", "name", "arguments", "args"])
def test_a_final_key_that_cannot_work_is_refused(final_key: str) -> None:
    with pytest.raises(ConfigError, match="final_key"):
        JsonTextInterpreter(final_key=final_key)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{}", "NO-DECISION keys=(none)"),
        ('{"arguments": {}}', "NO-DECISION"),  # arguments make it a call, without a tool
        ('{"answer": "x", "n": 1}', 'NO-DECISION keys="answer", "n"'),
        ('{"tool": "a", "name": "b"}', 'CONFLICT "tool"+"name"'),
        ('{"tool": "a", "args": {}, "arguments": {}}', 'CONFLICT "arguments"+"args"'),
        ('{"tool": "a", "final_answer": "x"}', "CALL-AND-FINAL key=final_answer"),
        ('{"arguments": {}, "final_answer": "x"}', "CALL-AND-FINAL"),
        ('{"tool": 3}', "BAD-TOOL key=tool kind=a number"),
        ('{"name": ""}', "BAD-TOOL key=name kind=an empty string"),
        ('{"tool": null, "arguments": {}}', "BAD-TOOL key=tool kind=null"),
        (
            '{"tool": "t", "arguments": "{\\"a\\": 1}"}',
            "BAD-ARGS key=arguments name=t kind=a string",
        ),
        ('{"tool": "t", "args": [1]}', "BAD-ARGS key=args name=t kind=an array"),
        ('{"tool": "t", "arguments": null}', "BAD-ARGS key=arguments name=t kind=null"),
        ('{"final_answer": 42}', "BAD-FINAL key=final_answer kind=a number"),
        ('{"final_answer": {"text": "x"}}', "BAD-FINAL key=final_answer kind=an object"),
        ('{"final_answer": "  "}', "BAD-FINAL key=final_answer kind=an empty string"),
        ('{"final_answer": null}', "BAD-FINAL key=final_answer kind=null"),
    ],
)
def test_wrong_shapes_are_invalid(text: str, expected: str) -> None:
    message = feedback(text)
    assert message.startswith(expected)
    assert message.endswith("| EXPECTED key=final_answer")


def test_many_keys_are_shown_capped() -> None:
    obj = "{" + ", ".join(f'"k{i}": {i}' for i in range(30)) + "}"
    message = feedback(obj)
    assert '"k9", ...' in message and '"k10"' not in message


def test_unknown_tool_names_are_actions_not_invalid_decisions() -> None:
    specs = ({"type": "function", "function": {"name": "real", "parameters": {}}},)
    reply = ModelReply(text='{"tool": "imaginary", "arguments": {}}')
    decision = JsonTextInterpreter().interpret(reply, specs)
    assert decision == Action("imaginary({})", "imaginary", {})


# --- native tool calls ---------------------------------------------------------------------------


def test_native_tool_calls_are_invalid_even_with_valid_json_text() -> None:
    reply = ModelReply(
        text='{"tool": "t", "arguments": {}}',
        tool_calls=(ToolCall("a", {}, "1"), ToolCall("b", "{}", "2")),
    )
    decision = JsonTextInterpreter(templates=MARKED).interpret(reply, ())
    assert decision == InvalidDecision("NATIVE names='a', 'b' | EXPECTED key=final_answer")


# --- the default wording --------------------------------------------------------------------------

INVALID_REPLIES = [
    "",
    "no json here",
    '{"tool": "t", "arguments": {',
    "```json\n[1]\n```",
    "{}",
    '{"tool": "a", "name": "b"}',
    '{"tool": "a", "final_answer": "x"}',
    '{"tool": 1}',
    '{"tool": "t", "arguments": 1}',
    '{"final_answer": 1}',
]


@pytest.mark.parametrize("text", INVALID_REPLIES)
def test_every_default_feedback_says_what_to_send_instead(text: str) -> None:
    decision = JsonTextInterpreter().interpret(ModelReply(text=text), ())
    assert isinstance(decision, InvalidDecision)
    assert decision.feedback.strip()
    assert decision.feedback.endswith(
        DEFAULT_TEMPLATES.json_expected.format(final_key="final_answer")
    )
    # Both forms, with a tiny example of each.
    assert '{"tool": "read_file", "arguments": {"path": "notes.txt"}}' in decision.feedback
    assert '{"final_answer": "' in decision.feedback


def test_default_feedback_for_native_calls_mentions_the_text_form() -> None:
    reply = ModelReply(tool_calls=(ToolCall("search", {}),))
    decision = JsonTextInterpreter(final_key="done").interpret(reply, ())
    assert isinstance(decision, InvalidDecision)
    assert "'search'" in decision.feedback and "not executed" in decision.feedback
    assert '{"done": "' in decision.feedback


def test_instructions_are_the_expected_form() -> None:
    assert JsonTextInterpreter(final_key="answer").instructions == (
        DEFAULT_TEMPLATES.json_expected.format(final_key="answer")
    )


def test_same_reply_gives_the_same_decision() -> None:
    reply = ModelReply(text='ok\n```json\n{"tool": "w", "arguments": {"b": 2, "a": 1}}\n```')
    interpreter = JsonTextInterpreter()
    assert interpreter.interpret(reply, ()) == interpreter.interpret(reply, ())


JSON_PIECES = st.sampled_from(
    [
        '{"tool": "t"',
        '"arguments": {',
        "}",
        "{",
        '"',
        "\\",
        "```json\n",
        "\n```",
        '"final_answer"',
        ":",
        ",",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(JSON_PIECES, st.text(max_size=5)), max_size=30))
def test_any_text_gives_a_decision_never_an_exception(pieces: list[str]) -> None:
    interpreter = JsonTextInterpreter()
    decision = interpreter.interpret(ModelReply(text="".join(pieces)), ())
    assert isinstance(decision, Action | FinalAnswer | InvalidDecision)
    if isinstance(decision, InvalidDecision):
        assert decision.feedback.endswith(interpreter.instructions)
    if isinstance(decision, Action):
        assert decision.text == f"{decision.tool_name}({canonical_json(decision.arguments)})"
