"""The stdio transport against a server's bytes: an answer that cannot be read fails its call
at once (the server ran it), and text that is not valid Unicode is replaced and counted."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from polyloop import ActionStatus, StopReason, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.tools.mcp import MCPServer
from tests.conftest import call

from .conftest import faulty_argv, faulty_env, read_log
from .test_mcp_servers import outcomes, run, with_submit

# Long enough that an answer the transport dropped would end as "did not answer" instead.
_TIMEOUT_S = 20.0


@contextlib.asynccontextmanager
async def raw_answers(log: Path) -> AsyncIterator[ToolRegistry]:
    """The fault-injection server with its ``answer_raw`` tool, registered beside ``submit``."""
    tools = with_submit(ToolRegistry())
    env = faulty_env(log, FAULTY_RAW_ANSWERS="1")
    async with MCPServer.stdio(faulty_argv(), env=env, timeout_s=_TIMEOUT_S) as server:
        await server.register(tools)
        yield tools


@pytest.mark.parametrize(
    ("kind", "why"),
    [("deep", "nested too deeply"), ("neither", "neither a result nor an error")],
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
