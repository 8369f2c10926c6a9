"""The output cap on MCP tools: an answer of any size shows the model (and the journal keeps)
at most ``max_output_chars`` characters, its first and last halves, and the step records how
many it cut."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import ActionStatus, ConfigError, ToolContext, ToolRegistry
from polyloop.journal import SQLiteJournal
from polyloop.tools.mcp import DEFAULT_MCP_TEXTS, MCPServer
from tests.conftest import call

from .conftest import faulty_argv, faulty_env
from .test_mcp_servers import outcomes, run, with_submit

DEFAULT_CAP = 20_000  # the workspace tools' default


@contextlib.asynccontextmanager
async def big_server(log: Path, **options: Any) -> AsyncIterator[tuple[MCPServer, ToolRegistry]]:
    tools = with_submit(ToolRegistry())
    env = faulty_env(log, FAULTY_BIG="1")
    async with MCPServer.stdio(faulty_argv(), env=env, **options) as server:
        await server.register(tools)
        yield server, tools


def bytes_of(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern))


def omitted_note(n: int) -> str:
    return DEFAULT_MCP_TEXTS.omitted.format(omitted=n)


async def test_a_20_mb_answer_is_cut_at_the_cap_with_the_cut_recorded_and_the_journal_small(
    faulty_log: Path, tmp_path: Path
) -> None:
    chars = 20_000_000
    db = tmp_path / "j.db"
    journal = SQLiteJournal(db)
    try:
        async with big_server(faulty_log) as (_, tools):
            result = await run(tools, call("big", {"chars": chars}), journal=journal)
        step = result.steps[0]
        cut = chars - DEFAULT_CAP
        assert step.action_status == ActionStatus.executed
        assert step.observation_truncated_chars == cut
        assert step.observation == (
            "a" * 1000 + "x" * 9000 + omitted_note(cut) + "x" * 9000 + "b" * 1000
        )
        assert (await outcomes(journal, result.run_id))[0].truncated_chars == cut
    finally:
        await journal.aclose()
    size = bytes_of(tmp_path, "j.db*")
    assert size < 1_000_000, size  # three copies of 20,000 characters, not of 20 MB


async def test_the_cap_is_per_server_and_none_keeps_everything(
    faulty_log: Path, tmp_path: Path
) -> None:
    async with big_server(faulty_log, max_output_chars=1000) as (server, _):
        small = await server.call_tool("big", {"chars": 5000}, ToolContext("r", 0, "op-1"))
    assert small.observation == "a" * 500 + omitted_note(4000) + "b" * 500
    assert small.truncated_chars == 4000
    async with big_server(faulty_log, max_output_chars=None) as (server, _):
        whole = await server.call_tool("big", {"chars": 50_000}, ToolContext("r", 0, "op-2"))
    assert len(whole.observation) == 50_000 and whole.truncated_chars == 0


async def test_an_answer_within_the_cap_is_kept_whole(faulty_log: Path) -> None:
    async with big_server(faulty_log, max_output_chars=1000) as (server, _):
        outcome = await server.call_tool("big", {"chars": 1000}, ToolContext("r", 0, "op-1"))
    assert outcome.observation == "a" * 500 + "b" * 500 and outcome.truncated_chars == 0


async def test_an_error_result_is_cut_the_same_way(faulty_log: Path) -> None:
    async with big_server(faulty_log, max_output_chars=1000) as (server, _):
        outcome = await server.call_tool(
            "big", {"chars": 100_000, "error": True}, ToolContext("r", 0, "op-1")
        )
    assert outcome.status == ActionStatus.executed
    assert outcome.failure is not None and outcome.failure.error_type == "MCPToolError"
    sent = "Error executing tool big: " + "a" * 1000 + "x" * 98_000 + "b" * 1000  # the SDK's
    assert outcome.truncated_chars == len(sent) - 1000
    assert outcome.observation == sent[:500] + omitted_note(len(sent) - 1000) + sent[-500:]


@pytest.mark.parametrize("bad", [0, 99, True, 1000.0, "1000", -1])
def test_max_output_chars_must_be_an_int_of_at_least_100_or_none(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_output_chars must be an int >= 100"):
        MCPServer.stdio("python -m mcp_server_time", max_output_chars=bad)
