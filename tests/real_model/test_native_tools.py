"""A real model calls real tools through ``OpenAIModel`` and llama.cpp's server: a round trip
to ``task_completed``, both budgets, and ``context_overflow`` before a request is sent. Which
tool a step calls is forced with ``tool_choice``; what is asserted is the protocol and the
records, never the model's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polyloop import Limits, Loop, RunResult, StopReason
from polyloop.context import ChatContextBuilder
from polyloop.journal import SQLiteJournal
from polyloop.testing.real_model import LlamaServer
from polyloop.tools import ToolEnvironment

from .support import (
    Wire,
    assert_journal_matches_wire,
    canonical,
    forced,
    journal_kinds,
    model_calls,
    run_row,
    steps,
    tools_sent,
)
from .tools import ByStep, arithmetic

pytestmark = pytest.mark.real_model

GOAL = "Use the add tool to add 2 and 3, then submit the sum with the submit tool."


async def _run(
    server: LlamaServer, db: Path, run_id: str, limits: Limits, *choices: str
) -> tuple[RunResult, Wire]:
    wire = Wire(server.base_url)
    try:
        model = ByStep([wire.model(tool_choice=forced(name)) for name in choices])
        async with SQLiteJournal(db) as journal:
            loop = Loop(model, tools=arithmetic(), journal=journal, limits=limits)
            result = await loop.run(GOAL, run_id=run_id)
    finally:
        await wire.aclose()
    return result, wire


def _arguments(wire: Wire, i: int) -> dict[str, int]:
    (call,) = wire.exchanges[i].message["tool_calls"]
    arguments: dict[str, int] = json.loads(call["function"]["arguments"])
    return arguments


async def test_a_tool_round_trip_then_the_marker_ends_task_completed(
    tool_server: LlamaServer, tmp_path: Path
) -> None:
    db = tmp_path / "runs.db"
    result, wire = await _run(tool_server, db, "a", Limits(max_steps=4), "add", "submit")

    assert result.stop_reason == StopReason.task_completed
    rows = steps(db, "a")
    assert [r["tool_name"] for r in rows] == ["add", "submit"]
    assert [r["action_status"] for r in rows] == ["executed", "executed"]
    assert [r["parse_ok"] for r in rows] == [1, 1]
    assert [r["completed"] for r in rows] == [0, 0]  # the marker completed it, not the env
    args = _arguments(wire, 0)
    assert rows[0]["tool_args_json"] == canonical(args)
    assert rows[0]["observation"] == str(args["a"] + args["b"])  # the tool's, for its args
    assert rows[0]["observation_synthetic"] == 0
    assert rows[1]["tool_args_json"] == canonical(_arguments(wire, 1))
    assert [tools_sent(e) for e in wire.exchanges] == [["add", "submit"]] * 2
    assert all(e.sent["parallel_tool_calls"] is False for e in wire.exchanges)
    assert_journal_matches_wire(db, "a", wire.exchanges)

    # The second request replays the first call, answered by its own id with the tool's text.
    (call,) = wire.exchanges[0].message["tool_calls"]
    assistant, tool = wire.exchanges[1].sent["messages"][-2:]
    assert assistant["role"] == "assistant"
    assert assistant["content"] == ""  # never null: the server refuses that
    assert [c["id"] for c in assistant["tool_calls"]] == [call["id"]]
    assert assistant["tool_calls"][0]["function"] == call["function"]
    assert (tool["role"], tool["tool_call_id"], tool["content"]) == (
        "tool",
        call["id"],
        rows[0]["observation"],
    )

    run = run_row(db, "a")
    assert (run["status"], run["stop_reason"], run["steps_used"], run["actions_executed"]) == (
        "ended",
        "task_completed",
        2,
        2,
    )
    assert [c["state"] for c in model_calls(db, "a")] == ["ok", "ok"]


async def test_b_step_budget_with_a_real_model(tool_server: LlamaServer, tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    result, wire = await _run(tool_server, db, "b1", Limits(max_steps=2), "add")

    assert result.stop_reason == StopReason.step_budget
    rows = steps(db, "b1")
    assert [(r["tool_name"], r["action_status"]) for r in rows] == [("add", "executed")] * 2
    assert len(wire.exchanges) == 2  # the budget stops before a third call
    assert_journal_matches_wire(db, "b1", wire.exchanges)
    run = run_row(db, "b1")
    assert (run["stop_reason"], run["steps_used"], run["actions_executed"]) == (
        "step_budget",
        2,
        2,
    )


async def test_b_action_budget_with_a_real_model(tool_server: LlamaServer, tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    result, wire = await _run(tool_server, db, "b2", Limits(max_steps=5, max_actions=1), "add")

    assert result.stop_reason == StopReason.action_budget
    rows = steps(db, "b2")
    assert [(r["tool_name"], r["action_status"]) for r in rows] == [("add", "executed")]
    assert len(wire.exchanges) == 1
    assert_journal_matches_wire(db, "b2", wire.exchanges)
    run = run_row(db, "b2")
    assert (run["stop_reason"], run["steps_used"], run["actions_executed"]) == (
        "action_budget",
        1,
        1,
    )


async def test_b_wrap_up_after_the_step_budget_with_a_real_model(
    tool_server: LlamaServer, tmp_path: Path
) -> None:
    # Loop(wrap_up=True): the spent step budget gets one more call, with the tools sent and
    # tool_choice "none" (the history holds a tool call); its step is the one wrap_up step.
    db = tmp_path / "runs.db"
    wire = Wire(tool_server.base_url)
    try:
        model = ByStep([wire.model(tool_choice=forced("add"))])
        async with SQLiteJournal(db) as journal:
            loop = Loop(
                model, tools=arithmetic(), journal=journal, limits=Limits(max_steps=1),
                wrap_up=True,
            )  # fmt: skip
            result = await loop.run(GOAL, run_id="w")
    finally:
        await wire.aclose()

    assert result.stop_reason == StopReason.step_budget  # the budget's, wrap-up or not
    assert len(wire.exchanges) == 2
    ask = wire.exchanges[1].sent
    assert ask["tool_choice"] == "none" and tools_sent(wire.exchanges[1]) == ["add", "submit"]
    assert ask["messages"][-1]["role"] == "user"
    rows = steps(db, "w")
    assert [(r["step_idx"], r["wrap_up"]) for r in rows] == [(0, 0), (1, 1)]
    assert rows[1]["action_status"] in (None, "not_executed")  # nothing runs in a wrap-up
    if rows[1]["action_status"] is None and rows[1]["parse_ok"]:  # a final answer
        assert result.final_answer is not None
        assert run_row(db, "w")["final_answer"] == result.final_answer
    assert_journal_matches_wire(db, "w", wire.exchanges)
    run = run_row(db, "w")
    assert (run["stop_reason"], run["steps_used"], run["actions_executed"]) == (
        "step_budget",
        2,
        1,
    )


async def test_d_context_overflow_sends_no_request(
    tool_server: LlamaServer, tmp_path: Path
) -> None:
    specs = ToolEnvironment(arithmetic()).tool_specs()
    first = ChatContextBuilder().new(goal=GOAL, history=(), tool_specs=specs).prompt_chars
    db = tmp_path / "runs.db"
    served_before = tool_server.requests_served()

    # One character too many for the first prompt: nothing is sent, nothing is journaled
    # but the run and its end.
    result, wire = await _run(tool_server, db, "d0", Limits(max_prompt_chars=first - 1), "add")
    assert result.stop_reason == StopReason.context_overflow
    assert wire.exchanges == []
    assert steps(db, "d0") == [] and model_calls(db, "d0") == []
    assert "model_intent" not in journal_kinds(db, "d0")

    # The first prompt fits exactly; the second, with the first call and its result, does
    # not: one real call, one step, then context_overflow with no second request.
    result, wire = await _run(tool_server, db, "d1", Limits(max_prompt_chars=first), "add")
    assert result.stop_reason == StopReason.context_overflow
    assert len(wire.exchanges) == 1
    rows = steps(db, "d1")
    assert [(r["tool_name"], r["prompt_chars"]) for r in rows] == [("add", first)]
    assert_journal_matches_wire(db, "d1", wire.exchanges)
    assert journal_kinds(db, "d1").count("model_intent") == 1
    run = run_row(db, "d1")
    assert (run["stop_reason"], run["steps_used"], run["actions_executed"]) == (
        "context_overflow",
        1,
        1,
    )
    assert tool_server.requests_served() == served_before + 1  # what the server itself saw
