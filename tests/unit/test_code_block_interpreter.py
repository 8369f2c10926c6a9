"""CodeBlockInterpreter: the first fenced code block is the action; a final line ends the run."""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop.interpreters import CodeBlockInterpreter
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
)

# Templates whose output shows exactly which template was used and with what.
MARKED = dataclasses.replace(
    Templates(),
    version="test",
    code_block_expected="EXPECTED fence={fence}{final}",
    code_block_final_line=" +FINAL-LINE",
    code_block_submit=" +SUBMIT marker={marker}",
    code_block_missing="MISSING | {expected}",
    code_block_wrong_language="WRONG fence={fence} found={found} | {expected}",
    code_block_unclosed="UNCLOSED | {expected}",
    code_block_empty="EMPTY | {expected}",
    code_block_native_tool_calls="NATIVE names={names} | {expected}",
)


def interpret(text: str, **options: Any) -> Any:
    return CodeBlockInterpreter(templates=MARKED, **options).interpret(ModelReply(text=text), ())


def code(text: str, **options: Any) -> str:
    decision = interpret(text, **options)
    assert isinstance(decision, Action), decision
    assert (decision.tool_name, decision.arguments, decision.call_id) == (None, None, None)
    return decision.text


def feedback(text: str, **options: Any) -> str:
    decision = interpret(text, **options)
    assert isinstance(decision, InvalidDecision), decision
    return str(decision.feedback)


def test_interpreter_implements_the_seam() -> None:
    assert isinstance(CodeBlockInterpreter(), Interpreter)


# --- the action ---------------------------------------------------------------------------------


def test_the_code_of_a_block_is_the_action_exactly() -> None:
    text = "Let me try.\n```python\nimport os\n\nprint( os.getcwd() )  \n```\nThen we see."
    assert code(text) == "import os\n\nprint( os.getcwd() )  "


def test_blank_lines_inside_the_block_are_kept() -> None:
    assert code("```\n\nx = 1\n\n```") == "\nx = 1\n"


def test_crlf_line_endings_are_kept_inside() -> None:
    assert code("```python\r\na = 1\r\nb = 2\r\n```\r\n") == "a = 1\r\nb = 2"


def test_longer_fences_can_hold_shorter_ones() -> None:
    text = "````markdown\n```python\nx\n```\n````"
    assert code(text) == "```python\nx\n```"


def test_an_indented_fence_strips_its_indent_from_the_code() -> None:
    text = "1. Run this:\n   ```python\n   if x:\n       y()\n  z\n   ```"
    assert code(text) == "if x:\n    y()\nz"


def test_several_blocks_the_first_wins() -> None:
    assert code("```\nfirst\n```\ntext\n```\nsecond\n```") == "first"


def test_an_inline_triple_backtick_is_not_a_fence() -> None:
    text = "Use ```print(1)``` here\n```python\nprint(2)\n```"
    assert code(text) == "print(2)"


# --- language filtering -------------------------------------------------------------------------


def test_language_filter_skips_other_blocks() -> None:
    text = "```bash\nls\n```\n```Python title=x.py\nprint(1)\n```"
    assert code(text, language="python") == "print(1)"


def test_several_languages_may_count() -> None:
    assert code("```py\nprint(1)\n```", language=("python", "py")) == "print(1)"


def test_without_language_any_block_counts() -> None:
    assert code("```bash\nls -la\n```") == "ls -la"


def test_blocks_in_other_languages_only_are_invalid() -> None:
    text = "```bash\nls\n```\n```\nx\n```\n```bash\npwd\n```"
    assert feedback(text, language="python") == (
        "WRONG fence=```python found=```bash, ``` | EXPECTED fence=```python +FINAL-LINE"
    )


@pytest.mark.parametrize("language", ["", " ", ()])
def test_a_blank_language_is_refused(language: Any) -> None:
    with pytest.raises(ConfigError, match="language"):
        CodeBlockInterpreter(language=language)


# --- the final answer ---------------------------------------------------------------------------


def test_the_final_answer_line() -> None:
    assert interpret("Done.\nFINAL ANSWER: 42") == FinalAnswer("42")


def test_the_final_answer_runs_to_the_end_of_the_reply() -> None:
    assert interpret("FINAL ANSWER:\nline one\nline two\n\n") == FinalAnswer("line one\nline two")


def test_the_final_answer_must_start_a_line() -> None:
    assert feedback("my FINAL ANSWER: 42").startswith("MISSING")


def test_a_blank_final_answer_does_not_count() -> None:
    assert feedback("FINAL ANSWER:   \n").startswith("MISSING")


def test_a_code_block_wins_over_a_final_line() -> None:
    text = "```python\nprint(6 * 7)\n```\nFINAL ANSWER: 42"
    assert code(text) == "print(6 * 7)"
    assert code("FINAL ANSWER: 42\n```python\nprint(6 * 7)\n```") == "print(6 * 7)"


def test_the_final_pattern_is_configurable() -> None:
    assert interpret("<answer>42</answer>", final_pattern=r"<answer>(.*?)</answer>") == (
        FinalAnswer("42")
    )
    compiled = re.compile(r"answer is (\d+)", re.IGNORECASE)
    assert interpret("The Answer is 42.", final_pattern=compiled) == FinalAnswer("42")
    assert interpret("DONE", final_pattern=r"^DONE$") == FinalAnswer("DONE")  # no group


def test_the_final_form_may_be_a_function() -> None:
    def final(text: str) -> str | None:
        return text.removeprefix("ANSWER=") if text.startswith("ANSWER=") else None

    assert interpret("ANSWER=42", final_pattern=final) == FinalAnswer("42")
    assert feedback("42", final_pattern=final).startswith("MISSING")


def test_without_a_final_form_text_is_never_final() -> None:
    assert feedback("FINAL ANSWER: 42", final_pattern=None) == "MISSING | EXPECTED fence=```"


@pytest.mark.parametrize("pattern", ["(unclosed", 42])
def test_a_bad_final_pattern_is_refused(pattern: Any) -> None:
    with pytest.raises(ConfigError, match="final_pattern"):
        CodeBlockInterpreter(final_pattern=pattern)


def test_a_submit_marker_block_is_the_final_answer() -> None:
    text = "```\nSUBMIT\nThe fix is in place.\nAll tests pass.\n```"
    assert interpret(text, submit_marker="SUBMIT") == FinalAnswer(
        "The fix is in place.\nAll tests pass."
    )
    assert interpret("```bash\n\n  SUBMIT  \n```", submit_marker="SUBMIT") == FinalAnswer("")


def test_the_submit_marker_only_counts_as_the_first_line() -> None:
    text = "```\necho hi\nSUBMIT\n```"
    assert code(text, submit_marker="SUBMIT") == "echo hi\nSUBMIT"


def test_the_submit_form_is_described() -> None:
    message = feedback("hmm", submit_marker="SUBMIT", final_pattern=None)
    assert message == "MISSING | EXPECTED fence=``` +SUBMIT marker=SUBMIT"
    message = feedback("hmm", submit_marker="SUBMIT")
    assert message == "MISSING | EXPECTED fence=``` +FINAL-LINE +SUBMIT marker=SUBMIT"


def test_a_blank_submit_marker_is_refused() -> None:
    with pytest.raises(ConfigError, match="submit_marker"):
        CodeBlockInterpreter(submit_marker="  ")


# --- invalid replies ----------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n", "I think the answer is 42."])
def test_no_block_and_no_final_answer_is_invalid(text: str) -> None:
    assert feedback(text) == "MISSING | EXPECTED fence=``` +FINAL-LINE"


@pytest.mark.parametrize("text", ["```python\n```", "```python\n   \n\n```"])
def test_an_empty_block_is_invalid(text: str) -> None:
    assert feedback(text).startswith("EMPTY | ")


def test_an_unclosed_block_is_invalid_not_half_a_program() -> None:
    assert feedback("```python\nfor i in range(3):\n    print(i)") == (
        "UNCLOSED | EXPECTED fence=``` +FINAL-LINE"
    )


def test_an_unclosed_block_in_another_language_is_just_missing() -> None:
    assert feedback("```bash\nls", language="python").startswith("MISSING")


def test_a_final_line_counts_even_after_an_unclosed_block() -> None:
    assert interpret("```python\nx = 1\nFINAL ANSWER: 1") == FinalAnswer("1")


def test_native_tool_calls_are_invalid() -> None:
    reply = ModelReply(text="```\nls\n```", tool_calls=(ToolCall("shell", {"cmd": "ls"}, "c1"),))
    decision = CodeBlockInterpreter(templates=MARKED).interpret(reply, ())
    assert decision == InvalidDecision("NATIVE names='shell' | EXPECTED fence=``` +FINAL-LINE")


# --- the default wording --------------------------------------------------------------------------

INVALID_REPLIES = [
    ModelReply(text=""),
    ModelReply(text="just prose"),
    ModelReply(text="```python\n```"),
    ModelReply(text="```python\nprint(1)"),
    ModelReply(text="```bash\nls\n```"),
    ModelReply(tool_calls=(ToolCall("run", {}),)),
]


@pytest.mark.parametrize("reply", INVALID_REPLIES)
def test_every_default_feedback_says_what_to_send_instead(reply: ModelReply) -> None:
    interpreter = CodeBlockInterpreter(language="python")
    decision = interpreter.interpret(reply, ())
    assert isinstance(decision, InvalidDecision)
    assert decision.feedback.strip()
    assert decision.feedback.endswith(interpreter.instructions)
    assert "```python" in decision.feedback
    assert "FINAL ANSWER:" in decision.feedback


def test_instructions_describe_both_forms() -> None:
    assert CodeBlockInterpreter(language="python").instructions == (
        DEFAULT_TEMPLATES.code_block_expected.format(
            fence="```python", final=DEFAULT_TEMPLATES.code_block_final_line
        )
    )


def test_same_reply_gives_the_same_decision() -> None:
    reply = ModelReply(text="```python\nprint(1)\n```\nFINAL ANSWER: 1")
    interpreter = CodeBlockInterpreter()
    assert interpreter.interpret(reply, ()) == interpreter.interpret(reply, ())


# --- hostile input ------------------------------------------------------------------------------


def test_many_unclosed_fences_take_linear_time() -> None:
    text = "```a\n" * 50_000
    started = time.monotonic()
    assert feedback(text).startswith("UNCLOSED")
    assert time.monotonic() - started < 2


def test_nothing_after_an_unclosed_fence_is_a_block() -> None:
    # The 3-backtick lines cannot close the 4-backtick fence: they are inside it, as in Markdown.
    text = "````python\nx = 1\n```bash\nls\n```"
    assert feedback(text, language="bash").startswith("MISSING")
    assert feedback(text).startswith("UNCLOSED")


FENCE_PIECES = st.sampled_from(
    ["```", "```python", "````", "\n", "\r\n", " ", "x = 1", "FINAL ANSWER:", "SUBMIT", "`"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(FENCE_PIECES, st.text(max_size=5)), max_size=30))
def test_any_text_gives_a_decision_never_an_exception(pieces: list[str]) -> None:
    text = "".join(pieces)
    for interpreter in (
        CodeBlockInterpreter(),
        CodeBlockInterpreter(language="python", submit_marker="SUBMIT"),
    ):
        decision = interpreter.interpret(ModelReply(text=text), ())
        assert isinstance(decision, Action | FinalAnswer | InvalidDecision)
        if isinstance(decision, InvalidDecision):
            assert decision.feedback.endswith(interpreter.instructions)
        if isinstance(decision, Action):
            assert decision.text.strip()
            assert (decision.tool_name, decision.arguments) == (None, None)
