"""What a call becomes when the server fails: killed mid-call, dead between calls, never
answering, never starting, unreachable; and what a cancelled run sends it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from polyloop import ActionStatus, Loop, StopReason, ToolContext, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.testing import ScriptedModel
from polyloop.tools.mcp import MCPServer, MCPServerError
from tests.conftest import call

from .conftest import HttpServer, faulty_argv, faulty_env, read_log
from .test_mcp_servers import faulty_tools, run, with_submit


def ctx(op_id: str) -> ToolContext:
    return ToolContext("run", 0, op_id)


async def wait_for_event(log: Path, event: str) -> None:
    """Until the server (another process) logged ``event``: polling its file is all there is."""
    async with asyncio.timeout(30):
        while not any(e["event"] == event for e in read_log(log)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_server_killed_mid_call_is_an_executed_failure_then_it_is_restarted(
    faulty_log: Path,
) -> None:
    async with MCPServer.stdio(faulty_argv(), env=faulty_env(faulty_log)) as server:
        first_pid = server.pid
        assert first_pid is not None
        call_task = asyncio.ensure_future(
            server.call_tool("slow_lookup", {"seconds": 30}, ctx("op-1"))
        )
        await wait_for_event(faulty_log, "slow_lookup")
        os.kill(first_pid, signal.SIGKILL)
        lost = await call_task
        assert lost.status == ActionStatus.executed  # it reached the server: it may have acted
        assert lost.failure is not None and lost.failure.error_type == "MCPConnectionLost"
        assert "may or may not have acted" in lost.observation
        # the next call starts the server again, once, and goes through
        again = await server.call_tool("lookup", {"key": "k"}, ctx("op-2"))
        assert again.status == ActionStatus.executed and again.observation == "value of k"
        assert server.pid not in (None, first_pid)


async def test_server_dead_between_calls_is_restarted_once_and_the_call_goes_through(
    faulty_log: Path,
) -> None:
    async with faulty_tools(faulty_log) as (server, tools):
        died = await server.call_tool("die", {}, ctx("op-die"))
        assert died.status == ActionStatus.executed  # it exited while running the call
        result = await run(tools, call("lookup", {"key": "a"}))
    assert result.stop_reason == StopReason.task_completed
    assert result.steps[0].observation == "value of a"


async def test_a_server_that_keeps_failing_to_start_is_env_error(
    faulty_log: Path, tmp_path: Path
) -> None:
    flag = tmp_path / "refuse"
    tools = with_submit(ToolRegistry())
    server = MCPServer.stdio(
        faulty_argv(), env=faulty_env(faulty_log, FAULTY_FAIL_START_IF=str(flag))
    )
    async with server:
        await server.register(tools)
        await server.call_tool("die", {}, ctx("op-die"))  # it exits mid-call
        flag.touch()  # from now on every start fails
        result = await run(tools, call("lookup", {"key": "a"}))
    assert result.stop_reason == StopReason.env_error
    assert result.steps[-1].action_status == ActionStatus.env_error
    assert "refusing to start" in (result.stop_detail or "")
    assert [e["event"] for e in read_log(faulty_log)] == ["die"]  # lookup reached no server


async def test_a_server_that_cannot_start_at_all_is_a_one_line_error(faulty_log: Path) -> None:
    server = MCPServer.stdio(faulty_argv(), env=faulty_env(faulty_log, FAULTY_FAIL_START="1"))
    with pytest.raises(MCPServerError) as info:
        await server.connect()
    message = str(info.value)
    assert "\n" not in message and "cannot start the MCP server" in message
    assert "refusing to start" in message
    assert server.pid is None


async def test_a_server_that_never_answers_times_out_as_an_executed_failure(
    faulty_log: Path,
) -> None:
    async with MCPServer.stdio(faulty_argv(), env=faulty_env(faulty_log), timeout_s=1) as s:
        outcome = await s.call_tool("hang", {}, ctx("op-hang"))
        assert outcome.status == ActionStatus.executed
        assert outcome.failure is not None and outcome.failure.error_type == "MCPTimeout"
        assert "did not answer within 1 s" in outcome.observation
        # the session is still usable
        assert (await s.call_tool("lookup", {"key": "x"}, ctx("op-x"))).observation == (
            "value of x"
        )


async def test_an_http_server_that_went_away_means_not_sent_then_not_executed(
    everything: list[str],
) -> None:
    http = HttpServer(everything)
    try:
        async with MCPServer.http(http.url) as server:
            ok = await server.call_tool("echo", {"message": "a"}, ctx("op-a"))
            assert ok.observation == "Echo: a"
            pending = asyncio.ensure_future(
                server.call_tool(
                    "trigger-long-running-operation", {"duration": 20, "steps": 2}, ctx("op-b")
                )
            )
            await asyncio.sleep(1.0)  # the request is out; the server works on it
            http.stop()
            lost = await pending
            assert lost.status == ActionStatus.executed  # sent: it may have acted
            gone = await server.call_tool("echo", {"message": "c"}, ctx("op-c"))
            assert gone.status == ActionStatus.not_executed  # never sent: nothing happened
            assert "could not be reached" in gone.observation
    finally:
        http.stop()


async def test_cancelling_a_run_mid_call_sends_notifications_cancelled_after_the_grace(
    faulty_log: Path,
) -> None:
    journal = MemoryJournal()
    async with faulty_tools(faulty_log) as (_, tools):
        model = ScriptedModel([call("slow_lookup", {"seconds": 60})])
        loop = Loop(model, tools=tools, journal=journal, cancel_grace_s=0.5)
        task = asyncio.ensure_future(loop.run("look it up", run_id="r-cancel"))
        await wait_for_event(faulty_log, "slow_lookup")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for_event(faulty_log, "cancelled")  # the server was told, and stopped
        resumed = await loop.resume("r-cancel")
    assert resumed.stop_reason == StopReason.cancelled
    assert "slow_lookup" in (resumed.stop_detail or "")
    assert "outcome unknown" in (resumed.stop_detail or "")
    events = [e["event"] for e in read_log(faulty_log)]
    assert events == ["slow_lookup", "cancelled"]


async def test_a_call_that_finishes_within_the_cancellation_grace_is_kept(
    everything: list[str],
) -> None:
    tools = with_submit(ToolRegistry())
    async with MCPServer.stdio(everything) as server:
        await server.register(tools)
        model = ScriptedModel([call("trigger-long-running-operation", {"duration": 1, "steps": 2})])
        loop = Loop(model, tools=tools, journal=MemoryJournal(), cancel_grace_s=20)
        task = asyncio.ensure_future(loop.run("wait", run_id="r-grace"))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        resumed = await loop.resume("r-grace")
    assert resumed.stop_reason == StopReason.cancelled
    assert [s.action_status for s in resumed.steps] == [ActionStatus.executed]
    assert "Long running operation completed" in (resumed.steps[0].observation or "")
