"""``polyloop run --ask-mcp``: MCP tools that ask a person first, by name or by their
annotations (``destructive``: not marked read-only), with the real ``mcp-server-git``; the
choice is stored with the run and a resume applies it to the tools listed again."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
from pathlib import Path

from tests.e2e.test_cli import CLI, SlowableServer, assert_one_line_error, run_args, run_id_of
from tests.fakes.openai_server import completion, tool_call

from .conftest import commits, git_repo
from .test_mcp_cli import stored_config


def git_call(name: str, args: dict[str, object], n: int) -> object:
    return completion(tool_calls=[tool_call(name, json.dumps(args), id=f"c{n}")], id=f"r{n}")


def test_ask_mcp_destructive_parks_the_tools_not_marked_read_only(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    repo = git_repo(workspace / "repo", staged="two\n")
    git = shlex.join([sys.executable, "-m", "mcp_server_git", "-r", str(repo)])
    fake.script(
        git_call("git_status", {"repo_path": str(repo)}, 1),  # readOnlyHint: runs at once
        git_call("git_commit", {"repo_path": str(repo), "message": "second"}, 2),
        completion("committed", id="r3"),
    )
    done = cli(*run_args(fake, workspace, "--mcp", git, "--ask-mcp", "destructive"))
    assert done.code == 5, done
    assert "step 1 wants git_commit " in done.out, done
    status = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert "a.txt" in status[0]["content"]  # git_status ran, unasked
    assert commits(repo) == ["first"]  # git_commit waits
    run_id = run_id_of(done.out)
    assert asyncio.run(stored_config(workspace.parent / "j.db", run_id))["mcp_ask"] == [
        "destructive"
    ]
    op = re.search(r"polyloop approve \S+ (\S+)", done.out)
    assert op, done.out
    assert cli("approve", run_id, op.group(1), "--journal", "j.db").code == 0
    end = cli("resume", run_id, "--journal", "j.db")
    assert end.code == 0 and "agent_finished" in end.out, end
    assert commits(repo) == ["second", "first"]


def test_ask_mcp_by_name_and_names_no_server_offers(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    repo = git_repo(workspace / "repo")
    git = shlex.join([sys.executable, "-m", "mcp_server_git", "-r", str(repo)])
    fake.script(git_call("git_log", {"repo_path": str(repo)}, 1))
    done = cli(*run_args(fake, workspace, "--mcp", git, "--ask-mcp", "git_log"))
    assert done.code == 5 and "wants git_log " in done.out, done  # read-only, but named
    bad = cli(*run_args(fake, workspace, "--mcp", git, "--ask-mcp", "git_push", journal="k.db"))
    assert_one_line_error(bad)
    assert "--ask-mcp names ['git_push'], which no --mcp server offers" in bad.err, bad
