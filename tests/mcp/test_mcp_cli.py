"""The command line: ``polyloop tools --mcp``, ``polyloop run --mcp`` and a resume that
connects to the stored servers again, as subprocesses against the fake OpenAI server."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from polyloop.journal import SQLiteJournal
from tests.e2e.test_cli import CLI, SlowableServer, assert_one_line_error, run_args, run_id_of
from tests.fakes.openai_server import completion, tool_call

from .conftest import TIME, faulty_argv, read_log


def tools_rows(out: str) -> dict[str, list[str]]:
    """``polyloop tools`` rows by tool name: [policy, hints, description...]."""
    rows = {}
    for line in out.splitlines():
        if line.startswith("  "):
            name, *rest = line.split()
            rows[name] = rest
    return rows


def test_tools_lists_each_servers_tools_with_their_derived_policies(
    cli: CLI, tmp_path: Path
) -> None:
    cli.env["FAULTY_LOG"] = str(tmp_path / "faulty.log")
    done = cli("tools", "--mcp", shlex.join(TIME), "--mcp", shlex.join(faulty_argv()))
    assert done.code == 0, done
    rows = tools_rows(done.out)
    assert rows["get_current_time"][:2] == [
        "idempotent",
        "readOnly,idempotent,!destructive,!openWorld",
    ]
    assert rows["slow_delete"][:2] == ["never", "!readOnly,!idempotent,destructive"]
    assert rows["die"][:2] == ["never", "(no"]  # (no annotations)
    assert "(mcp-time, 2 tools)" in done.out and "(faulty, 6 tools)" in done.out


def test_tools_without_a_server_or_with_a_broken_one_is_one_line(cli: CLI) -> None:
    assert_one_line_error(cli("tools"))
    done = cli("tools", "--mcp", "polyloop-no-such-server --x")
    assert_one_line_error(done)
    assert "cannot start the MCP server" in done.err


def test_run_with_an_mcp_server_then_the_stored_config(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(
        completion(tool_calls=[tool_call("get_current_time", '{"timezone": "Europe/Paris"}')]),
        completion("It is late in Paris.", id="chatcmpl-2"),
    )
    done = cli(*run_args(fake, workspace, "--mcp", shlex.join(TIME)))
    assert done.code == 0, done
    assert "agent_finished" in done.out
    names = {t["function"]["name"] for t in fake.requests[0].body["tools"]}
    assert {"read_file", "get_current_time", "convert_time"} <= names
    tool_msgs = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert '"timezone": "Europe/Paris"' in tool_msgs[0]["content"]
    stored = asyncio.run(stored_config(workspace.parent / "j.db", run_id_of(done.out)))
    assert stored["mcp"] == [shlex.join(TIME)]


async def stored_config(path: Path, run_id: str) -> dict[str, Any]:
    journal = SQLiteJournal(path, read_only=True)
    try:
        spec, _ = await journal.read(run_id)
    finally:
        await journal.aclose()
    return dict((spec.metadata or {})["cli"])


def test_run_with_clashing_tool_names_needs_mcp_prefix(
    cli: CLI, fake: SlowableServer, workspace: Path, filesystem: list[str]
) -> None:
    spec = shlex.join([*filesystem, str(workspace)])
    done = cli(*run_args(fake, workspace, "--mcp", spec))
    assert_one_line_error(done)
    assert "read_file" in done.err and "--mcp-prefix" in done.err
    fake.script(
        completion(
            tool_calls=[
                tool_call("secure-filesystem-server_read_text_file", '{"path": "notes.txt"}')
            ]
        ),
        completion("done", id="chatcmpl-2"),
    )
    done = cli(*run_args(fake, workspace, "--mcp", spec, "--mcp-prefix", journal="k.db"))
    assert done.code == 0, done
    tool_msgs = [m for m in fake.requests[-1].body["messages"] if m["role"] == "tool"]
    assert "the-launch-code" in tool_msgs[0]["content"]  # relative to the workspace


def test_resume_after_a_kill_mid_call_reconnects_and_replays_the_read_only_call(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    log = tmp_path / "faulty.log"
    cli.env["FAULTY_LOG"] = str(log)
    fake.script(
        completion(tool_calls=[tool_call("slow_lookup", '{"seconds": 2}')]),
        completion("looked it up", id="chatcmpl-2"),
    )
    args = run_args(fake, workspace, "--mcp", shlex.join(faulty_argv()))
    child = subprocess.Popen(
        cli.argv(args), cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not read_log(log):
        assert child.poll() is None and time.monotonic() < deadline, "no call reached the server"
        time.sleep(0.05)
    child.kill()  # SIGKILL, mid-call
    out, _ = child.communicate(timeout=30)
    run_id = run_id_of(out)
    done = cli("resume", run_id, "--journal", "j.db")
    assert done.code == 0, done
    assert "agent_finished" in done.out
    calls = [e["op_id"] for e in read_log(log) if e["event"] == "slow_lookup"]
    assert len(calls) == 2 and calls[0] == calls[1]  # replayed with the same op_id
