"""The JSON-text and code-block interpreters meet real, messy model text: Gemma's own turn
format, no tool schema sent, the tools and the expected form explained in the goal only (the
format has no system message).

Whatever the model writes, each step must record what the interpreter makes of the reply as
received (re-interpreting ``raw_response`` gives the recorded decision), the feedback of an
invalid decision must be what the model is told next, and the stop reason must follow from
the steps. With replies cut to one token no decision can be complete, so invalid decisions
repeat and the run ends ``parse_failed_repeatedly`` after exactly
``max_consecutive_invalid`` steps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    Action,
    ActionStatus,
    FinalAnswer,
    InvalidDecision,
    Limits,
    Loop,
    ModelReply,
    Outcome,
    ReplayPolicy,
    RunResult,
    StopReason,
    ToolContext,
)
from polyloop.context import ChatContextBuilder
from polyloop.interpreters import CodeBlockInterpreter, JsonTextInterpreter
from polyloop.journal import SQLiteJournal
from polyloop.testing.real_model import LlamaServer
from polyloop.tools import ToolEnvironment

from .support import Wire, assert_journal_matches_wire, canonical, run_row, steps
from .tools import arithmetic

pytestmark = pytest.mark.real_model

Interpreter = JsonTextInterpreter | CodeBlockInterpreter


class Unlisted:
    """The tools of :func:`arithmetic`, run by a real ``ToolEnvironment``, but with no tool
    schema for the model: it learns them from the system prompt, in words."""

    def __init__(self) -> None:
        self._env = ToolEnvironment(arithmetic())

    def tool_specs(self) -> Sequence[Any]:
        return ()

    async def execute(self, action: Action, ctx: ToolContext) -> Outcome:
        return await self._env.execute(action, ctx)

    def replay_policy(self, action: Action) -> ReplayPolicy:
        return self._env.replay_policy(action)

    async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None:
        return await self._env.reconcile(action, ctx)


class Notebook:
    """Takes the code of a code block and keeps it; never runs it (the model's code is not
    trusted), and says so in the observation."""

    def __init__(self) -> None:
        self.code: list[str] = []

    def tool_specs(self) -> Sequence[Any]:
        return ()

    async def execute(self, action: Action, ctx: ToolContext) -> Outcome:
        self.code.append(action.text)
        lines = len(action.text.splitlines())
        return Outcome(ActionStatus.executed, f"Noted {lines} line(s) of code; it was not run.")

    def replay_policy(self, action: Action) -> ReplayPolicy:
        return ReplayPolicy.idempotent

    async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None:
        return None


def _setup(kind: str) -> tuple[Interpreter, Any, str]:
    """The interpreter, its environment, and the goal (the task, then the expected form)."""
    if kind == "json":
        json_interpreter = JsonTextInterpreter()
        goal = (
            "What is 2 plus 3? You can use two tools: add(a, b) adds two integers, and "
            "submit(answer) submits your answer. " + json_interpreter.instructions
        )
        return json_interpreter, Unlisted(), goal
    code_interpreter = CodeBlockInterpreter(language="python")
    goal = "Write Python code that prints 2 plus 3. " + code_interpreter.instructions
    return code_interpreter, Notebook(), goal


async def _run(
    server: LlamaServer, db: Path, run_id: str, kind: str, limits: Limits, max_tokens: int
) -> tuple[RunResult, Wire, Interpreter]:
    interpreter, environment, goal = _setup(kind)
    wire = Wire(server.base_url)
    try:
        async with SQLiteJournal(db) as journal:
            loop = Loop(
                wire.model(max_tokens=max_tokens),
                environment=environment,
                interpreter=interpreter,
                context=ChatContextBuilder(system_prompt=""),  # no system message
                journal=journal,
                limits=limits,
            )
            result = await loop.run(goal, run_id=run_id)
    finally:
        await wire.aclose()
    return result, wire, interpreter


def _assert_steps_are_the_interpreters_decisions(
    rows: list[dict[str, Any]], interpreter: Interpreter, wire: Wire
) -> None:
    for i, row in enumerate(rows):
        # The step keeps the reply exactly as received, and records what the interpreter
        # makes of exactly that text.
        assert row["raw_response"] == (wire.exchanges[i].message.get("content") or "")
        decision = interpreter.interpret(ModelReply(text=row["raw_response"]), ())
        if isinstance(decision, InvalidDecision):
            assert (row["parse_ok"], row["parse_error"], row["action"]) == (
                0,
                decision.feedback,
                None,
            )
            if i + 1 < len(rows):  # the feedback is what the model is told next
                told = wire.exchanges[i + 1].sent["messages"][-1]
                assert told == {"role": "user", "content": decision.feedback}
        elif isinstance(decision, Action):
            assert (row["parse_ok"], row["parse_error"], row["action"]) == (1, None, decision.text)
            assert row["tool_name"] == decision.tool_name
            if decision.tool_name is not None:
                assert row["tool_args_json"] == canonical(dict(decision.arguments or {}))
        else:
            assert isinstance(decision, FinalAnswer)
            assert (row["parse_ok"], row["parse_error"], row["action"]) == (1, None, None)


def _stop_reason_of(rows: list[dict[str, Any]], limits: Limits) -> StopReason:
    """The stop reason the contract gives these steps (kernel.md §6), read off the records."""
    last = rows[-1]
    trailing_invalid = 0
    for row in reversed(rows):
        if row["parse_ok"]:
            break
        trailing_invalid += 1
    if trailing_invalid == limits.max_consecutive_invalid:
        return StopReason.parse_failed_repeatedly
    if last["parse_ok"] and last["action"] is None:
        return StopReason.agent_finished
    if last["action_status"] == "executed" and last["tool_name"] == "submit":
        return StopReason.task_completed
    assert len(rows) == limits.max_steps, "the run stopped early for no reason it records"
    return StopReason.step_budget


@pytest.mark.parametrize("kind", ["json", "code"])
async def test_f_real_text_meets_the_interpreter(
    text_server: LlamaServer, tmp_path: Path, kind: str
) -> None:
    db = tmp_path / "runs.db"
    limits = Limits(max_steps=3, max_consecutive_invalid=2)
    result, wire, interpreter = await _run(text_server, db, "f", kind, limits, 64)

    rows = steps(db, "f")
    assert rows and len(wire.exchanges) == len(rows)
    assert all("tools" not in e.sent for e in wire.exchanges)  # no schema: text only
    _assert_steps_are_the_interpreters_decisions(rows, interpreter, wire)
    assert_journal_matches_wire(db, "f", wire.exchanges)
    assert result.stop_reason == _stop_reason_of(rows, limits)
    assert run_row(db, "f")["stop_reason"] == result.stop_reason


@pytest.mark.parametrize("kind", ["json", "code"])
async def test_f_replies_cut_to_one_token_end_parse_failed_repeatedly(
    text_server: LlamaServer, tmp_path: Path, kind: str
) -> None:
    db = tmp_path / "runs.db"
    limits = Limits(max_steps=5, max_consecutive_invalid=2)
    result, wire, interpreter = await _run(text_server, db, "f1", kind, limits, 1)

    assert result.stop_reason == StopReason.parse_failed_repeatedly
    rows = steps(db, "f1")
    assert [r["parse_ok"] for r in rows] == [0, 0]
    assert all(e.received["usage"]["completion_tokens"] <= 1 for e in wire.exchanges)
    _assert_steps_are_the_interpreters_decisions(rows, interpreter, wire)
    assert_journal_matches_wire(db, "f1", wire.exchanges)
    run = run_row(db, "f1")
    assert (run["stop_reason"], run["steps_used"], run["actions_executed"]) == (
        "parse_failed_repeatedly",
        2,
        0,
    )
