"""Tools whose names model APIs refuse: ``register`` refuses the whole server unless told to
skip them (``on_skipped``), and ``polyloop run`` skips them, says which and why, and lets
``--mcp-include`` / ``--mcp-exclude`` choose the tools."""

from __future__ import annotations

import asyncio
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from polyloop import ConfigError, ToolRegistry
from polyloop.tools.mcp import MCPServer
from tests.e2e.test_cli import CLI, SlowableServer, assert_one_line_error, run_args, run_id_of
from tests.fakes.openai_server import completion, tool_call

from .conftest import faulty_argv, faulty_env, read_log
from .test_mcp_cli import stored_config

FAULTY_TOOLS = {"lookup", "slow_lookup", "slow_delete", "die", "hang", "fail"}
REASON = "is not ^[a-zA-Z0-9_-]{1,64}$ (what model APIs accept)"


async def test_register_refuses_a_server_with_an_invalid_tool_name_whole(
    faulty_log: Path,
) -> None:
    tools = ToolRegistry()
    env = faulty_env(faulty_log, FAULTY_BAD_NAME="1")
    async with MCPServer.stdio(faulty_argv(), env=env) as server:
        with pytest.raises(ConfigError, match=r"names \['bad name', 'also.bad'\] are not"):
            await server.register(tools)
    assert tools.names() == ()


async def test_register_with_on_skipped_registers_the_valid_tools_and_reports_the_others(
    faulty_log: Path,
) -> None:
    tools = ToolRegistry()
    skipped: list[tuple[str, str]] = []
    env = faulty_env(faulty_log, FAULTY_BAD_NAME="1")
    async with MCPServer.stdio(faulty_argv(), env=env) as server:
        registered = await server.register(
            tools, prefix="f_", on_skipped=lambda name, why: skipped.append((name, why))
        )
    assert {t.name for t in registered} == {"f_" + n for n in FAULTY_TOOLS}
    assert sorted(skipped) == [
        ("also.bad", f"its name 'f_also.bad' {REASON}"),
        ("bad name", f"its name 'f_bad name' {REASON}"),
    ]


def offered_names(fake: SlowableServer) -> set[str]:
    return {t["function"]["name"] for t in fake.requests[0].body["tools"]}


def test_run_registers_the_valid_tools_of_a_server_and_says_which_it_skipped(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    cli.env |= {"FAULTY_LOG": str(tmp_path / "faulty.log"), "FAULTY_BAD_NAME": "1"}
    spec = shlex.join(faulty_argv())
    fake.script(
        completion(tool_calls=[tool_call("lookup", '{"key": "k"}')]),
        completion("found it", id="chatcmpl-2"),
    )
    done = cli(*run_args(fake, workspace, "--mcp", spec))
    assert done.code == 0, done
    assert offered_names(fake) >= FAULTY_TOOLS
    assert not {"bad name", "also.bad"} & offered_names(fake)
    skipped = [line for line in done.err.splitlines() if "skipped" in line]
    assert skipped == [
        f"polyloop: --mcp {spec!r}: skipped the tool 'bad name': its name 'bad name' {REASON}",
        f"polyloop: --mcp {spec!r}: skipped the tool 'also.bad': its name 'also.bad' {REASON}",
    ]


def test_run_mcp_include_and_exclude_choose_the_tools_and_are_stored_with_the_run(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    cli.env["FAULTY_LOG"] = str(tmp_path / "faulty.log")
    spec = shlex.join(faulty_argv())
    fake.script(completion("nothing to do"))
    done = cli(*run_args(fake, workspace, "--mcp", spec, "--mcp-include", "lookup,fail"))
    assert done.code == 0, done
    assert offered_names(fake) & FAULTY_TOOLS == {"lookup", "fail"}
    stored = asyncio.run(stored_config(workspace.parent / "j.db", run_id_of(done.out)))
    assert stored["mcp_include"] == ["lookup", "fail"]
    fake.requests.clear()
    fake.script(completion("nothing to do"))
    done = cli(
        *run_args(fake, workspace, "--mcp", spec, "--mcp-exclude", "die,hang", journal="k.db")
    )
    assert done.code == 0, done
    assert offered_names(fake) & FAULTY_TOOLS == FAULTY_TOOLS - {"die", "hang"}


def test_run_mcp_include_of_a_name_no_server_offers_is_one_line(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    cli.env["FAULTY_LOG"] = str(tmp_path / "faulty.log")
    spec = shlex.join(faulty_argv())
    done = cli(*run_args(fake, workspace, "--mcp", spec, "--mcp-include", "lookup,lokup"))
    assert_one_line_error(done)
    assert "--mcp-include names ['lokup'], which no --mcp server offers" in done.err
    both = cli(
        *run_args(fake, workspace, "--mcp", spec, "--mcp-include", "a", "--mcp-exclude", "b")
    )
    assert_one_line_error(both)
    alone = cli(*run_args(fake, workspace, "--mcp-exclude", "die"))
    assert_one_line_error(alone)
    assert fake.requests == []  # no run started


def test_resume_registers_the_tools_the_run_chose(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    log = tmp_path / "faulty.log"
    cli.env["FAULTY_LOG"] = str(log)
    fake.script(
        completion(tool_calls=[tool_call("slow_lookup", '{"seconds": 2}')]),
        completion("looked it up", id="chatcmpl-2"),
    )
    chosen = ("--mcp-include", "slow_lookup,lookup")
    args = run_args(fake, workspace, "--mcp", shlex.join(faulty_argv()), *chosen)
    child = subprocess.Popen(
        cli.argv(args), cwd=cli.cwd, env=cli.env, stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not read_log(log):
        assert child.poll() is None and time.monotonic() < deadline, "no call reached the server"
        time.sleep(0.05)
    child.kill()  # SIGKILL, mid-call
    out, _ = child.communicate(timeout=30)
    done = cli("resume", run_id_of(out), "--journal", "j.db")
    assert done.code == 0, done
    resumed = {t["function"]["name"] for t in fake.requests[-1].body["tools"]}
    assert resumed & FAULTY_TOOLS == {"slow_lookup", "lookup"}
