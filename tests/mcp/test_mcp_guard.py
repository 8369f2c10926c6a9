"""The failure guard and an MCP tool's errors: the escalation report's advice fits an error of a
call (it names no test to run alone), and ``known_failures`` can name that error's type."""

from __future__ import annotations

from polyloop import Limits, Loop, StopReason, ToolRegistry
from polyloop.testing import ScriptedModel
from polyloop.tools.mcp import MCPServer
from tests.conftest import call

from .conftest import TIME

WRONG = {"timezone": "Not/AZone"}


async def stopped_on_mcp_errors(limits: Limits) -> tuple[StopReason, object]:
    tools = ToolRegistry()
    async with MCPServer.stdio(TIME) as server:
        await server.register(tools)
        model = ScriptedModel([call("get_current_time", WRONG), call("get_current_time", WRONG),
                               call("get_current_time", WRONG)])  # fmt: skip
        result = await Loop(model, tools=tools, limits=limits).run("what time is it there")
    return result.stop_reason, result.report


async def test_the_report_on_a_repeated_mcp_error_advises_on_the_call_not_a_test() -> None:
    reason, report = await stopped_on_mcp_errors(Limits(max_steps=3, same_failure_limit=2))
    assert reason == StopReason.repeated_failure and report is not None
    text = report.to_markdown()  # type: ignore[attr-defined]
    assert "alone" not in text, text
    assert "The same error keeps coming back (`MCPToolError`" in text, text
    assert "read the call that fails with `MCPToolError` (its arguments" in text, text


async def test_known_failures_can_name_a_tool_errors_type() -> None:
    limits = Limits(max_steps=3, same_failure_limit=2, known_failures=("MCPToolError",))
    reason, _ = await stopped_on_mcp_errors(limits)
    assert reason == StopReason.step_budget
