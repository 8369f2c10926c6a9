"""The stdio transport against a server's bytes and its process: an answer that cannot be
read fails its call at once (the server ran it), text that is not valid Unicode is replaced
and counted, and a server that ignores the end of its stdin still ends with PolyLoop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import ActionStatus, StopReason, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.tools.mcp import MCPServer
from tests.conftest import call

from .conftest import ROOT, faulty_argv, faulty_env, read_log
from .test_mcp_servers import outcomes, run, with_submit

# Long enough that an answer the transport dropped would end as "did not answer" instead.
_TIMEOUT_S = 20.0


@contextlib.asynccontextmanager
async def raw_answers(log: Path, **options: Any) -> AsyncIterator[ToolRegistry]:
    """The fault-injection server with its ``answer_raw`` tool, registered beside ``submit``."""
    tools = with_submit(ToolRegistry())
    env = faulty_env(log, FAULTY_RAW_ANSWERS="1")
    options.setdefault("timeout_s", _TIMEOUT_S)
    async with MCPServer.stdio(faulty_argv(), env=env, **options) as server:
        await server.register(tools)
        yield tools


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("deep", "nested too deeply"),
        ("neither", "neither a result nor an error"),
        # read, then refused by the SDK's call_tool (a RuntimeError, a ValidationError)
        ("unstructured", "output schema but did not return structured content"),
        ("invalid", "content: Input should be a valid list"),
    ],
)
async def test_an_answer_that_cannot_be_read_fails_the_call_at_once_as_executed(
    faulty_log: Path, kind: str, why: str
) -> None:
    journal = MemoryJournal()
    async with raw_answers(faulty_log) as tools:
        result = await run(tools, call("answer_raw", {"kind": kind}), journal=journal)
    step = result.steps[0]
    assert step.action_status == ActionStatus.executed  # the server ran it: it may have acted
    assert "malformed" in step.observation and why in step.observation
    assert "did not answer" not in step.observation
    failure = (await outcomes(journal, result.run_id))[0].failure
    assert failure is not None and failure.error_type == "MCPError"
    assert result.stop_reason == StopReason.task_completed
    assert [e["kind"] for e in read_log(faulty_log)] == [kind]


async def test_a_lone_surrogate_in_an_answer_is_replaced_and_counted(faulty_log: Path) -> None:
    journal = MemoryJournal()
    async with raw_answers(faulty_log) as tools:
        result = await run(tools, call("answer_raw", {"kind": "surrogate"}), journal=journal)
    step = result.steps[0]
    assert step.action_status == ActionStatus.executed
    assert (await outcomes(journal, result.run_id))[0].failure is None
    assert step.observation == "caf\ufffd ok"
    assert step.replaced_chars == 1


_HOLDER = """
import asyncio, json, sys
from polyloop.tools.mcp import MCPServer

async def main():
    argv, env = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    async with MCPServer.stdio(argv, env=env) as server:
        print(server.pid, flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (one nobody reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent-death signal: Linux")
def test_a_server_that_ignores_eof_ends_when_polyloop_is_killed(faulty_log: Path) -> None:
    env = faulty_env(faulty_log, FAULTY_IGNORE_EOF="1")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, json.dumps(faulty_argv()), json.dumps(env)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    server_pid = None
    try:
        assert holder.stdout is not None
        server_pid = int(holder.stdout.readline())
        assert _running(server_pid)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
        deadline = time.monotonic() + 30  # waiting for an event, with a generous limit
        while _running(server_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(server_pid), "the MCP server outlived the process that started it"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if server_pid is not None and _running(server_pid):
            os.kill(server_pid, signal.SIGKILL)
