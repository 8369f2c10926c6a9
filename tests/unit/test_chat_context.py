"""ChatContextBuilder / ChatContext: message shapes, prompt_chars, valid tool-call history."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest

from polyloop.context import ChatContext, ChatContextBuilder
from polyloop.seams import Context, ContextBuilder
from polyloop.types import (
    DEFAULT_TEMPLATES,
    ActionStatus,
    Limits,
    Message,
    ModelReply,
    StepRecord,
    Templates,
    ToolCall,
    Turn,
    canonical_json,
)

SPECS = (
    {
        "type": "function",
        "function": {
            "name": "count",
            "description": "Count to n.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    },
)
LIMITS = Limits(max_steps=10)


# --- helpers ----------------------------------------------------------------------------------


def step(idx: int, **fields: Any) -> StepRecord:
    """A step record; defaults describe a final-answer step."""
    values: dict[str, Any] = {
        "step_idx": idx,
        "raw_response": "",
        "response_chars": 0,
        "reasoning_chars": 0,
        "action": None,
        "parse_ok": True,
        "parse_error": None,
        "observation": None,
        "observation_synthetic": False,
        "observation_truncated_chars": 0,
        "prompt_chars": 0,
        "llm_call_id": f"llm-{idx}",
        "step_wall_ms": 1.0,
    }
    values.update(fields)
    return StepRecord(**values)


def turn(
    record: StepRecord,
    reply: ModelReply | None,
    *,
    cut: int = 0,
    steps_used: int | None = None,
    actions: int = 0,
    limits: Limits = LIMITS,
) -> Turn:
    return Turn(
        step=record,
        reply=reply,
        observation_cut=cut,
        steps_used=record.step_idx + 1 if steps_used is None else steps_used,
        actions_executed=actions,
        limits=limits,
    )


def executed(idx: int, call: ToolCall, observation: str, **kw: Any) -> Turn:
    record = step(
        idx,
        action=f"{call.name}(...)",
        tool_name=call.name,
        tool_args_json="{}",
        observation=observation,
        action_status=ActionStatus.executed,
    )
    return turn(record, ModelReply(tool_calls=(call,)), **kw)


def invalid(idx: int, reply: ModelReply, feedback: str) -> Turn:
    return turn(step(idx, parse_ok=False, parse_error=feedback), reply)


def new_context(
    history: Sequence[Message] = (), builder: ChatContextBuilder | None = None
) -> ChatContext:
    builder = builder or ChatContextBuilder(system_prompt="SYS")
    return builder.new(goal="Count to three.", history=history, tool_specs=SPECS)


def reference_prompt_chars(messages: Sequence[Message], specs: Sequence[Any]) -> int:
    """kernel.md §7, from scratch."""
    total = len(canonical_json(list(specs)))
    for message in messages:
        content = message.get("content")
        total += 0 if content is None else len(content)
        for call in message.get("tool_calls", ()):
            total += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return total


def tool_call_violations(messages: Sequence[Message]) -> list[str]:
    """The OpenAI chat rule: every tool call id of an assistant message is answered by exactly
    one tool message before the next assistant message (or the end), and every tool message
    answers a call of the latest assistant message."""
    problems: list[str] = []
    pending: dict[str, int] = {}

    def close() -> None:
        for call_id, answers in pending.items():
            if answers != 1:
                problems.append(f"call {call_id!r} answered {answers} times")

    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            close()
            ids = [c["id"] for c in message.get("tool_calls", ())]
            if len(set(ids)) != len(ids):
                problems.append(f"message {i}: duplicate tool call ids {ids}")
            pending = dict.fromkeys(ids, 0)
        elif message["role"] == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                problems.append(f"message {i}: tool message for unknown call {call_id!r}")
            else:
                pending[call_id] += 1
        elif pending and any(n == 0 for n in pending.values()):
            problems.append(f"message {i}: {message['role']} message before all calls answered")
    close()
    return problems


def a_run_of_every_kind() -> list[Turn]:
    """One turn of each kind a run produces, in a plausible order."""
    two_calls = ModelReply(tool_calls=(ToolCall("count", {"n": 1}, "a"), ToolCall("x", "{}")))
    return [
        turn(step(0, llm_call_id=None, parse_ok=False), None),  # model failure
        invalid(1, ModelReply(text=""), "EMPTY"),
        invalid(2, two_calls, "SEVERAL"),
        invalid(3, ModelReply(tool_calls=(ToolCall("count", '{"n": '),)), "MALFORMED"),
        executed(4, ToolCall("count", '{"n": 3}', "call_9"), "1 2 3"),
        executed(5, ToolCall("nope", {}, None), "Error: there is no tool named 'nope'."),
        executed(6, ToolCall("count", {"n": 50}, "c6"), "x" * 40, cut=25),
        turn(step(7, observation="Check your answer."), ModelReply(text="Done?")),  # steered
        turn(step(8), ModelReply(text="Done.")),  # final answer
    ]


# --- tests ------------------------------------------------------------------------------------


def test_builder_and_context_implement_the_seams() -> None:
    builder = ChatContextBuilder()
    assert isinstance(builder, ContextBuilder)
    assert isinstance(builder.new(goal="g", history=(), tool_specs=()), Context)


def test_initial_messages_system_history_goal() -> None:
    history = [
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
    ]
    ctx = new_context(history)
    assert list(ctx.messages()) == [
        {"role": "system", "content": "SYS"},
        *history,
        {"role": "user", "content": "Count to three."},
    ]


def test_default_system_prompt_and_goal_template() -> None:
    templates = dataclasses.replace(Templates(), goal="GOAL: {goal}")
    ctx = ChatContextBuilder(templates=templates).new(goal="g", history=(), tool_specs=())
    assert list(ctx.messages()) == [
        {"role": "system", "content": DEFAULT_TEMPLATES.system_prompt},
        {"role": "user", "content": "GOAL: g"},
    ]


def test_empty_system_prompt_means_no_system_message() -> None:
    ctx = ChatContextBuilder(system_prompt="").new(goal="g", history=(), tool_specs=())
    assert list(ctx.messages()) == [{"role": "user", "content": "g"}]


def system_messages(messages: Sequence[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "system"]


def test_a_previous_runs_messages_as_history_give_one_system_message() -> None:
    builder = ChatContextBuilder()
    first = builder.new(goal="plan", history=(), tool_specs=SPECS)
    first.add_step(executed(0, ToolCall("count", {"n": 2}, "c0"), "1 2"))
    first.add_step(turn(step(1), ModelReply(text="planned")))
    second = builder.new(goal="execute", history=first.messages(), tool_specs=SPECS)
    assert list(second.messages()) == [*first.messages(), {"role": "user", "content": "execute"}]
    second.add_step(turn(step(0), ModelReply(text="executed")))
    third = builder.new(goal="summarize", history=second.messages(), tool_specs=SPECS)
    assert system_messages(second.messages()) == system_messages(third.messages()) == [0]
    assert third.messages()[0] == first.messages()[0]
    assert third.prompt_chars == reference_prompt_chars(third.messages(), SPECS)


def test_a_historys_system_message_wins_over_the_default_prompt() -> None:
    # What the earlier phase's model saw; the default wording is no choice of the caller's.
    history = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "hi"}]
    ctx = ChatContextBuilder().new(goal="g", history=history, tool_specs=SPECS)
    assert list(ctx.messages()) == [*history, {"role": "user", "content": "g"}]
    assert ctx.prompt_chars == reference_prompt_chars(ctx.messages(), SPECS)
    empty = ChatContextBuilder(system_prompt="").new(goal="g", history=history, tool_specs=())
    assert list(empty.messages()) == list(ctx.messages())


def test_a_chosen_prompt_equal_to_the_historys_is_sent_once() -> None:
    history = [{"role": "system", "content": "SYS", "name": "rules"}]
    ctx = new_context(history)  # system_prompt="SYS"
    assert list(ctx.messages()) == [*history, {"role": "user", "content": "Count to three."}]


@pytest.mark.parametrize(
    "builder",
    [
        ChatContextBuilder(system_prompt="You execute."),
        ChatContextBuilder(templates=dataclasses.replace(Templates(), system_prompt="Execute.")),
        ChatContextBuilder(system_prompt=DEFAULT_TEMPLATES.system_prompt),
    ],
    ids=["system_prompt", "templates", "default-text-passed"],
)
def test_a_chosen_prompt_that_contradicts_the_historys_is_refused(
    builder: ChatContextBuilder,
) -> None:
    history = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="history starts with a system message") as caught:
        builder.new(goal="g", history=history, tool_specs=())
    message = str(caught.value)
    assert "\n" not in message and "'You plan.'" in message
    assert "history[1:]" in message and "system_prompt=''" in message
    # The two ways out the message names.
    ctx = builder.new(goal="g", history=history[1:], tool_specs=())
    assert system_messages(ctx.messages()) == [0] and ctx.messages()[0]["content"] != "You plan."
    keep = ChatContextBuilder(system_prompt="").new(goal="g", history=history, tool_specs=())
    assert keep.messages()[0] == history[0]


def test_system_messages_later_in_the_history_are_kept_where_they_are() -> None:
    history = [
        {"role": "user", "content": "before"},
        {"role": "system", "content": "Note: the user is on mobile."},
        {"role": "assistant", "content": "ok"},
    ]
    ctx = new_context(history)
    assert list(ctx.messages()) == [
        {"role": "system", "content": "SYS"},
        *history,
        {"role": "user", "content": "Count to three."},
    ]
    assert ctx.prompt_chars == reference_prompt_chars(ctx.messages(), SPECS)


def test_model_failure_step_adds_nothing() -> None:
    ctx = new_context()
    before = (len(ctx.messages()), ctx.prompt_chars)
    ctx.add_step(turn(step(0, llm_call_id=None, parse_ok=False), None))
    assert (len(ctx.messages()), ctx.prompt_chars) == before


def test_invalid_decision_without_calls_is_answered_by_a_user_message() -> None:
    ctx = new_context()
    ctx.add_step(invalid(0, ModelReply(text="", reasoning="hmm"), "Your reply was empty."))
    assert list(ctx.messages())[-2:] == [
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Your reply was empty."},
    ]


def test_invalid_decision_answers_every_tool_call_with_the_feedback() -> None:
    ctx = new_context()
    reply = ModelReply(
        text="Two at once.",
        tool_calls=(ToolCall("count", {"n": 1}, "call_x"), ToolCall("count", '{"n":2}', "")),
    )
    ctx.add_step(invalid(3, reply, "One tool per turn."))
    assert list(ctx.messages())[-3:] == [
        {
            "role": "assistant",
            "content": "Two at once.",
            "tool_calls": [
                {
                    "id": "call_x",
                    "type": "function",
                    "function": {"name": "count", "arguments": '{"n":1}'},
                },
                {
                    "id": "call_3_1",
                    "type": "function",
                    "function": {"name": "count", "arguments": '{"n":2}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_x", "content": "One tool per turn."},
        {"role": "tool", "tool_call_id": "call_3_1", "content": "One tool per turn."},
    ]


def test_executed_step_is_an_assistant_call_and_a_tool_answer() -> None:
    ctx = new_context()
    ctx.add_step(executed(2, ToolCall("count", '{ "n" : 3 }', None), "1 2 3"))
    assert list(ctx.messages())[-2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_2_0",
                    "type": "function",
                    # The arguments string exactly as received.
                    "function": {"name": "count", "arguments": '{ "n" : 3 }'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_2_0", "content": "1 2 3"},
    ]


def test_cut_observation_says_how_much_is_not_shown() -> None:
    ctx = new_context()
    ctx.add_step(executed(0, ToolCall("count", {}, "c"), "abcdefghij", cut=4))
    assert ctx.messages()[-1]["content"] == "abcdef\n[... 4 more characters not shown]"


def test_budget_hint_is_appended_to_observations_when_enabled() -> None:
    ctx = new_context(builder=ChatContextBuilder(system_prompt="S", budget_hint=True))
    ctx.add_step(executed(0, ToolCall("count", {}, "c"), "out", steps_used=3))
    assert ctx.messages()[-1]["content"] == "out\n[step 3 of 10]"
    limits = Limits(max_steps=10, max_actions=5)
    ctx.add_step(
        executed(1, ToolCall("count", {}, "d"), "out", steps_used=4, actions=2, limits=limits)
    )
    assert ctx.messages()[-1]["content"] == "out\n[step 4 of 10 · 3 actions left]"
    ctx.add_step(executed(2, ToolCall("count", {}, "e"), "abcdef", cut=3, limits=limits))
    assert ctx.messages()[-1]["content"] == (
        "abc\n[... 3 more characters not shown]\n[step 3 of 10 · 5 actions left]"
    )


def test_no_budget_hint_by_default() -> None:
    ctx = new_context()
    ctx.add_step(executed(0, ToolCall("count", {}, "c"), "out"))
    assert ctx.messages()[-1]["content"] == "out"


def test_final_answer_adds_only_the_assistant_message() -> None:
    ctx = new_context()
    ctx.add_step(turn(step(0), ModelReply(text="It is 3.", reasoning="...")))
    assert list(ctx.messages())[-2:] == [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "It is 3."},
    ]


def test_steered_final_answer_gets_the_guard_feedback_as_a_user_message() -> None:
    ctx = new_context()
    ctx.add_step(turn(step(0, observation="Run the tests first."), ModelReply(text="Done.")))
    assert list(ctx.messages())[-2:] == [
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Run the tests first."},
    ]


def test_calls_without_feedback_or_observation_are_answered_with_empty_text() -> None:
    ctx = new_context()
    reply = ModelReply(text="Done.", tool_calls=(ToolCall("count", {}, "k"),))
    ctx.add_step(turn(step(0), reply))
    assert list(ctx.messages())[-1] == {"role": "tool", "tool_call_id": "k", "content": ""}
    assert tool_call_violations(ctx.messages()) == []


def test_observation_for_several_calls_keeps_history_valid() -> None:
    ctx = new_context()
    reply = ModelReply(tool_calls=(ToolCall("a", {}, "i"), ToolCall("b", {}, "j")))
    ctx.add_step(turn(step(0, observation="did a", action="a()"), reply))
    assert list(ctx.messages())[-3:] == [
        {"role": "tool", "tool_call_id": "i", "content": ""},
        {"role": "tool", "tool_call_id": "j", "content": ""},
        {"role": "user", "content": "did a"},
    ]
    assert tool_call_violations(ctx.messages()) == []


def test_repeated_call_ids_in_one_reply_are_made_unique() -> None:
    ctx = new_context()
    reply = ModelReply(tool_calls=(ToolCall("a", {}, "same"), ToolCall("b", {}, "same")))
    ctx.add_step(invalid(5, reply, "one at a time"))
    ids = [c["id"] for c in ctx.messages()[-3]["tool_calls"]]
    assert ids == ["same", "call_5_1"]
    assert tool_call_violations(ctx.messages()) == []


def test_prompt_chars_matches_a_recomputation_after_every_step() -> None:
    history = [
        {"role": "user", "content": "before"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "h1", "type": "function", "function": {"name": "count", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "h1", "content": "héllo wörld"},
    ]
    ctx = new_context(history)
    assert ctx.prompt_chars == reference_prompt_chars(ctx.messages(), SPECS)
    for t in a_run_of_every_kind():
        ctx.add_step(t)
        assert ctx.prompt_chars == reference_prompt_chars(ctx.messages(), SPECS)
    assert ctx.prompt_chars > len(canonical_json(list(SPECS)))


def test_prompt_chars_counts_code_points_and_the_tool_specs() -> None:
    ctx = ChatContextBuilder(system_prompt="").new(goal="日本", history=(), tool_specs=())
    assert ctx.prompt_chars == len("[]") + 2
    with_specs = ChatContextBuilder(system_prompt="").new(goal="日本", history=(), tool_specs=SPECS)
    assert with_specs.prompt_chars == len(canonical_json(list(SPECS))) + 2


def test_every_tool_call_is_answered_exactly_once() -> None:
    ctx = new_context()
    for t in a_run_of_every_kind():
        ctx.add_step(t)
        assert tool_call_violations(ctx.messages()) == []
    calls = sum(len(m.get("tool_calls", ())) for m in ctx.messages())
    answers = sum(1 for m in ctx.messages() if m["role"] == "tool")
    assert calls == answers == 6


def test_the_tool_call_checker_catches_violations() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    unanswered = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    twice = [*unanswered, *[{"role": "tool", "tool_call_id": "a", "content": ""}] * 2]
    orphan = [{"role": "tool", "tool_call_id": "z", "content": ""}]
    late = [*unanswered, {"role": "user", "content": "hi"}]
    assert tool_call_violations(unanswered) == ["call 'a' answered 0 times"]
    assert tool_call_violations(twice) == ["call 'a' answered 2 times"]
    assert tool_call_violations(orphan) == ["message 0: tool message for unknown call 'z'"]
    assert "message 1: user message before all calls answered" in tool_call_violations(late)


def test_messages_snapshot_is_immutable() -> None:
    ctx = new_context()
    ctx.add_step(executed(0, ToolCall("count", {}, "c0"), "first"))
    snap = ctx.messages()
    frozen = list(snap)
    for t in a_run_of_every_kind():
        ctx.add_step(t)
    assert len(ctx.messages()) > len(snap) == len(frozen) == 4
    assert list(snap) == frozen
    assert snap[-1] is frozen[-1]
    assert snap[-1] == {"role": "tool", "tool_call_id": "c0", "content": "first"}
    assert snap[0]["role"] == "system"
    assert snap[1:3] == tuple(frozen[1:3])
    assert snap[::-1] == tuple(reversed(frozen))
    assert snap[2:100] == tuple(frozen[2:])
    assert list(reversed(snap)) == frozen[::-1]
    assert frozen[2] in snap
    with pytest.raises(IndexError):
        snap[4]
    with pytest.raises(IndexError):
        snap[-5]
    with pytest.raises(TypeError):
        snap[0] = {}  # type: ignore[index]
    # The messages are shared with the context, not copied.
    assert ctx.messages()[3] is snap[3]


def test_same_turns_give_byte_identical_messages() -> None:
    def build() -> tuple[str, int]:
        ctx = new_context([{"role": "user", "content": "prior"}])
        for t in a_run_of_every_kind():
            ctx.add_step(t)
        # json.dumps without sort_keys: key order is part of the bytes sent.
        return json.dumps(list(ctx.messages()), ensure_ascii=False), ctx.prompt_chars

    assert build() == build()


def test_a_history_gives_the_same_bytes_whatever_its_key_order() -> None:
    # A durable journal stores the history with sorted keys: a resumed run rebuilds its
    # conversation from that form, and must send what the run sent before it.
    call = {"id": "h1", "type": "function", "function": {"name": "count", "arguments": "{}"}}
    given = [
        {"role": "system", "content": "SYS"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "h1", "content": "1"},
    ]
    stored = json.loads(canonical_json(given))
    assert json.dumps(stored) != json.dumps(given)

    def sent(history: Sequence[Message]) -> str:
        ctx = new_context(history)
        ctx.add_step(turn(step(0), ModelReply(text="done")))
        return json.dumps(list(ctx.messages()), ensure_ascii=False)

    reordered = [dict(reversed(m.items())) for m in given]
    assert sent(given) == sent(stored) == sent(reordered) == sent(tuple(given))
    assert new_context(given).messages()[1] == given[1]  # the same content


def test_one_builder_serves_independent_runs() -> None:
    builder = ChatContextBuilder(system_prompt="S")
    one = builder.new(goal="one", history=(), tool_specs=())
    two = builder.new(goal="two", history=(), tool_specs=())
    one.add_step(turn(step(0), ModelReply(text="answer")))
    assert len(one.messages()) == 3
    assert list(two.messages()) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "two"},
    ]
