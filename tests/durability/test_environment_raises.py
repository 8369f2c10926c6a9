"""An environment whose method raises an ordinary exception (a bug in it) ends the run
``env_error``, with the step recorded (design 0004, 决策三 F: the step is recorded
unconditionally) and the end record in the same transaction, on every journal: the exception's
type and message are the observation and the stop detail, its traceback goes to the log.
BaseExceptions that are not Exceptions (cancellation, KeyboardInterrupt, SystemExit, a dying
process) still propagate."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from polyloop import Action, ActionStatus, Loop, Outcome, ReplayPolicy, StopReason, ToolContext
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ActionResult
from tests.conftest import Crash
from tests.durability.conftest import OpenJournal
from tests.durability.test_broken_outcome import CustomEnvironment, script


def _done() -> Outcome:
    return Outcome(ActionStatus.executed, "did it")


@pytest.mark.parametrize("how", ["async", "sync"])
async def test_an_execute_that_raises_ends_env_error_with_its_step_and_end_record(
    how: str, every_journal: OpenJournal, caplog: pytest.LogCaptureFixture
) -> None:
    env = CustomEnvironment(_done)

    async def raises_async(action: Action, ctx: ToolContext) -> Outcome:
        env.executed.append(ctx.op_id)
        raise RuntimeError("bug")

    def raises_sync(action: Action, ctx: ToolContext) -> Any:
        env.executed.append(ctx.op_id)
        raise RuntimeError("bug")

    env.execute = raises_async if how == "async" else raises_sync  # type: ignore[method-assign]
    caplog.set_level(logging.ERROR, logger="polyloop")
    async with every_journal() as journal:
        loop = Loop(FunctionModel(script), environment=env, journal=journal, clock=FakeClock())
        r = await loop.run("go", run_id="r")
        _, records = await journal.read("r")
    assert len(env.executed) == 1
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    assert r.stop_detail == "RuntimeError: bug"  # kernel.md §7: "<ErrorClass>: <message>"
    (step,) = r.steps
    assert step.action_status == ActionStatus.env_error
    assert step.observation == "RuntimeError: bug" and step.observation_synthetic
    assert step.tool_name == "act" and not step.completed
    # The action_result says what is known: the environment was called (it may have acted).
    assert [x.kind for x in records[-3:]] == ["action_result", "step", "end"]
    result = records[-3]
    assert isinstance(result, ActionResult)
    assert result.outcome.status == ActionStatus.env_error
    assert result.outcome.failure is not None
    assert result.outcome.failure.error_type == "RuntimeError"
    assert result.outcome.failure.message == "bug"
    logged = [rec for rec in caplog.records if rec.exc_info is not None]
    assert logged and isinstance(logged[0].exc_info[1], RuntimeError)  # type: ignore[index]
    async with every_journal() as journal:  # ended: resume rebuilds it, runs nothing again
        again = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
    assert again.stop_reason == StopReason.env_error
    assert again.steps == r.steps and again.stop_detail == r.stop_detail
    assert len(env.executed) == 1


async def test_a_reconcile_that_raises_on_resume_ends_env_error_with_a_step(
    every_journal: OpenJournal,
) -> None:
    crashing = CustomEnvironment(_done, ReplayPolicy.reconcile)

    async def dies(action: Action, ctx: ToolContext) -> Outcome:
        raise Crash("the process dies with the action in flight")

    crashing.execute = dies  # type: ignore[method-assign]
    async with every_journal() as journal:
        with pytest.raises(Crash):  # not an Exception: it still propagates
            await Loop(FunctionModel(script), environment=crashing, journal=journal).run(
                "go", run_id="r"
            )
    env = CustomEnvironment(_done, ReplayPolicy.reconcile)

    async def lookup_fails(action: Action, ctx: ToolContext) -> Outcome | None:
        env.reconciled.append(ctx.op_id)
        raise ConnectionError("the ledger service is down")

    env.reconcile = lookup_fails  # type: ignore[method-assign]
    async with every_journal() as journal:
        r = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
        _, records = await journal.read("r")
    assert len(env.reconciled) == 1 and env.executed == []
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    (step,) = r.steps
    assert step.action_status == ActionStatus.env_error and step.observation_synthetic
    assert step.observation is not None
    assert step.observation.startswith("ConnectionError: the ledger service is down")
    assert "reconcile()" in step.observation and "not known" in step.observation
    assert r.stop_detail == step.observation
    assert [x.kind for x in records[-3:]] == ["action_result", "step", "end"]
    async with every_journal() as journal:
        again = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
    assert again.steps == r.steps and len(env.reconciled) == 1


@pytest.mark.parametrize("answer", ["raises", "not_a_policy"])
async def test_a_replay_policy_that_fails_ends_env_error_before_the_action_runs(
    answer: str, every_journal: OpenJournal
) -> None:
    env = CustomEnvironment(_done)

    def replay_policy(action: Action) -> ReplayPolicy:
        if answer == "raises":
            raise KeyError("act")
        return "sometimes"  # type: ignore[return-value]

    env.replay_policy = replay_policy  # type: ignore[method-assign]
    async with every_journal() as journal:
        loop = Loop(FunctionModel(script), environment=env, journal=journal, clock=FakeClock())
        r = await loop.run("go", run_id="r")
        _, records = await journal.read("r")
    assert env.executed == []  # nothing ran: its intent was never written
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    (step,) = r.steps
    assert step.action_status == ActionStatus.env_error and step.observation_synthetic
    assert step.tool_name == "act" and step.observation is not None
    expected = "KeyError: 'act'" if answer == "raises" else "MalformedValue: the environment's"
    assert step.observation.startswith(expected)
    assert "replay_policy()" in step.observation and "not executed" in step.observation
    assert r.stop_detail == step.observation
    assert [x.kind for x in records[-3:]] == ["model_result", "step", "end"]
    async with every_journal() as journal:
        again = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
    assert again.steps == r.steps and env.executed == []


async def test_a_needs_approval_that_raises_ends_env_error_before_the_action_runs(
    every_journal: OpenJournal,
) -> None:
    env = CustomEnvironment(_done)

    def needs_approval(action: Action) -> bool:
        raise RuntimeError("approval table missing")

    env.needs_approval = needs_approval  # type: ignore[attr-defined]
    async with every_journal() as journal:
        loop = Loop(FunctionModel(script), environment=env, journal=journal, clock=FakeClock())
        r = await loop.run("go", run_id="r")
        _, records = await journal.read("r")
    assert env.executed == []
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    assert r.stop_detail == (
        "RuntimeError: approval table missing (raised by the environment's needs_approval()); "
        "the action was not executed"
    )
    assert r.steps[0].observation == r.stop_detail
    assert [x.kind for x in records[-3:]] == ["model_result", "step", "end"]
