"""SIGKILL PolyLoop in the middle of an MCP call, then resume: the tools are listed again from
the servers, and the replay policy recorded in the intent (from the annotations) decides."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from polyloop import ActionStatus, Loop, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from polyloop.tools.mcp import MCPServer
from polyloop.types import ActionIntent
from tests.conftest import call

from .conftest import ROOT, commits, faulty_argv, faulty_env, git_repo, read_log
from .crash_child import tools_with_submit


def start_child(
    journal: Path, run_id: str, argv: list[str], tool: str, args: dict[str, Any], **env: str
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.mcp.crash_child", str(journal), run_id]
    command += [shlex.join(argv), tool, json.dumps(args)]
    return subprocess.Popen(command, cwd=ROOT, env=env or None)


def kill_when_logged(child: subprocess.Popen[bytes], log: Path, event: str) -> None:
    """SIGKILL the PolyLoop process once the server logged that it is running ``event``."""
    deadline = time.monotonic() + 60
    while not any(e["event"] == event for e in read_log(log)):
        assert child.poll() is None, "the child ended before the call was made"
        assert time.monotonic() < deadline, f"the server never logged {event}"
        time.sleep(0.05)
    child.kill()
    child.wait(timeout=30)


async def resume(journal_path: Path, run_id: str, server: MCPServer, **register: Any) -> Any:
    """Resume in this process, the tools listed again from a new connection to the server;
    the model's next reply (after the replayed action) submits."""
    journal = SQLiteJournal(journal_path)
    tools = tools_with_submit()
    try:
        async with server:
            await server.register(tools, **register)
            model = ScriptedModel([call("submit", {"answer": "done"})])
            return await Loop(model, tools=tools, journal=journal).resume(run_id)
    finally:
        await journal.aclose()


async def intent_of(journal_path: Path, run_id: str) -> ActionIntent:
    journal = SQLiteJournal(journal_path, read_only=True)
    try:
        _, records = await journal.read(run_id)
    finally:
        await journal.aclose()
    return next(r for r in records if isinstance(r, ActionIntent) and r.step_idx == 0)


async def test_killed_mid_call_a_read_only_tool_is_replayed_with_the_same_op_id(
    tmp_path: Path, faulty_log: Path
) -> None:
    journal = tmp_path / "j.db"
    env = faulty_env(faulty_log)
    child = start_child(journal, "r1", faulty_argv(), "slow_lookup", {"seconds": 2}, **env)
    await asyncio.to_thread(kill_when_logged, child, faulty_log, "slow_lookup")
    intent = await intent_of(journal, "r1")
    assert intent.replay_policy == "idempotent"  # readOnlyHint: true
    result = await resume(journal, "r1", MCPServer.stdio(faulty_argv(), env=env))
    assert result.stop_reason == StopReason.task_completed
    assert result.steps[0].action_status == ActionStatus.executed
    assert result.steps[0].observation == "looked up after 2.0 s"
    calls = [e for e in read_log(faulty_log) if e["event"] == "slow_lookup"]
    assert [e["op_id"] for e in calls] == [intent.op_id, intent.op_id]  # the same op_id twice


async def test_killed_mid_call_a_destructive_tool_ends_resume_state_unknown(
    tmp_path: Path, faulty_log: Path
) -> None:
    journal = tmp_path / "j.db"
    env = faulty_env(faulty_log)
    args = {"name": "prod", "seconds": 30}
    child = start_child(journal, "r2", faulty_argv(), "slow_delete", args, **env)
    await asyncio.to_thread(kill_when_logged, child, faulty_log, "slow_delete")
    result = await resume(journal, "r2", MCPServer.stdio(faulty_argv(), env=env))
    assert result.stop_reason == StopReason.resume_state_unknown
    assert result.pending_action is not None and result.pending_action.tool_name == "slow_delete"
    assert "policy=never" in (result.stop_detail or "")
    assert [e["event"] for e in read_log(faulty_log)] == ["slow_delete"]  # never repeated


async def test_killed_with_a_git_commit_in_flight_resume_does_not_commit_twice(
    tmp_path: Path,
) -> None:
    repo = git_repo(tmp_path / "repo", staged="two\n")
    journal = tmp_path / "j.db"
    argv = [sys.executable, "-m", "mcp_server_git", "-r", str(repo)]
    args = {"repo_path": str(repo), "message": "second"}
    command = [sys.executable, "-m", "tests.mcp.crash_child", str(journal), "r3"]
    command += [shlex.join(argv), "git_commit", json.dumps(args), "kill-at-start"]
    done = await asyncio.to_thread(subprocess.run, command, cwd=ROOT, timeout=120)
    assert done.returncode == -9  # killed with the intent durable and no result
    assert (await intent_of(journal, "r3")).replay_policy == "never"
    result = await resume(journal, "r3", MCPServer.stdio(argv))
    assert result.stop_reason == StopReason.resume_state_unknown
    assert "git_commit" in (result.stop_detail or "")
    assert commits(repo) == ["first"]  # not committed by the resume


async def test_a_tool_that_vanished_from_the_server_is_treated_as_never(
    tmp_path: Path, faulty_log: Path
) -> None:
    journal = tmp_path / "j.db"
    env = faulty_env(faulty_log)
    child = start_child(journal, "r4", faulty_argv(), "slow_lookup", {"seconds": 30}, **env)
    await asyncio.to_thread(kill_when_logged, child, faulty_log, "slow_lookup")
    server = MCPServer.stdio(faulty_argv(), env=env)
    result = await resume(journal, "r4", server, include=["lookup"])  # slow_lookup is gone
    assert result.stop_reason == StopReason.resume_state_unknown
    assert "slow_lookup" in (result.stop_detail or "")
    assert len([e for e in read_log(faulty_log) if e["event"] == "slow_lookup"]) == 1
