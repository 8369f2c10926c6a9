"""The kernel's cleaning of what a seam returns: valid values come back as the very same objects
(nothing is copied for them), values with lone surrogates come back cleaned and counted."""

from __future__ import annotations

import pytest

from polyloop import (
    Action,
    ActionStatus,
    Failure,
    FileEdit,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    Outcome,
    ToolCall,
)
from polyloop.kernel.text import (
    clean_action,
    clean_decision,
    clean_error,
    clean_outcome,
    clean_reply,
)
from polyloop.types import ErrorInfo, canonical_json

VALID_REPLIES = [
    ModelReply("I'll read it.", "why", (ToolCall("read_file", '{"path": "a.py"}', "c0"),), "x"),
    ModelReply("é 😀", "ü", (ToolCall("t", {"ключ": ["значение", 1]}, "c1"),), "chatcmpl-é"),
    ModelReply(""),
]


@pytest.mark.parametrize("reply", VALID_REPLIES)
def test_a_valid_reply_is_returned_as_it_is(reply: ModelReply) -> None:
    cleaned, n = clean_reply(reply)
    assert cleaned is reply and n == 0


@pytest.mark.parametrize(
    "action",
    [
        Action('t({"a":1})', "t", {"a": 1}, "c"),
        Action("é", "t", {"é": "ü"}),
        Action("print(1)"),
    ],
)
def test_a_valid_action_is_returned_as_it_is_with_its_canonical_arguments(action: Action) -> None:
    cleaned, args_json, n = clean_action(action)
    assert cleaned is action and n == 0
    assert args_json == (None if action.arguments is None else canonical_json(action.arguments))


def test_an_action_with_lone_surrogates_is_cleaned_and_its_arguments_json_follows() -> None:
    action = Action('t({"\udfff":"\ud800"})', "t\udc00", {"\udfff": "\ud800", "b": 2}, "c\udbff")
    cleaned, args_json, n = clean_action(action)
    assert n == 2 + 2 + 1 + 1  # text, arguments (key and value), tool name, call id
    assert cleaned.arguments == {"\ufffd": "\ufffd", "b": 2}
    assert args_json == canonical_json({"\ufffd": "\ufffd", "b": 2})  # keys sorted after
    assert (cleaned.text, cleaned.tool_name, cleaned.call_id) == (
        't({"\ufffd":"\ufffd"})',
        "t\ufffd",
        "c\ufffd",
    )


def test_valid_decisions_outcomes_and_errors_are_returned_as_they_are() -> None:
    for decision in (FinalAnswer("done é"), InvalidDecision("say more")):
        assert clean_decision(decision) == (decision, 0)
        assert clean_decision(decision)[0] is decision
    failure = Failure("t::x", "AssertionError", "a.py:1", "é")
    outcome = Outcome(ActionStatus.executed, "ok é", failure=failure)
    assert clean_outcome(outcome)[0] is outcome
    info = ErrorInfo("ModelCallError", "rate limited", "rate_limit", True, 2.0)
    assert clean_error(info)[0] is info


def test_outcomes_decisions_and_errors_with_lone_surrogates_are_cleaned_and_counted() -> None:
    failure = Failure("t::\ud800", "E", "a.py:1", "m\udfff")
    outcome = Outcome(ActionStatus.executed, "o\udcff", marker=True, failure=failure)
    cleaned, n = clean_outcome(outcome)
    assert n == 3 and cleaned.marker
    assert (cleaned.observation, cleaned.failure) == (
        "o\ufffd",
        Failure("t::\ufffd", "E", "a.py:1", "m\ufffd"),
    )
    other = Failure("t::\ud800b")
    edit = FileEdit("tests/t\udcff.py", True, ("skip_added",))
    outcome = Outcome(ActionStatus.executed, "ok", failures=(failure, other), edits=(edit,))
    cleaned, n = clean_outcome(outcome)
    assert n == 2 + 1 + 1  # the failure (once, though it is also `failure`), the other, the path
    assert cleaned.failures == (
        Failure("t::\ufffd", "E", "a.py:1", "m\ufffd"),
        Failure("t::\ufffdb"),
    )
    assert cleaned.failure == cleaned.failures[0]
    assert cleaned.edits == (FileEdit("tests/t\ufffd.py", True, ("skip_added",)),)
    assert clean_decision(FinalAnswer("a\ud800")) == (FinalAnswer("a\ufffd"), 1)
    assert clean_decision(InvalidDecision("\udfff")) == (InvalidDecision("\ufffd"), 1)
    info, n = clean_error(ErrorInfo("E", "m\ud800", "k\udfff", True))
    assert (info, n) == (ErrorInfo("E", "m\ufffd", "k\ufffd", True), 2)
