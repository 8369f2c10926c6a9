"""Phase orchestration sits on top of the kernel without living inside it (kernel.md §1)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from polyloop import StopReason

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
