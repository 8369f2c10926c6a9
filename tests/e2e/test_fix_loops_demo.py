"""Scripted fix loops on the demo workspace, through the real workspace tools and real test runs:
known failures, test tampering, the decision an alternating loop leaves, no net progress."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from polyloop import Limits, Loop, ModelReply, RunResult, StopReason, ToolCall
from polyloop.cli.demo import _FIX_A, _FIX_B, _FIXED, DEMO_WORKSPACE, OSCILLATING, demo_tools
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest, TestEdit

_BUGGY = """        order = self.orders[order_id]
        order.status = "cancelled"
        return order"""
LEGACY = """import unittest


class LegacyTest(unittest.TestCase):
    def test_the_old_report_format(self) -> None:
        self.assertEqual("v1", "v2")
"""
SHIPPED = "tests.test_orders.CancelOrderTest.test_a_shipped_order_cannot_be_cancelled"
RESTOCK = "tests.test_orders.CancelOrderTest.test_cancel_returns_the_items_to_stock"
LEGACY_CHECK = "tests.test_a_legacy.LegacyTest.test_the_old_report_format"


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    target = tmp_path / "shop"
    shutil.copytree(DEMO_WORKSPACE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def call(name: str, **arguments: object) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall(name, dict(arguments)),))


def edit(old: str, new: str, path: str = "shop/orders.py") -> ModelReply:
    return call("edit_file", path=path, old=old, new=new)


TESTS = call("run_tests")


async def run(
    shop: Path, script: Sequence[ModelReply], limits: Limits, writable: Sequence[str] = ("shop",)
) -> RunResult:
    def reply(request: ModelRequest) -> ModelReply:
        return script[min(request.step_idx, len(script) - 1)]

    loop = Loop(FunctionModel(reply), tools=demo_tools(shop, writable), journal=MemoryJournal())
    return await loop.run("fix cancel_order", limits=limits)


# Test first, a wrong fix twice (the failure changes), then the right one, then submit.
FIXING = [
    TESTS,
    edit(_BUGGY, _FIX_A),
    TESTS,
    edit(_FIX_A, _FIX_B),
    TESTS,
    edit(_FIX_B, _FIXED),
    TESTS,
    call("submit", summary="fixed"),
]


async def test_a_failure_there_before_the_first_edit_and_unrelated_never_stops_the_run(
    shop: Path,
) -> None:
    (shop / "tests" / "test_a_legacy.py").write_text(LEGACY)  # reported first, every time
    polluted = await run(shop, FIXING, Limits(max_steps=20, same_failure_limit=2))
    assert polluted.stop_reason == StopReason.repeated_failure  # the legacy test, twice
    assert polluted.report is not None
    assert polluted.report.fingerprints[0].failure.check == LEGACY_CHECK

    # Known from the test run before the first edit, or named by the caller: never counted.
    for limits, script in (
        (Limits(max_steps=20, same_failure_limit=2, baseline=True), FIXING),
        (Limits(max_steps=20, same_failure_limit=2, known_failures=(LEGACY_CHECK,)), FIXING[1:]),
    ):
        shutil.rmtree(shop)
        shutil.copytree(DEMO_WORKSPACE, shop, ignore=shutil.ignore_patterns("__pycache__"))
        (shop / "tests" / "test_a_legacy.py").write_text(LEGACY)
        r = await run(shop, script, limits)
        assert r.stop_reason == StopReason.task_completed, limits


async def test_an_assertion_deleted_in_a_test_file_is_flagged_and_reported(shop: Path) -> None:
    loosen = edit(
        '        self.assertEqual(self.shop.stock["apple"], 5)\n', "", "tests/test_orders.py"
    )
    # Fix A breaks the shipped test; deleting the restock assertion changes nothing there.
    script = [edit(_BUGGY, _FIX_A), TESTS, loosen, TESTS]
    r = await run(shop, script, Limits(max_steps=20, same_failure_limit=2), ("shop", "tests"))
    assert r.stop_reason == StopReason.repeated_failure
    flagged = TestEdit(2, "tests/test_orders.py", ("assertion_deleted",))
    assert r.test_edits == (flagged,)
    assert r.report is not None and r.report.test_edits == (flagged,)
    assert "Test files were edited (`tests/test_orders.py`)" in r.report.directions[-1]
    assert "`tests/test_orders.py` at step 2: assertion_deleted" in r.report.to_markdown()


async def test_a_run_that_completes_after_tampering_says_so(shop: Path) -> None:
    drop = edit(
        "        with self.assertRaises(OrderError):\n"
        "            self.shop.cancel_order(order.order_id)",
        "        self.shop.cancel_order(order.order_id)",
        "tests/test_orders.py",
    )
    script = [edit(_BUGGY, _FIX_A), TESTS, drop, TESTS, call("submit", summary="green")]
    r = await run(shop, script, Limits(max_steps=20, same_failure_limit=2), ("shop", "tests"))
    assert r.stop_reason == StopReason.task_completed
    assert r.test_edits == (TestEdit(2, "tests/test_orders.py", ("assertion_deleted",)),)


async def test_writable_paths_can_forbid_the_tampering(shop: Path) -> None:
    loosen = edit('self.assertEqual(self.shop.stock["apple"], 5)', "pass", "tests/test_orders.py")
    r = await run(shop, [loosen, call("submit", summary="x")], Limits(), ("shop", "!tests/**"))
    assert r.steps[0].action_status == "not_executed" and r.test_edits == ()


async def test_an_alternating_loop_names_both_checks_both_messages_and_the_question(
    shop: Path,
) -> None:
    r = await run(shop, OSCILLATING, Limits(max_steps=12, same_failure_limit=2))
    assert r.stop_reason == StopReason.repeated_failure
    report = r.report
    assert report is not None and report.pattern == "alternating"
    assert report.question.startswith(
        f"`{SHIPPED}` and `{RESTOCK}` trade places: when `{SHIPPED}` passes, `{RESTOCK}` "
        f"fails with “3 != 5”; when `{RESTOCK}` passes, `{SHIPPED}` fails with “OrderError "
        "not raised”. Which behaviour is intended"
    )
    assert [(x.round, x.changed) for x in report.rounds] == [
        (1, ("shop/orders.py",)),
        (2, ("shop/orders.py",)),
        (3, ("shop/orders.py",)),
    ]
    assert report.directions[0].startswith(
        f"Keep what round 2 changed (`shop/orders.py`), with which `{SHIPPED}` passes"
    )


async def test_no_progress_rounds_stops_a_loop_whose_failing_set_does_not_shrink(
    shop: Path,
) -> None:
    # Each attempt restocks a wrong amount: the message changes, two tests keep failing.
    def restock(n: str) -> str:
        return _BUGGY.replace(
            "        return order", f"        self.stock[order.item] += {n}\n        return order"
        )

    script = [
        TESTS,
        edit(_BUGGY, restock("2 * order.quantity")),
        TESTS,
        edit(restock("2 * order.quantity"), restock("1")),
        TESTS,
        edit(restock("1"), _FIXED),
    ]
    r = await run(shop, script, Limits(max_steps=20, no_progress_rounds=2))
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 5
    report = r.report
    assert report is not None and report.signals == ("no_progress",)
    assert [len(x.failing) for x in report.rounds] == [2, 2, 2]
    assert {x.failing for x in report.rounds} == {(SHIPPED, RESTOCK)}
    assert "have not got fewer for 2 rounds (fewest 2, now 2" in report.question


async def test_escalate_from_a_tool_and_from_a_guard_ends_the_fix_loop_escalated(
    shop: Path,
) -> None:
    from polyloop import Escalate, GuardContext

    tools = demo_tools(shop)

    @tools.tool
    def ask_product_owner(question: str) -> str:
        """Ask the product owner a question about the requirements."""
        raise Escalate(question, evidence={"tests": [SHIPPED, RESTOCK]})

    script = [*OSCILLATING[:5], call("ask_product_owner", question="refuse or restock?")]
    limits = Limits(max_steps=20, same_failure_limit=3)
    loop = Loop(FunctionModel(lambda r: script[r.step_idx]), tools=tools, limits=limits)
    r = await loop.run("fix cancel_order")
    assert r.stop_reason == StopReason.escalated
    assert r.stop_detail == "tool ask_product_owner: refuse or restock?"
    report = r.report
    assert report is not None and report.escalation is not None
    assert report.escalation.evidence == {"tests": [SHIPPED, RESTOCK]}
    assert [x.failing for x in report.rounds] == [(SHIPPED,), (RESTOCK,)]  # the ledger so far

    def still_red(ctx: GuardContext) -> object:
        raise Escalate("the answer claims a fix, but the last test run failed")

    answer = [*OSCILLATING[:3], ModelReply("Fixed.")]
    fresh = shop.with_name("fresh")
    shutil.copytree(DEMO_WORKSPACE, fresh, ignore=shutil.ignore_patterns("__pycache__"))
    loop = Loop(
        FunctionModel(lambda r: answer[r.step_idx]),
        tools=demo_tools(fresh),
        limits=limits,
        guards=[still_red],
    )
    r = await loop.run("fix cancel_order")
    assert r.stop_reason == StopReason.escalated and r.final_answer is None
    assert r.stop_detail == "guard still_red: the answer claims a fix, but the last test run failed"
    assert r.report is not None and [x.failing for x in r.report.rounds] == [(SHIPPED,)]
    assert [s.action_status for s in r.steps[:3]] == ["executed"] * 3
