"""@tool(timeout_s=...): a call that runs past its time is stopped and is an executed failure
(it started, so its side effects may have happened), so one step cannot overrun a run's time
budget without bound."""

from __future__ import annotations

import threading
import time

import pytest

from polyloop import ConfigError, Limits, Loop, StopReason
from polyloop.testing import ScriptedModel
from polyloop.tools import ToolEnvironment, ToolRegistry
from polyloop.types import Action, ActionStatus, ToolContext
from tests.conftest import call

CTX = ToolContext("run-1", 0, "op-1")


def act(name: str) -> Action:
    return Action(text=f"{name}()", tool_name=name, arguments={})


async def test_an_async_tool_past_its_timeout_is_cancelled_and_an_executed_failure() -> None:
    tools = ToolRegistry()
    reached_the_end = []

    @tools.tool(timeout_s=0.05)
    async def slow() -> str:
        """Take too long."""
        import asyncio

        await asyncio.sleep(5)
        reached_the_end.append(True)
        return "done"

    out = await ToolEnvironment(tools).execute(act("slow"), CTX)
    assert out.status is ActionStatus.executed and out.synthetic
    assert out.observation == (
        "Error: 'slow' timed out after 0.05 s and was stopped; side effects may have happened."
    )
    assert out.failure is not None and out.failure.error_type == "TimeoutError"
    assert reached_the_end == [] and not out.marker


async def test_a_sync_tool_past_its_timeout_is_a_failure_while_its_thread_runs_on() -> None:
    tools = ToolRegistry()
    release = threading.Event()
    finished = threading.Event()

    @tools.tool(timeout_s=0.05, completion_marker=True)
    def stuck() -> str:
        """Block."""
        release.wait(5)
        finished.set()
        return "late"

    out = await ToolEnvironment(tools).execute(act("stuck"), CTX)
    assert out.failure is not None and "timed out after 0.05 s" in out.observation
    assert not out.marker  # a marker tool that timed out did not complete the run
    release.set()
    assert finished.wait(5)  # the thread could not be stopped; its result is discarded


async def test_a_tool_within_its_time_and_a_tools_own_timeout_error_are_ordinary() -> None:
    tools = ToolRegistry()

    @tools.tool(timeout_s=5)
    def quick() -> str:
        """Fast."""
        return "ok"

    @tools.tool(timeout_s=5)
    def raises() -> str:
        """Raise a TimeoutError of its own."""
        raise TimeoutError("upstream took too long")

    env = ToolEnvironment(tools)
    assert (await env.execute(act("quick"), CTX)).observation == "ok"
    out = await env.execute(act("raises"), CTX)
    assert out.observation == "Error: 'raises' raised TimeoutError: upstream took too long"


@pytest.mark.parametrize("bad", [0, -1.0, "5", True])
def test_a_bad_timeout_is_a_one_line_config_error(bad: object) -> None:
    tools = ToolRegistry()

    def f() -> str:
        """F."""
        return ""

    with pytest.raises(ConfigError, match="timeout_s must be a number of seconds > 0") as err:
        tools.register(f, timeout_s=bad)  # type: ignore[arg-type]
    assert "\n" not in str(err.value) and "f" not in tools.names()


async def test_a_timed_out_call_counts_as_an_action_and_the_run_goes_on() -> None:
    tools = ToolRegistry()

    @tools.tool(timeout_s=0.05)
    def hang() -> str:
        """Hang."""
        time.sleep(0.5)
        return "never seen"

    model = ScriptedModel([call("hang"), "gave up"])
    r = await Loop(model, tools=tools, limits=Limits(max_actions=5)).run("go")
    assert r.stop_reason == StopReason.agent_finished and r.actions_executed == 1
    assert r.steps[0].action_status == ActionStatus.executed
    assert "timed out" in (r.steps[0].observation or "")
