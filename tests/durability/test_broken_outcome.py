"""An environment that breaks the ``Outcome`` contract ends its step ``env_error``, recorded in
the step and the end record, on every journal (kernel.md §3, §6 G): never a crash after the
action executed, leaving no step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from polyloop import (
    Action,
    ActionStatus,
    Loop,
    ModelReply,
    Outcome,
    ReplayPolicy,
    StopReason,
    ToolContext,
)
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelRequest, ToolSpec
from tests.conftest import Crash, call
from tests.durability.conftest import OpenJournal

SPEC: ToolSpec = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Act.",
        "parameters": {"type": "object", "properties": {}},
    },
}


class CustomEnvironment:
    """A user's own environment: its ``execute`` (and ``reconcile``) answer with ``answer()``."""

    def __init__(self, answer: Callable[[], Any], policy: ReplayPolicy = ReplayPolicy.never):
        self.answer = answer
        self.policy = policy
        self.executed: list[str] = []
        self.reconciled: list[str] = []

    def tool_specs(self) -> Sequence[ToolSpec]:
        return (SPEC,)

    def replay_policy(self, action: Action) -> ReplayPolicy:
        return self.policy

    async def execute(self, action: Action, ctx: ToolContext) -> Outcome:
        self.executed.append(ctx.op_id)
        return self.answer()  # type: ignore[no-any-return]

    async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None:
        self.reconciled.append(ctx.op_id)
        return self.answer()  # type: ignore[no-any-return]


def script(request: ModelRequest) -> ModelReply:
    return call("act", {}, "c1") if request.step_idx == 0 else ModelReply("never asked")


def completed_none() -> Outcome:
    return Outcome(ActionStatus.executed, "did it", completed=None)  # type: ignore[arg-type]


def outcome_like() -> Any:
    return {"status": "executed", "observation": "did it", "completed": True}


BROKEN = {
    "constructs_Outcome_with_completed_None": (
        completed_none,
        "Outcome.completed must be a bool, got None",
    ),
    "returns_a_dict": (outcome_like, "it returned dict, not an Outcome"),
}


@pytest.mark.parametrize("name", list(BROKEN))
async def test_an_environment_breaking_the_outcome_contract_ends_env_error_with_a_step(
    name: str, every_journal: OpenJournal
) -> None:
    answer, message = BROKEN[name]
    env = CustomEnvironment(answer)
    async with every_journal() as journal:
        loop = Loop(FunctionModel(script), environment=env, journal=journal, clock=FakeClock())
        r = await loop.run("go", run_id="r")
        _, records = await journal.read("r")
    assert len(env.executed) == 1
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    (step,) = r.steps
    assert step.action_status == ActionStatus.env_error
    assert step.observation_synthetic and not step.completed
    assert step.tool_name == "act"
    assert step.observation is not None and message in step.observation
    assert step.observation.startswith("MalformedValue: the environment's execute() broke")
    assert r.stop_detail == step.observation  # "<ErrorClass>: <message>"
    end = records[-1]
    assert end.kind == "end" and end.stop_reason == StopReason.env_error  # type: ignore[union-attr]
    assert end.stop_detail == r.stop_detail  # type: ignore[union-attr]
    assert [x.kind for x in records[-3:]] == ["action_result", "step", "end"]
    async with every_journal() as journal:  # ended: resume rebuilds it, calls nothing
        again = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
    assert again.steps == r.steps and again.stop_detail == r.stop_detail
    assert len(env.executed) == 1


@pytest.mark.parametrize("name", list(BROKEN))
async def test_a_reconcile_breaking_the_outcome_contract_ends_env_error_with_a_step(
    name: str, every_journal: OpenJournal
) -> None:
    answer, message = BROKEN[name]
    crashing = CustomEnvironment(answer, ReplayPolicy.reconcile)

    async def dies(action: Action, ctx: ToolContext) -> Outcome:
        raise Crash("the process dies with the action in flight")

    crashing.execute = dies  # type: ignore[method-assign]
    async with every_journal() as journal:
        loop = Loop(FunctionModel(script), environment=crashing, journal=journal)
        with pytest.raises(Crash):
            await loop.run("go", run_id="r")
    env = CustomEnvironment(answer, ReplayPolicy.reconcile)
    async with every_journal() as journal:
        r = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
    assert len(env.reconciled) == 1 and env.executed == []
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    (step,) = r.steps
    assert step.action_status == ActionStatus.env_error and step.observation_synthetic
    assert step.observation is not None and message in step.observation
    assert "the environment's reconcile() broke its contract" in step.observation
    assert r.stop_detail == step.observation


async def test_a_synchronous_execute_ends_env_error_with_a_step_keeping_what_it_returned(
    every_journal: OpenJournal,
) -> None:
    env = CustomEnvironment(lambda: Outcome(ActionStatus.executed, "charged the card"))

    def execute(action: Action, ctx: ToolContext) -> Outcome:  # not async: it runs at once
        env.executed.append(ctx.op_id)
        return env.answer()  # type: ignore[no-any-return]

    env.execute = execute  # type: ignore[assignment,method-assign]
    async with every_journal() as journal:
        loop = Loop(FunctionModel(script), environment=env, journal=journal, clock=FakeClock())
        r = await loop.run("go", run_id="r")
    assert len(env.executed) == 1
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    (step,) = r.steps
    assert step.action_status == ActionStatus.env_error and step.observation_synthetic
    assert step.observation is not None
    assert step.observation.startswith(
        "MalformedValue: the environment's execute() broke its contract: execute() must be async"
    )
    assert "executed: charged the card" in step.observation  # what it returned is kept
    async with every_journal() as journal:  # ended: nothing runs again
        again = await Loop(FunctionModel(script), environment=env, journal=journal).resume("r")
    assert again.steps == r.steps and len(env.executed) == 1
