"""Phase orchestration sits on top of the kernel without living inside it (kernel.md §1)."""

from __future__ import annotations

import json
import runpy
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from polyloop import Loop, ModelReply, RunNotFound, RunResult, StopReason
from polyloop.context import ChatContextBuilder
from polyloop.journal import MemoryJournal
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import ModelRequest
from tests.conftest import Crash, RecordingJournal

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import phases  # noqa: E402


async def test_three_runs_plan_execute_summarize_pass_history_between_them() -> None:
    reports = await phases.orchestrate("explain phases", phases.scripted())
    assert [r.name for r in reports] == ["plan", "execute", "summarize"]
    assert [r.result.stop_reason for r in reports] == [
        StopReason.agent_finished,
        StopReason.agent_finished,
        StopReason.task_completed,
    ]
    plan, execute, summarize = (r.result for r in reports)
    # Each phase is its own run, with its own step indices from 0 and its own budget.
    assert len({plan.run_id, execute.run_id, summarize.run_id}) == 3
    assert execute.steps[0].step_idx == 0 and execute.actions_executed == 2
    # The next phase continued from the previous transcript.
    contents = [m.get("content") for m in summarize.messages]
    assert "1. record the facts  2. summarize them" in contents
    assert "facts recorded" in contents


async def test_a_failed_phase_stops_the_orchestration() -> None:
    models = phases.scripted()
    models["execute"] = phases.ScriptedModel([phases.call("nope")] * 20)
    reports = await phases.orchestrate("g", models)
    assert [r.name for r in reports] == ["plan", "execute"]
    assert reports[-1].result.stop_reason == StopReason.step_budget


def test_the_example_runs_as_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / "phases.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "summarize  task_completed" in out


# --- the documented pattern: RunResult.messages as the next run's history ---------------------


def system_indices(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "system"]


def dumped(messages: Sequence[Mapping[str, Any]]) -> str:
    # json.dumps without sort_keys: the key order is part of the bytes sent.
    return json.dumps(list(messages), ensure_ascii=False)


async def test_every_request_of_every_phase_has_exactly_one_system_message_first() -> None:
    models = phases.scripted()
    reports = await phases.orchestrate("explain phases", models)
    plan = reports[0].result
    assert system_indices(plan.messages) == [0]
    for name, model in models.items():
        for request in model.requests:
            assert system_indices(request.messages) == [0], name
            assert request.messages[0] == plan.messages[0], name
    # The second phase's first request is the first phase's transcript, then its goal.
    first = models["execute"].requests[0].messages
    assert list(first) == [*plan.messages, {"role": "user", "content": "[execute] explain phases"}]


Seen = list[tuple[int, Sequence[Mapping[str, Any]]]]


def execute_model(seen: Seen) -> FunctionModel:
    """The execute phase, by step (a resumed run continues where the crashed one was); each
    request's step and messages are appended to ``seen``."""

    def reply(request: ModelRequest) -> ModelReply:
        seen.append((request.step_idx, request.messages))
        match request.step_idx:
            case 0:
                return phases.call("write_note", key="a", text="one")
            case 1:
                return phases.call("read_note", key="a")
            case _:
                return ModelReply("executed")

    return FunctionModel(reply)


async def plan_phase() -> RunResult:
    loop = Loop(ScriptedModel(["the plan"]), tools=phases.make_tools({}), clock=FakeClock())
    return await loop.run("[plan] g")


def execute_loop(journal: Any, seen: Seen, notes: dict[str, str]) -> Loop:
    """The execute phase's loop; ``notes`` is the world its tools write to, which outlives a
    crashed run."""
    tools = phases.make_tools(notes)
    return Loop(execute_model(seen), tools=tools, journal=journal, clock=FakeClock())


async def execute_phase(
    journal: Any,
    history: Sequence[Mapping[str, Any]],
    seen: Seen,
    notes: dict[str, str],
    run_id: str = "execute",
) -> RunResult:
    loop = execute_loop(journal, seen, notes)
    return await loop.run("[execute] g", history=history, run_id=run_id)


async def resume_phase(journal: Any, seen: Seen, notes: dict[str, str], run_id: str) -> RunResult:
    return await execute_loop(journal, seen, notes).resume(run_id)


async def check_a_phase_resumes_with_the_same_conversation(journal: Any) -> None:
    """Crash the execute phase (history = the plan phase's messages) around each of its
    journal writes, resume it from ``journal`` (where the history is stored), and check that
    every request has one system message and that the conversation is the uncrashed one,
    byte for byte."""
    plan = await plan_phase()
    ref_journal = RecordingJournal()
    ref_seen: Seen = []
    ref = await execute_phase(ref_journal, plan.messages, ref_seen, {})
    assert ref.stop_reason is StopReason.agent_finished and ref.steps_used == 3
    sent = {step: dumped(messages) for step, messages in ref_seen}
    assert [system_indices(messages) for _, messages in ref_seen] == [[0]] * 3
    for n in range(1, ref_journal.count + 1):
        for after in (False, True):
            where = f"crash {'after' if after else 'before'} write {n}"
            run_id = f"execute-{n}-{after}"
            seen: Seen = []
            notes: dict[str, str] = {}
            crashing = RecordingJournal(journal, crash_at=n, crash_after=after)
            with pytest.raises(Crash):
                await execute_phase(crashing, plan.messages, seen, notes, run_id)
            resumed = await resume_phase(journal, seen, notes, run_id)
            assert resumed.stop_reason is StopReason.agent_finished, where
            assert dumped(resumed.messages) == dumped(ref.messages), where
            # Every call, before the crash and after the resume, sent what the uncrashed run
            # sent at that step.
            assert [(step, dumped(m)) for step, m in seen] == [
                (step, sent[step]) for step, _ in seen
            ], where


async def test_a_phase_started_with_a_previous_transcript_resumes_with_the_same_conversation() -> (
    None
):
    # tests/durability runs the same on SQLite and PostgreSQL, which store the history as JSON.
    await check_a_phase_resumes_with_the_same_conversation(MemoryJournal())


async def test_a_system_prompt_chosen_for_a_phase_that_contradicts_the_history_is_refused() -> None:
    plan = await plan_phase()
    journal = MemoryJournal()
    loop = Loop(
        ScriptedModel(["never called"]),
        tools=phases.make_tools({}),
        journal=journal,
        context=ChatContextBuilder(system_prompt="You execute plans."),
    )
    with pytest.raises(ValueError, match=r"pass history\[1:\]"):
        await loop.run("[execute] g", history=plan.messages, run_id="execute")
    with pytest.raises(RunNotFound):
        await journal.read("execute")  # nothing was written
