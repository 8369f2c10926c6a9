"""An MCP call still waiting when the run's time budget ends is given up at the budget plus the
grace (``ToolContext.timeout_s``), recorded as the server's own ``timeout_s`` is: an executed
``MCPTimeout`` failure. Without the cap it would wait for the server's 120 s."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from polyloop import ActionStatus, Limits, Loop, StopReason
from polyloop.journal import MemoryJournal
from polyloop.testing import ScriptedModel
from tests.conftest import call

from .test_mcp_servers import faulty_tools


async def test_an_mcp_call_that_hangs_is_given_up_at_the_time_budget(faulty_log: Path) -> None:
    async with faulty_tools(faulty_log) as (server, tools):
        assert server.timeout_s == 120.0
        model = ScriptedModel([call("hang", {}), call("submit", {"answer": "late"})])
        loop = Loop(
            model,
            tools=tools,
            journal=MemoryJournal(),
            limits=Limits(max_seconds=0.5),
            time_budget_grace_s=0.25,
        )
        async with asyncio.timeout(60):  # far below the server's timeout, far above the cap
            r = await loop.run("use the tools")
    assert r.stop_reason == StopReason.time_budget
    [step] = r.steps
    assert step.action_status is ActionStatus.executed
    assert step.observation is not None
    seconds = re.search(r"did not answer within ([0-9.]+) s", step.observation)
    assert seconds is not None, step.observation
    assert 0.25 < float(seconds.group(1)) <= 0.75
