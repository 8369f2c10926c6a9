"""A PolyLoop process to SIGKILL mid-call: it starts a journaled run whose first action calls
an MCP tool, then its second one submits.

    python -m tests.mcp.crash_child JOURNAL RUN_ID SERVER TOOL ARGS_JSON [kill-at-start]

SERVER is a command line (``MCPServer.from_spec``). With ``kill-at-start`` the process kills
itself once the action's intent is durable (when ActionStarted is emitted), else the test
kills it while the call runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from polyloop import Loop, ToolRegistry
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from polyloop.tools.mcp import MCPServer
from polyloop.types import ActionStarted
from tests.conftest import call


def tools_with_submit() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(completion_marker=True)
    def submit(answer: str) -> str:
        """Submit the final answer."""
        return "submitted"

    return tools


def model(tool: str, args: dict[str, Any]) -> ScriptedModel:
    return ScriptedModel([call(tool, args), call("submit", {"answer": "done"})])


async def main(journal_path: str, run_id: str, spec: str, tool: str, args: str, kill: bool) -> None:
    def observer(event: Any) -> None:
        if kill and isinstance(event, ActionStarted):
            os.kill(os.getpid(), signal.SIGKILL)

    journal = SQLiteJournal(journal_path)
    tools = tools_with_submit()
    async with MCPServer.from_spec(spec) as server:
        await server.register(tools)
        loop = Loop(
            model(tool, json.loads(args)), tools=tools, journal=journal, observers=[observer]
        )
        await loop.run("crash me", run_id=run_id)
    await journal.aclose()


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], a[3], a[4], len(a) > 5 and a[5] == "kill-at-start"))
