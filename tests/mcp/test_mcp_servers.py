"""MCP tools through the real loop, against real servers: a round trip to task_completed on
each, annotations -> replay policies, schema validation, results -> observations."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import ActionStatus, ConfigError, Loop, ReplayPolicy, StopReason, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.testing import ScriptedModel
from polyloop.tools.mcp import MCPServer, replay_from_annotations
from polyloop.types import ActionIntent, ActionResult, Outcome
from tests.conftest import call

from .conftest import TIME, HttpServer, commits, faulty_argv, faulty_env, git_repo, read_log


def with_submit(tools: ToolRegistry) -> ToolRegistry:
    @tools.tool(completion_marker=True)
    def submit(answer: str) -> str:
        """Submit the final answer."""
        return "submitted"

    return tools


@contextlib.asynccontextmanager
async def faulty_tools(log: Path) -> AsyncIterator[tuple[MCPServer, ToolRegistry]]:
    """The fault-injection server, connected, its tools registered beside ``submit``."""
    tools = with_submit(ToolRegistry())
    async with MCPServer.stdio(faulty_argv(), env=faulty_env(log)) as server:
        await server.register(tools)
        yield server, tools


async def run(tools: ToolRegistry, *replies: Any, journal: Any = None) -> Any:
    model = ScriptedModel([*replies, call("submit", {"answer": "done"})])
    journal = journal if journal is not None else MemoryJournal()
    return await Loop(model, tools=tools, journal=journal).run("use the tools")


async def intents(journal: Any, run_id: str) -> dict[int, ActionIntent]:
    """step_idx -> the action intent written for it."""
    _, records = await journal.read(run_id)
    return {r.step_idx: r for r in records if isinstance(r, ActionIntent)}


async def outcomes(journal: Any, run_id: str) -> dict[int, Outcome]:
    """step_idx -> the outcome written for its action."""
    _, records = await journal.read(run_id)
    return {r.step_idx: r.outcome for r in records if isinstance(r, ActionResult)}


async def test_time_server_round_trip_to_task_completed() -> None:
    tools = with_submit(ToolRegistry())
    async with MCPServer.stdio(TIME) as server:
        await server.register(tools)
        result = await run(tools, call("get_current_time", {"timezone": "Asia/Tokyo"}))
    assert result.stop_reason == StopReason.task_completed
    first = result.steps[0]
    assert first.tool_name == "get_current_time"
    assert first.action_status == ActionStatus.executed
    assert '"timezone": "Asia/Tokyo"' in first.observation


async def test_git_server_round_trip_and_its_destructive_idempotent_reset(tmp_path: Path) -> None:
    repo = git_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("two\n")
    tools = with_submit(ToolRegistry())
    async with MCPServer.stdio([sys.executable, "-m", "mcp_server_git", "-r", str(repo)]) as s:
        registered = {t.name: t for t in await s.register(tools)}
        result = await run(
            tools,
            call("git_add", {"repo_path": str(repo), "files": ["a.txt"]}),
            call("git_status", {"repo_path": str(repo)}),
            call("git_commit", {"repo_path": str(repo), "message": "second"}),
        )
    assert result.stop_reason == StopReason.task_completed
    assert [s.action_status for s in result.steps[:3]] == [ActionStatus.executed] * 3
    assert "a.txt" in result.steps[1].observation
    assert commits(repo) == ["second", "first"]
    # git_reset is destructive and idempotent: repeating it adds nothing, so it replays.
    assert registered["git_reset"].replay is ReplayPolicy.idempotent
    assert registered["git_commit"].replay is ReplayPolicy.never
    assert registered["git_status"].replay is ReplayPolicy.idempotent


async def test_everything_server_results_become_observations(
    everything: list[str], tmp_path: Path
) -> None:
    tools = with_submit(ToolRegistry())
    store = tmp_path / "files"
    async with MCPServer.stdio(everything, store_dir=store) as server:
        await server.register(tools)
        result = await run(
            tools,
            call("echo", {"message": "hello"}),
            call("get-tiny-image", {}),
            call("get-structured-content", {"location": "New York"}),
            call("get-resource-links", {"count": 2}),
        )
    assert result.stop_reason == StopReason.task_completed
    echo, image, structured, links = (s.observation for s in result.steps[:4])
    assert echo == "Echo: hello"
    # the image is one summary line (type, size, where it was saved) between the texts
    saved = [p for p in store.iterdir()]
    assert len(saved) == 1 and saved[0].suffix == ".png"
    size = saved[0].stat().st_size
    assert f"[image image/png, {size} bytes, saved as {saved[0]}]" in image.splitlines()
    assert saved[0].read_bytes()[:4] == b"\x89PNG"
    # structured content kept as JSON (the text is that JSON: not repeated)
    assert structured.startswith("{") and '"temperature"' in structured
    assert structured.count('"temperature"') == 1
    assert "[resource link demo://resource/dynamic/" in links


async def test_filesystem_server_round_trip_with_a_prefix_beside_python_tools(
    filesystem: list[str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("remember the milk\n")
    tools = with_submit(ToolRegistry())

    @tools.tool
    def read_file(path: str) -> str:
        """A Python tool whose name the server also uses."""
        return "python"

    async with MCPServer.stdio([*filesystem, str(root)]) as server:
        with pytest.raises(ConfigError, match=r"already registered.*prefix="):
            await server.register(tools)
        assert tools.names() == ("submit", "read_file")  # all or nothing
        await server.register(tools, prefix="fs_")
        result = await run(
            tools,
            call("fs_read_text_file", {"path": str(root / "notes.txt")}),
            call("fs_write_file", {"path": str(root / "out.txt"), "content": "written"}),
            call("read_file", {"path": "x"}),
        )
    assert result.stop_reason == StopReason.task_completed
    assert result.steps[0].observation == "remember the milk\n"
    assert (root / "out.txt").read_text() == "written"
    assert result.steps[2].observation == "python"


async def test_everything_server_over_streamable_http(everything_http: HttpServer) -> None:
    tools = with_submit(ToolRegistry())
    async with MCPServer.http(everything_http.url) as server:
        assert server.pid is None and server.server_name
        await server.register(tools)
        result = await run(tools, call("get-sum", {"a": 2, "b": 3}))
    assert result.stop_reason == StopReason.task_completed
    assert result.steps[0].observation == "The sum of 2 and 3 is 5."


async def test_invalid_arguments_are_rejected_by_the_servers_schema_before_any_call(
    faulty_log: Path,
) -> None:
    journal = MemoryJournal()
    async with faulty_tools(faulty_log) as (_, tools):
        result = await run(
            tools,
            call("lookup", {"key": 3}),
            call("lookup", {}),
            call("no_such_tool", {}),
            journal=journal,
        )
    wrong_type, missing, unknown = result.steps[:3]
    written = await intents(journal, result.run_id)
    for step in result.steps[:3]:
        assert step.action_status == ActionStatus.not_executed
        assert written[step.step_idx].replay_policy == "idempotent"  # nothing could happen
    assert "'key': 3 is not of type 'string'" in wrong_type.observation
    assert "'key': required argument missing" in missing.observation
    assert "no_such_tool" in unknown.observation and "lookup" in unknown.observation
    assert read_log(faulty_log) == []  # the server never saw them


async def test_an_is_error_result_is_an_executed_failure_the_model_sees(
    faulty_log: Path,
) -> None:
    journal = MemoryJournal()
    async with faulty_tools(faulty_log) as (_, tools):
        result = await run(tools, call("fail", {"reason": "disk on fire"}), journal=journal)
    step = result.steps[0]
    assert step.action_status == ActionStatus.executed
    assert "disk on fire" in step.observation and not step.observation_synthetic
    failure = (await outcomes(journal, result.run_id))[0].failure
    assert failure is not None and failure.error_type == "MCPToolError"
    assert result.stop_reason == StopReason.task_completed


async def test_the_op_id_reaches_the_server_in_meta(faulty_log: Path) -> None:
    journal = MemoryJournal()
    async with faulty_tools(faulty_log) as (_, tools):
        result = await run(
            tools, call("lookup", {"key": "a"}), call("lookup", {"key": "b"}), journal=journal
        )
    seen = [e["op_id"] for e in read_log(faulty_log)]
    written = await intents(journal, result.run_id)
    assert seen == [written[0].op_id, written[1].op_id]
    assert seen[0] != seen[1]


async def test_overridden_policy_is_the_one_recorded(faulty_log: Path) -> None:
    tools = with_submit(ToolRegistry())
    journal = MemoryJournal()
    async with MCPServer.stdio(faulty_argv(), env=faulty_env(faulty_log)) as server:
        await server.register(tools, replay={"lookup": "never", "die": "idempotent"})
        result = await run(tools, call("lookup", {"key": "a"}), journal=journal)
        with pytest.raises(ConfigError, match="does not offer"):
            await server.register(ToolRegistry(), replay={"lokup": "never"})
    die = tools.get("die")
    assert die is not None and die.replay is ReplayPolicy.idempotent
    assert (await intents(journal, result.run_id))[0].replay_policy == "never"


@pytest.mark.parametrize(
    ("annotations", "policy"),
    [
        ({"readOnlyHint": True}, ReplayPolicy.idempotent),
        ({"idempotentHint": True, "destructiveHint": True}, ReplayPolicy.idempotent),
        ({"readOnlyHint": False, "idempotentHint": False}, ReplayPolicy.never),
        ({"destructiveHint": False}, ReplayPolicy.never),
        ({}, ReplayPolicy.never),
        (None, ReplayPolicy.never),
    ],
)
def test_replay_policy_from_annotations(
    annotations: dict[str, Any] | None, policy: ReplayPolicy
) -> None:
    assert replay_from_annotations(annotations) is policy
