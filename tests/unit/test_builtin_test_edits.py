"""The workspace edit tools report their edits and flag what an edit does to a test file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from polyloop.tools import ToolEnvironment
from polyloop.tools.builtin import DEFAULT_TEST_PATHS, workspace_tools
from polyloop.tools.builtin._test_edits import TestPaths, tampering
from polyloop.types import Action, ActionStatus, ConfigError, FileEdit, Outcome, ToolContext

CTX = ToolContext("run-1", 0, "op-1")

TEST_ORDERS = """import pytest

from shop import cancel


def test_cancel_refunds():
    order = cancel("o1")
    assert order.refunded == 5
    assert order.status == "cancelled"


def test_shipped_order_refused():
    with pytest.raises(ValueError):
        cancel("shipped")
"""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    (r / "tests").mkdir(parents=True)
    (r / "shop").mkdir()
    (r / "shop" / "__init__.py").write_text("def cancel(order_id):\n    return order_id\n")
    (r / "tests" / "test_orders.py").write_text(TEST_ORDERS)
    return r


async def call(env: ToolEnvironment, tool: str, **args: Any) -> Outcome:
    return await env.execute(Action(f"{tool}(...)", tool, args), CTX)


async def edit(root: Path, old: str, new: str, **kw: Any) -> Outcome:
    env = ToolEnvironment(workspace_tools(root, shell=False, **kw))
    return await call(env, "edit_file", path="tests/test_orders.py", old=old, new=new)


@pytest.mark.parametrize(
    ("path", "is_test"),
    [
        ("tests/test_orders.py", True),
        ("tests/helpers/data.json", True),  # anything under tests/
        ("shop/test_cancel.py", True),  # test_*.py anywhere
        ("shop/cancel_test.py", True),
        ("web/cart_spec.js", True),
        ("spec/cart_spec.rb", True),
        ("shop/__init__.py", False),
        ("shop/testing.py", False),
        ("docs/tests.md", False),
        ("pkg/tests/conftest.py", False),  # only the top-level tests/ folder
    ],
)
def test_the_default_globs_name_test_files(path: str, is_test: bool) -> None:
    assert (path in TestPaths(DEFAULT_TEST_PATHS)) is is_test


async def test_an_edit_outside_the_tests_is_reported_unflagged(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root, shell=False))
    outcome = await call(env, "edit_file", path="shop/__init__.py", old="return order_id", new="1")
    assert outcome.edits == (FileEdit("shop/__init__.py"),)


async def test_deleting_an_assertion_is_flagged(root: Path) -> None:
    outcome = await edit(root, '    assert order.status == "cancelled"\n', "")
    assert outcome.status is ActionStatus.executed
    assert outcome.edits == (FileEdit("tests/test_orders.py", True, ("assertion_deleted",)),)


async def test_commenting_an_assertion_out_is_deleting_it(root: Path) -> None:
    outcome = await edit(root, "    assert order.refunded", "    # assert order.refunded")
    assert outcome.edits[0].tampering == ("assertion_deleted",)


async def test_loosening_an_assertion_is_flagged_as_changed(root: Path) -> None:
    # only part of the line is replaced: the whole line is compared
    outcome = await edit(root, "refunded == 5", "refunded >= 0")
    assert outcome.edits[0].tampering == ("assertion_changed",)


async def test_adding_a_skip_marker_is_flagged(root: Path) -> None:
    outcome = await edit(
        root, "def test_cancel_refunds():", '@pytest.mark.skip("later")\ndef test_cancel_refunds():'
    )
    assert outcome.edits[0].tampering == ("skip_added",)


async def test_overwriting_a_test_file_without_a_test_is_flagged(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root, shell=False))
    rest = TEST_ORDERS.split("\n\n\ndef test_shipped")[0] + "\n"
    outcome = await call(env, "write_file", path="tests/test_orders.py", content=rest)
    assert outcome.edits == (
        FileEdit("tests/test_orders.py", True, ("test_deleted", "assertion_deleted")),
    )


async def test_adding_a_test_is_flagged_without_a_sign(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root, shell=False))
    new_test = "\n\ndef test_more():\n    assert cancel('x') == 'x'\n"
    outcome = await call(
        env, "write_file", path="tests/test_new.py", content=TEST_ORDERS + new_test
    )
    assert outcome.edits == (FileEdit("tests/test_new.py", True),)
    outcome = await edit(root, "    with pytest.raises", "    # a comment\n    with pytest.raises")
    assert outcome.edits == (FileEdit("tests/test_orders.py", True),)


async def test_the_test_globs_are_configurable(root: Path) -> None:
    outcome = await edit(root, "refunded == 5", "refunded == 6", test_paths=["checks/**"])
    assert outcome.edits == (FileEdit("tests/test_orders.py"),)  # not a test file now
    with pytest.raises(ConfigError, match="test_paths"):
        workspace_tools(root, test_paths="tests/**")


async def test_writable_paths_can_forbid_test_edits(root: Path) -> None:
    for writable in (["!tests/**"], ["shop", "tests", "!tests/**"], ["!**/test_*.py"]):
        env = ToolEnvironment(workspace_tools(root, shell=False, writable_paths=writable))
        outcome = await call(env, "edit_file", path="tests/test_orders.py", old="== 5", new=">= 0")
        assert outcome.status is ActionStatus.not_executed, writable
        assert "refunded == 5" in (root / "tests" / "test_orders.py").read_text()
        fine = await call(env, "write_file", path="shop/new.py", content="x = 1\n")
        assert fine.status is ActionStatus.executed, writable


@pytest.mark.parametrize(
    ("before", "after", "signs"),
    [
        ("self.assertEqual(a, 1)", "self.assertTrue(a)", ("assertion_changed",)),
        ("expect(total).toBe(5);", "", ("assertion_deleted",)),
        ("it('refunds', () => {", "it.skip('refunds', () => {", ("test_deleted", "skip_added")),
        ("def test_x(self):", "@unittest.skip('flaky')\ndef test_x(self):", ("skip_added",)),
        ("x = 1", "x = 2", ()),
        ("assert a\nassert b", "assert b\nassert a", ()),  # reordered, nothing lost
    ],
)
def test_the_signs_of_an_edit(before: str, after: str, signs: tuple[str, ...]) -> None:
    assert tampering(before, after) == signs
