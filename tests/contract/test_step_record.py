"""kernel.md §7: the step record, what each kind of step holds, and prompt_chars."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polyloop import (
    ActionStatus,
    JournalError,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    Outcome,
    StepRecord,
    ToolCall,
    ToolRegistry,
)
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import ModelRequest, canonical_json
from tests.conftest import call, make_tools, prompt_size

FIELDS_13 = [
    "step_idx",
    "raw_response",
    "response_chars",
    "reasoning_chars",
    "action",
    "parse_ok",
    "parse_error",
    "observation",
    "observation_synthetic",
    "observation_truncated_chars",
    "prompt_chars",
    "llm_call_id",
    "step_wall_ms",
]
FIELDS_5 = ["tool_name", "tool_args_json", "action_status", "completed", "schema_version"]
# Fields with defaults added since, in the order they came.
ADDED = ["replaced_chars", "model", "wrap_up", "outcome_unknown"]


def a_step(**over: Any) -> StepRecord:
    base: dict[str, Any] = dict(
        step_idx=0,
        raw_response="hi",
        response_chars=2,
        reasoning_chars=0,
        action=None,
        parse_ok=True,
        parse_error=None,
        observation=None,
        observation_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=10,
        llm_call_id="c1",
        step_wall_ms=1.5,
    )
    base.update(over)
    return StepRecord(**base)


def test_step_record_has_exactly_the_contract_fields_in_order() -> None:
    assert list(StepRecord.__dataclass_fields__) == FIELDS_13 + FIELDS_5 + ADDED
    s = a_step()
    assert (s.tool_name, s.tool_args_json, s.action_status, s.completed, s.schema_version) == (
        None,
        None,
        None,
        False,
        "1.0",
    )
    assert s.replaced_chars == 0


def test_step_record_is_immutable() -> None:
    s = a_step()
    with pytest.raises(AttributeError):
        s.step_idx = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "over",
    [
        {"llm_call_id": ""},
        {"step_idx": -1},
        {"response_chars": -1},
        {"prompt_chars": -5},
        {"observation_truncated_chars": -1},
        {"parse_ok": 1},
        {"action_status": "done"},
        {"step_wall_ms": -1.0},
    ],
)
def test_step_record_rejects_invalid_values(over: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        a_step(**over)


def test_step_record_json_round_trip_is_stable() -> None:
    s = a_step(
        action="noop({})",
        tool_name="noop",
        tool_args_json="{}",
        action_status=ActionStatus.executed,
        observation="ok ünïcode",
    )
    text = s.to_json()
    assert StepRecord.from_json(text) == s
    assert StepRecord.from_json(text).to_json() == text
    assert "ünïcode" in text and json.loads(text)["action_status"] == "executed"


def test_step_record_refuses_an_unknown_major_version_and_reads_a_newer_minor() -> None:
    data = a_step().to_dict()
    with pytest.raises(JournalError, match=r"2\.0"):
        StepRecord.from_dict({**data, "schema_version": "2.0"})
    newer = StepRecord.from_dict({**data, "schema_version": "1.3", "a_future_field": 1})
    assert newer.schema_version == "1.3"


# --- what each kind of step holds (the table, row by row) -----------------------------------

ROW = tuple[
    str, bool, str | None, str | None, str | None, str | None, bool, ActionStatus | None, str
]


def check_row(step: StepRecord, reply_raw: str, expect: dict[str, Any]) -> None:
    got = {
        "raw_response": step.raw_response,
        "parse_ok": step.parse_ok,
        "parse_error": step.parse_error is not None,
        "action": step.action is not None,
        "tool": (step.tool_name is not None, step.tool_args_json is not None),
        "observation": step.observation is not None,
        "synthetic": step.observation_synthetic,
        "action_status": step.action_status,
        "llm_call_id": step.llm_call_id is not None,
    }
    want = {"raw_response": reply_raw, **expect}
    assert got == want


async def run_one(reply: object, tools_script_tail: list[object] | None = None) -> StepRecord:
    script = [reply, *(tools_script_tail or ["end"])]
    r = await Loop(
        ScriptedModel(script),
        tools=make_tools(),
        clock=FakeClock(),
        limits=Limits(max_consecutive_invalid=5),
    ).run("g")
    return r.steps[0]


async def test_row_c_model_failure() -> None:
    step = await run_one(ModelCallError("x"))
    check_row(
        step,
        "",
        {
            "parse_ok": False,
            "parse_error": False,
            "action": False,
            "tool": (False, False),
            "observation": False,
            "synthetic": False,
            "action_status": None,
            "llm_call_id": False,
        },
    )


async def test_row_d_invalid_decision() -> None:
    reply = ModelReply(tool_calls=(ToolCall("noop", "{not json"),))
    step = await run_one(reply)
    raw = '\n[{"arguments":"{not json","id":null,"name":"noop"}]'
    check_row(
        step,
        raw,
        {
            "parse_ok": False,
            "parse_error": True,
            "action": False,
            "tool": (False, False),
            "observation": False,
            "synthetic": False,
            "action_status": None,
            "llm_call_id": True,
        },
    )


async def test_row_e_final_answer() -> None:
    step = await run_one("all done")
    check_row(
        step,
        "all done",
        {
            "parse_ok": True,
            "parse_error": False,
            "action": False,
            "tool": (False, False),
            "observation": False,
            "synthetic": False,
            "action_status": None,
            "llm_call_id": True,
        },
    )


async def test_row_f_not_executed() -> None:
    step = await run_one(call("nope", {"a": 1}, id="c9"))
    raw = '\n[{"arguments":"{\\"a\\":1}","id":"c9","name":"nope"}]'
    check_row(
        step,
        raw,
        {
            "parse_ok": True,
            "parse_error": False,
            "action": True,
            "tool": (True, True),
            "observation": True,
            "synthetic": True,
            "action_status": ActionStatus.not_executed,
            "llm_call_id": True,
        },
    )


async def test_row_f_executed() -> None:
    step = await run_one(call("count", {"n": 3}))
    assert step.observation == "1 2 3"
    assert step.tool_args_json == '{"n":3}' and step.tool_name == "count"
    check_row(
        step,
        step.raw_response,
        {
            "parse_ok": True,
            "parse_error": False,
            "action": True,
            "tool": (True, True),
            "observation": True,
            "synthetic": False,
            "action_status": ActionStatus.executed,
            "llm_call_id": True,
        },
    )


async def test_row_f_executed_exception_text_is_synthetic() -> None:
    step = await run_one(call("boom"))
    assert step.action_status == ActionStatus.executed and step.observation_synthetic is True


async def test_row_f_env_error() -> None:
    step = await run_one(call("broken"))
    check_row(
        step,
        step.raw_response,
        {
            "parse_ok": True,
            "parse_error": False,
            "action": True,
            "tool": (True, True),
            "observation": True,
            "synthetic": True,
            "action_status": ActionStatus.env_error,
            "llm_call_id": True,
        },
    )


async def test_only_a_model_failure_step_has_parse_ok_false_without_parse_error() -> None:
    for reply in ["", ModelReply(tool_calls=(ToolCall("a", {}), ToolCall("b", {})))]:
        step = await run_one(reply)
        assert step.parse_ok is False and step.parse_error is not None


async def test_response_and_reasoning_chars_are_counted_by_polyloop() -> None:
    reply = ModelReply(text="héllo", reasoning="thinking…", tool_calls=call("noop").tool_calls)
    step = await run_one(reply)
    assert (step.response_chars, step.reasoning_chars) == (5, 9)
    assert step.raw_response.startswith("héllo\n[")


# --- observations the model does not see ------------------------------------------------------


async def test_the_step_keeps_the_full_observation_and_the_model_sees_the_cut() -> None:
    model = ScriptedModel([call("big", {"n": 500}), "end"])
    r = await Loop(model, tools=make_tools(), limits=Limits(max_observation_chars=100)).run("g")
    step = r.steps[0]
    assert step.observation == "x" * 500
    assert step.observation_truncated_chars == 400
    seen = model.requests[1].messages[-1]["content"]
    assert seen.startswith("x" * 100) and "x" * 101 not in seen


async def test_a_tools_own_cut_is_added_to_observation_truncated_chars() -> None:
    tools = ToolRegistry()

    @tools.tool
    def capped() -> Outcome:
        """Returns output it already cut."""
        return Outcome(ActionStatus.executed, "y" * 50, truncated_chars=1000)

    r = await Loop(
        ScriptedModel([call("capped"), "end"]), tools=tools, limits=Limits(max_observation_chars=20)
    ).run("g")
    assert r.steps[0].observation_truncated_chars == 1000 + 30


# --- prompt_chars ------------------------------------------------------------------------------


async def test_prompt_chars_is_the_size_of_what_the_model_was_sent() -> None:
    replies = iter(
        [
            call("count", {"n": 5}),
            ModelReply("", tool_calls=(ToolCall("zzz", "{}"),)),
            "",
            call("boom"),
            "end",
        ]
    )
    sizes: list[int] = []

    def fn(request: ModelRequest) -> ModelReply | str:
        sizes.append(prompt_size(request))
        return next(replies)

    history = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "noted"}]
    r = await Loop(FunctionModel(fn), tools=make_tools()).run("g", history=history)
    assert [s.prompt_chars for s in r.steps] == sizes
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


async def test_wall_time_covers_model_and_action() -> None:
    clock = FakeClock()
    tools = ToolRegistry()

    @tools.tool
    async def work() -> str:
        """Take half a second."""
        clock.advance(0.5)
        return "done"

    async def slow(request: ModelRequest) -> ModelReply:
        clock.advance(0.25)
        return call("work") if request.step_idx == 0 else ModelReply("end")

    r = await Loop(FunctionModel(slow), tools=tools, clock=clock).run("g")
    assert r.steps[0].step_wall_ms == pytest.approx(750.0)  # the model's 250 + the tool's 500
    assert r.steps[1].step_wall_ms == pytest.approx(250.0)


def test_canonical_json_is_sorted_compact_and_unicode() -> None:
    assert canonical_json({"b": 1, "a": "é"}) == '{"a":"é","b":1}'


@pytest.mark.parametrize(
    "value",
    [{}, [], 'x"\n\u2028é', 3, -0.5, None, True, {"b": [1, {"d": None, "c": 1e300}], "a": "é"}],
)
def test_canonical_json_is_json_dumps_with_the_canonical_settings(value: object) -> None:
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == expected


def test_canonical_json_refuses_what_json_cannot_hold_and_recovers() -> None:
    holder: list[object] = [object()]
    with pytest.raises(TypeError, match="not JSON serializable"):
        canonical_json(holder)
    holder[0] = 1  # the same list again: a failed call must not leave it marked as "seen"
    assert canonical_json(holder) == "[1]"
    holder.append(holder)
    with pytest.raises(ValueError, match="Circular reference"):
        canonical_json(holder)
    holder.pop()
    assert canonical_json([holder, holder]) == "[[1],[1]]"
