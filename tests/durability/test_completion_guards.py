"""Run-end guards that opt in to ``task_completed`` ends (``RunEndGuard(on_task_completed=True)``,
kernel.md §10): a completion by a marker tool or by the environment is checked too; a steer
leaves the action executed, puts the feedback before the tool's text in the step's observation,
journals the verdict with the step and the run goes on, on every journal."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polyloop import (
    ActionStatus,
    Complete,
    Escalate,
    GuardContext,
    Limits,
    Loop,
    RunEndGuard,
    Steer,
    StopReason,
    ToolRegistry,
)
from polyloop.testing import FakeClock, ScriptedModel
from polyloop.types import GuardVerdict, RunEnd, StepWritten
from tests.conftest import Crash, call, make_tools
from tests.durability.conftest import OpenJournal

MISSING = "report.md is missing: write it, then submit again"


def phase_tools(workspace: Path, executed: list[str]) -> ToolRegistry:
    """A GovDoc-style phase: ``write_report`` produces its file, ``submit`` ends the phase."""
    tools = ToolRegistry()

    @tools.tool
    def write_report(text: str) -> str:
        """Write report.md."""
        executed.append("write_report")
        (workspace / "report.md").write_text(text)
        return "written"

    @tools.tool(completion_marker=True)
    def submit(phase: str) -> str:
        """Submit the phase."""
        executed.append(f"submit {phase}")
        return f"phase {phase} submitted"

    return tools


def report_exists(workspace: Path, seen: list[GuardContext]) -> RunEndGuard:
    def files_exist(ctx: GuardContext) -> Steer | Complete:
        seen.append(ctx)
        if ctx.completion == "marker" and not (workspace / "report.md").exists():
            return Steer(MISSING)
        return Complete()

    return RunEndGuard(files_exist, on_task_completed=True)


async def test_submit_counts_only_once_the_files_of_the_phase_exist(
    tmp_path: Path, every_journal: OpenJournal
) -> None:
    executed: list[str] = []
    seen: list[GuardContext] = []
    model = ScriptedModel(
        [
            call("submit", {"phase": "draft"}),
            call("write_report", {"text": "# Report"}),
            call("submit", {"phase": "draft"}),
        ]
    )
    async with every_journal() as journal:
        loop = Loop(
            model,
            tools=phase_tools(tmp_path, executed),
            guards=[report_exists(tmp_path, seen)],
            journal=journal,
            clock=FakeClock(),
        )
        r = await loop.run("write the draft", run_id="p")
        _, records = await journal.read("p")
    assert r.stop_reason == StopReason.task_completed
    assert executed == ["submit draft", "write_report", "submit draft"]
    assert r.steps_used == 3 and r.actions_executed == 3  # the steered submit executed
    steered = r.steps[0]
    assert steered.action_status == ActionStatus.executed and steered.tool_name == "submit"
    assert steered.observation == f"{MISSING}\n\nphase draft submitted"
    assert steered.observation_synthetic is False
    # The model saw the feedback in the answer to its submit call.
    assert model.requests[1].messages[-1]["content"] == steered.observation
    assert r.steps[2].observation == "phase draft submitted"
    # What the guard read: how the run would end, and the marker tool's call.
    assert [(c.completion, c.tool_name, c.arguments, c.steers) for c in seen] == [
        ("marker", "submit", {"phase": "draft"}, 0),
        ("marker", "submit", {"phase": "draft"}, 1),
    ]
    assert seen[0].steps[-1].tool_name == "submit" and len(seen[1].steps) == 3
    # Each verdict is written with its step: the steer with the steered step, the acceptance
    # with the last step and the end record.
    kinds = [x.kind for x in records]
    first = kinds.index("guard_verdict")
    assert kinds[first : first + 2] == ["guard_verdict", "step"]
    assert kinds[-3:] == ["guard_verdict", "step", "end"]
    verdicts = [x for x in records if isinstance(x, GuardVerdict)]
    assert [(v.step_idx, v.guard, v.steer, v.feedback) for v in verdicts] == [
        (0, "files_exist", True, MISSING),
        (2, "files_exist", False, None),
    ]
    steps = [x.step for x in records if isinstance(x, StepWritten)]
    assert steps == list(r.steps)
    async with every_journal() as journal:  # ended: resume rebuilds it, runs nothing
        again = await Loop(
            ScriptedModel([]), tools=phase_tools(tmp_path, executed), journal=journal
        ).resume("p")
    assert again.steps == r.steps and again.actions_executed == 3
    assert len(executed) == 3


async def test_a_guard_that_did_not_opt_in_leaves_a_marker_completion_alone() -> None:
    seen: list[GuardContext] = []

    def files_exist(ctx: GuardContext) -> Steer:
        seen.append(ctx)
        return Steer(MISSING)

    r = await Loop(
        ScriptedModel([call("done", {"answer": "x"})]), tools=make_tools(), guards=[files_exist]
    ).run("g")
    assert r.stop_reason == StopReason.task_completed and seen == []


async def test_an_environment_completion_is_checked_and_named_as_such() -> None:
    seen: list[GuardContext] = []

    def check(ctx: GuardContext) -> Steer | Complete:
        seen.append(ctx)
        return Steer("not yet") if ctx.steers == 0 else Complete()

    model = ScriptedModel([call("finish_env"), call("finish_env")])
    guard = RunEndGuard(check, on_task_completed=True)
    r = await Loop(model, tools=make_tools(), guards=[guard]).run("g")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 2
    assert [(c.completion, c.tool_name, c.arguments) for c in seen] == [
        ("environment", "finish_env", {}),
        ("environment", "finish_env", {}),
    ]
    assert r.steps[0].completed is True  # what the environment said, kept
    assert r.steps[0].observation == "not yet\n\ngoal reached"


async def test_after_its_own_steer_limit_the_guard_is_skipped_and_the_completion_stands() -> None:
    calls: list[int] = []

    def never_happy(ctx: GuardContext) -> Steer:
        calls.append(ctx.steers)
        return Steer("no")

    model = ScriptedModel([call("done", {"answer": "a"}), call("done", {"answer": "b"})])
    guard = RunEndGuard(never_happy, max_steers=1, on_task_completed=True)
    r = await Loop(model, tools=make_tools(), guards=[guard]).run("g")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 2
    assert calls == [0] and r.actions_executed == 2


async def test_a_steer_on_the_last_allowed_step_ends_step_budget() -> None:
    def never_happy(ctx: GuardContext) -> Steer:
        return Steer("no")

    guard = RunEndGuard(never_happy, on_task_completed=True)
    r = await Loop(
        ScriptedModel([call("done", {"answer": "a"})]),
        tools=make_tools(),
        guards=[guard],
        limits=Limits(max_steps=1),
    ).run("g")
    assert r.stop_reason == StopReason.step_budget and r.final_answer is None
    assert r.steps_used == 1 and r.actions_executed == 1


async def test_escalate_from_a_completion_guard_hands_the_run_over() -> None:
    def needs_a_person(ctx: GuardContext) -> Complete:
        raise Escalate("the report cites production data", evidence={"file": "report.md"})

    guard = RunEndGuard(needs_a_person, on_task_completed=True)
    r = await Loop(
        ScriptedModel([call("done", {"answer": "a"})]), tools=make_tools(), guards=[guard]
    ).run("g")
    assert r.stop_reason == StopReason.escalated and r.actions_executed == 1
    assert r.stop_detail is not None and "guard needs_a_person" in r.stop_detail
    assert r.report is not None and r.report.escalation is not None


async def test_steer_counts_and_the_steered_step_survive_a_crash_and_resume(
    every_journal: OpenJournal,
) -> None:
    log: list[str] = []

    def never_happy(ctx: GuardContext) -> Steer:
        return Steer("no")

    guard = RunEndGuard(never_happy, name="strict", max_steers=1, on_task_completed=True)
    dies = Crash("the process dies asking the model after the steered step")
    async with every_journal() as journal:
        with pytest.raises(Crash):
            await Loop(
                ScriptedModel([call("done", {"answer": "a"}), dies]),
                tools=make_tools(log),
                guards=[guard],
                journal=journal,
            ).run("g", run_id="s")
    assert log == ["done a"]
    async with every_journal() as journal:
        r = await Loop(
            ScriptedModel([call("done", {"answer": "b"})]),
            tools=make_tools(log),
            guards=[guard],
            journal=journal,
        ).resume("s")
    # The guard, at its limit after resume, was skipped: the second submit stands.
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 2
    assert log == ["done a", "done b"] and r.actions_executed == 2
    assert r.steps[0].observation == "no\n\nsubmitted a"


async def test_a_crash_while_a_completion_guard_runs_never_executes_the_action_again(
    every_journal: OpenJournal,
) -> None:
    log: list[str] = []
    asked: list[int] = []

    def dies_once(ctx: GuardContext) -> Complete:
        asked.append(ctx.steers)
        if len(asked) == 1:
            raise Crash("the process dies while the guard runs")
        return Complete()

    guard = RunEndGuard(dies_once, on_task_completed=True)
    async with every_journal() as journal:
        with pytest.raises(Crash):
            await Loop(
                ScriptedModel([call("done", {"answer": "a"})]),
                tools=make_tools(log),
                guards=[guard],
                journal=journal,
            ).run("g", run_id="c")
        _, records = await journal.read("c")
    assert records[-1].kind == "action_result"  # durable before the guard ran
    async with every_journal() as journal:
        r = await Loop(
            ScriptedModel([]), tools=make_tools(log), guards=[guard], journal=journal
        ).resume("c")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 1
    assert log == ["done a"] and asked == [0, 0] and r.actions_executed == 1
    assert not any(isinstance(x, RunEnd) for x in records)


def test_on_task_completed_must_be_a_bool() -> None:
    from polyloop import ConfigError

    def g(ctx: GuardContext) -> Complete:
        return Complete()

    with pytest.raises(ConfigError, match="on_task_completed"):
        RunEndGuard(g, on_task_completed="yes")  # type: ignore[arg-type]


async def test_a_run_cancelled_while_a_completion_guard_runs_keeps_the_executed_step(
    every_journal: OpenJournal,
) -> None:
    log: list[str] = []
    entered = asyncio.Event()

    async def slow(ctx: GuardContext) -> Complete:
        entered.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    guard = RunEndGuard(slow, on_task_completed=True)
    async with every_journal() as journal:
        loop = Loop(
            ScriptedModel([call("done", {"answer": "a"})]),
            tools=make_tools(log),
            guards=[guard],
            journal=journal,
        )
        task = asyncio.create_task(loop.run("g", run_id="k"))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        _, records = await journal.read("k")
    end = records[-1]
    assert isinstance(end, RunEnd) and end.stop_reason == StopReason.cancelled
    steps = [x.step for x in records if isinstance(x, StepWritten)]
    assert [s.tool_name for s in steps] == ["done"] and log == ["done a"]
    assert steps[0].observation == "submitted a"  # not judged: written as the tool said
    assert end.steps_used == 1 and end.actions_executed == 1
    async with every_journal() as journal:  # ended: a resume rebuilds it, runs nothing
        again = await Loop(ScriptedModel([]), tools=make_tools(log), journal=journal).resume("k")
    assert again.stop_reason == StopReason.cancelled and again.actions_executed == 1
    assert again.steps == tuple(steps) and log == ["done a"]


async def test_the_feedback_survives_the_cut_of_a_long_tool_text() -> None:
    def never_happy(ctx: GuardContext) -> Steer:
        return Steer("no")

    model = ScriptedModel([call("done", {"answer": "a"}), "giving up"])
    guard = RunEndGuard(never_happy, max_steers=1, on_task_completed=True)
    r = await Loop(
        model, tools=make_tools(), guards=[guard], limits=Limits(max_observation_chars=5)
    ).run("g")
    step = r.steps[0]
    assert step.observation == "no\n\nsubmitted a" and step.observation_truncated_chars == 6
    seen = model.requests[1].messages[-1]["content"]
    assert seen.startswith("no\n\nsubmi") and "submitted a" not in seen


async def test_a_run_cancelled_while_the_result_before_the_guards_is_written_keeps_the_step() -> (
    None
):
    # The action's result is written alone before the guards run; a cancellation during that
    # write (the Journal seam finishes it: it is durable) must still leave the executed step.
    from polyloop.journal import MemoryJournal
    from polyloop.types import ActionResult

    class CancelAfterResult(MemoryJournal):
        task: asyncio.Task[object] | None = None

        async def append(self, lease: object, records: tuple[object, ...]) -> None:
            await super().append(lease, records)  # type: ignore[arg-type]
            if self.task is not None and [type(r) for r in records] == [ActionResult]:
                self.task.cancel()
                await asyncio.sleep(0)  # the cancellation lands here, the write being durable

    log: list[str] = []
    journal = CancelAfterResult()
    loop = Loop(
        ScriptedModel([call("done", {"answer": "a"})]),
        tools=make_tools(log),
        guards=[RunEndGuard(lambda ctx: Complete(), on_task_completed=True)],
        journal=journal,
    )
    task = asyncio.create_task(loop.run("g", run_id="k"))
    journal.task = task
    with pytest.raises(asyncio.CancelledError):
        await task
    _, records = await journal.read("k")
    results = [x for x in records if isinstance(x, ActionResult)]
    steps = [x.step for x in records if isinstance(x, StepWritten)]
    end = records[-1]
    assert len(results) == 1 and log == ["done a"]  # written once, executed once
    assert [s.tool_name for s in steps] == ["done"]
    assert isinstance(end, RunEnd) and end.stop_reason == StopReason.cancelled
    assert end.steps_used == 1 and end.actions_executed == 1
