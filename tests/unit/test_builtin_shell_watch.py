"""Workspace tools: what a shell command changes among the watched files is reported as the
file tools report their edits (test files with their signs; with ``writable_paths``, every
file written outside them)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

import polyloop
from polyloop.testing import ScriptedModel
from polyloop.tools import ToolEnvironment
from polyloop.tools.builtin import workspace_tools
from polyloop.types import Action, ActionStatus, FileEdit, Outcome, TestEdit, ToolContext
from tests.conftest import call
from tests.unit.test_builtin_test_edits import root

CTX = ToolContext("run-1", 0, "op-1")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

__all__ = ["root"]  # the fixture, shared with the file tools' tests


async def run(env: ToolEnvironment, tool: str, **args: Any) -> Outcome:
    return await env.execute(Action(f"{tool}(...)", tool, args), CTX)


async def sh(env: ToolEnvironment, command: str) -> Outcome:
    return await run(env, "shell", command=command)


def env_for(root: Path, **kw: Any) -> ToolEnvironment:
    return ToolEnvironment(workspace_tools(root, **kw))


async def test_a_sed_on_a_test_file_is_reported_as_edit_file_reports_it(
    root: Path, tmp_path: Path
) -> None:
    twin = tmp_path / "twin"
    shutil.copytree(root, twin)
    by_tool = await run(
        env_for(twin), "edit_file", path="tests/test_orders.py", old="== 5", new=">= 0"
    )
    by_shell = await sh(env_for(root), "sed -i 's/== 5/>= 0/' tests/test_orders.py")
    assert by_shell.status is ActionStatus.executed
    assert (
        by_shell.edits
        == by_tool.edits
        == (FileEdit("tests/test_orders.py", True, ("assertion_changed",)),)
    )
    assert "[exit code 0]" in by_shell.observation


async def test_removing_overwriting_and_creating_test_files_through_the_shell(root: Path) -> None:
    env = env_for(root)
    (root / "tests" / "test_more.py").write_text("def test_more():\n    assert 1\n")
    removed = await sh(env, "rm tests/test_more.py")
    assert removed.edits == (
        FileEdit("tests/test_more.py", True, ("test_deleted", "assertion_deleted")),
    )
    emptied = await sh(env, "echo > tests/test_orders.py")
    assert emptied.edits == (
        FileEdit("tests/test_orders.py", True, ("test_deleted", "assertion_deleted")),
    )
    created = await sh(env, "printf 'def test_new():\\n    assert 2\\n' > shop/test_new.py")
    assert created.edits == (FileEdit("shop/test_new.py", True),)  # test_*.py anywhere


async def test_a_command_that_changes_no_watched_file_reports_no_edit(root: Path) -> None:
    env = env_for(root)
    assert (await sh(env, "cat tests/test_orders.py; echo x > shop/notes.txt")).edits == ()
    # a test file changed before the command (here by edit_file) is not the command's edit
    edited = await run(env, "edit_file", path="tests/test_orders.py", old="== 5", new="== 6")
    assert edited.edits[0].test_file
    assert (await sh(env, "true")).edits == ()
    # and the next change is compared with the file as edit_file left it
    again = await sh(env, "sed -i 's/== 6/== 7/' tests/test_orders.py")
    assert again.edits == (FileEdit("tests/test_orders.py", True, ("assertion_changed",)),)


async def test_caches_and_hidden_folders_are_not_watched(root: Path) -> None:
    env = env_for(root)
    command = (
        "mkdir -p .tox/tests node_modules/x __pycache__ venv && touch venv/pyvenv.cfg && "
        "echo 'def test_a(): pass' | tee .tox/tests/test_a.py node_modules/x/test_b.py "
        "__pycache__/test_c.py venv/test_d.py"
    )
    assert (await sh(env, command)).edits == ()


async def test_a_test_edit_through_the_shell_is_journaled_like_one_through_edit_file(
    root: Path,
) -> None:
    model = ScriptedModel(
        [call("shell", {"command": "sed -i '/refunded == 5/d' tests/test_orders.py"}), "done"]
    )
    result = await polyloop.Loop(model, tools=workspace_tools(root)).run("fix")
    assert result.stop_reason == polyloop.StopReason.agent_finished
    assert result.test_edits == (TestEdit(0, "tests/test_orders.py", ("assertion_deleted",)),)


async def test_shell_writes_outside_writable_paths_are_reported_and_not_undone(
    root: Path,
) -> None:
    (root / "README.md").write_text("shop\n")
    env = env_for(root, writable_paths=["shop"])
    inside = await sh(env, "echo x > shop/new.py")
    assert inside.edits == ()
    assert "Note:" not in inside.observation
    outside = await sh(env, "echo changed > README.md; echo y > notes.txt")
    assert outside.status is ActionStatus.executed
    assert outside.edits == (FileEdit("README.md"), FileEdit("notes.txt"))
    assert (
        "Note: this command changed files outside the paths that may be written (shop): "
        "README.md, notes.txt. They were not undone."
    ) in outside.observation
    assert (root / "README.md").read_text() == "changed\n"


async def test_in_a_read_only_workspace_every_shell_write_is_reported(root: Path) -> None:
    env = env_for(root, writable_paths=[])
    refused = await run(env, "write_file", path="shop/__init__.py", content="<path>")
    assert refused.status is ActionStatus.not_executed
    assert refused.observation == (
        "Error: writing to 'shop/__init__.py' is not allowed; nothing was done. Only these "
        "paths may be written: none (the workspace is read-only). Keep your changes inside them."
    )
    assert (root / "shop" / "__init__.py").read_text().startswith("def cancel")
    outcome = await sh(env, "rm shop/__init__.py && sed -i 's/== 5/>= 0/' tests/test_orders.py")
    assert outcome.edits == (
        FileEdit("shop/__init__.py"),
        FileEdit("tests/test_orders.py", True, ("assertion_changed",)),
    )
    assert (
        "(none (the workspace is read-only)): shop/__init__.py, tests/test_orders.py."
        in outcome.observation
    )
    many = await sh(env, "for i in $(seq 12); do echo > f$i.txt; done")
    assert "f6.txt, f7.txt and 2 more. They were not undone." in many.observation
    assert len(many.edits) == 12


async def test_no_test_paths_and_no_writable_paths_watch_nothing(root: Path) -> None:
    env = env_for(root, test_paths=[])
    outcome = await sh(env, "sed -i 's/== 5/>= 0/' tests/test_orders.py; rm shop/__init__.py")
    assert outcome.edits == ()
    other = await sh(env_for(root, test_paths=["checks/**"]), "echo > checks.py; echo > t.py")
    assert other.edits == ()
