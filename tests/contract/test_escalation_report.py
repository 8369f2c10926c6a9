"""kernel.md §10, the escalation report names the decision: built from the ledger by fixed
rules for each pattern, with candidate directions, and the caller's own through report_hook."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from polyloop import EscalationReport, Limits, Loop, StopReason
from polyloop.journal import MemoryJournal
from polyloop.types import RunEnd
from tests.contract.test_fix_loop_ledger import (
    A2,
    UNRELATED,
    A,
    B,
    C,
    Suite,
    edit_then_run,
    run_then_edit,
)


async def stopped(
    rounds: Sequence[Sequence[object]], paths: Sequence[str], limits: Limits, **kw: object
) -> EscalationReport:
    suite = Suite(rounds)  # type: ignore[arg-type]
    r = await Loop(edit_then_run(paths), tools=suite.tools, limits=limits, **kw).run("fix")  # type: ignore[arg-type]
    assert r.stop_reason == StopReason.repeated_failure and r.report is not None
    return r.report


async def test_an_alternating_report_names_both_checks_both_messages_and_the_question() -> None:
    report = await stopped(
        [[A], [B], [A]], ["orders.py", "stock.py"], Limits(max_steps=20, same_failure_limit=2)
    )
    assert report.pattern == "alternating"
    assert report.question.startswith(
        "`tests/t.py::test_paid` and `tests/t.py::test_cancelled` trade places: "
        "when `tests/t.py::test_paid` passes, `tests/t.py::test_cancelled` fails with "
        "“CANCELLED”; when `tests/t.py::test_cancelled` passes, `tests/t.py::test_paid` fails "
        "with “status is PAID”. Which behaviour is intended where they conflict"
    )
    conflict = report.conflict
    assert conflict is not None
    assert (conflict.first, conflict.second) == (A, B)
    assert (conflict.first_passes, conflict.second_passes) == ((2,), (1, 3))
    # a direction per side, from the round whose change made that side pass, with its files
    assert report.directions[0] == (
        "Keep what round 2 changed (`stock.py`), with which `tests/t.py::test_paid` passes, "
        "and add what `tests/t.py::test_cancelled` needs: it fails with “CANCELLED”."
    )
    assert report.directions[1].startswith("Keep what round 3 changed (`orders.py`), with which ")
    assert "states the wrong requirement" in report.directions[2]
    md = report.to_markdown()
    assert "**Candidate directions**" in md and "A. Keep what round 2 changed" in md
    assert EscalationReport.from_dict(report.to_dict()) == report


async def test_an_unchanged_failure_points_at_where_it_is_raised() -> None:
    report = await stopped([[A], [A]], ["stock.py"], Limits(max_steps=20, same_failure_limit=2))
    assert report.pattern == "unchanged" and report.conflict is None
    assert report.question.startswith(
        "`tests/t.py::test_paid` keeps failing the same way (AssertionError at orders.py:24: "
        "“status is PAID”), seen 2 times: what is missing to fix it"
    )
    assert report.directions[0] == (
        "Look at `orders.py`: the failure is raised there, and no attempt changed it (they "
        "changed `stock.py`)."
    )
    again = await stopped([[A], [A]], ["orders.py"], Limits(max_steps=20, same_failure_limit=2))
    assert again.directions[0].startswith("The attempts changed `orders.py`, where the failure")


async def test_a_spreading_report_asks_which_files_the_task_may_change() -> None:
    files = ["orders.py", "stock.py", "auth.py"]
    report = await stopped([[A], [B], [C]], files, Limits(max_steps=20, spreading_rounds=3))
    assert report.question.startswith(
        "Each round changed more files (3 now: `orders.py`, `stock.py`, `auth.py`)"
    )
    assert report.directions[0] == (
        "Go back to what round 1 changed (`orders.py`) and fix `tests/t.py::test_paid` within "
        "those files."
    )


async def test_a_no_progress_report_names_the_checks_that_did_not_get_fewer() -> None:
    limits = Limits(max_steps=20, no_progress_rounds=2, baseline=True)
    rounds = [[UNRELATED, A], [UNRELATED, A2], [UNRELATED, B]]
    suite = Suite(rounds)
    r = await Loop(run_then_edit(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    report = r.report
    assert report is not None and report.signals == ("no_progress",)
    assert report.question.startswith(
        "The failing checks have not got fewer for 2 rounds (fewest 2, now 2: "
        "`tests/t.py::test_unrelated`, `tests/t.py::test_cancelled`)"
    )
    assert report.directions[0].startswith("Fix `tests/t.py::test_cancelled` alone first")
    # the failure there before the first edit, that no edit changed, is named as a lead
    assert report.directions[1].startswith(
        "`tests/t.py::test_unrelated` has failed since before the first edit"
    )


async def test_test_edits_add_a_direction() -> None:
    report = await stopped([[A], [A]], ["tests/t.py"], Limits(max_steps=20, same_failure_limit=2))
    assert report.directions[-1] == (
        "Test files were edited (`tests/t.py`): check that no test was weakened before "
        "trusting a run that passes."
    )


async def test_the_report_is_the_same_for_the_same_run() -> None:
    async def once() -> str:
        suite = Suite([[UNRELATED, A], [B], [A]])
        loop = Loop(
            edit_then_run(["orders.py", "tests/t.py"]),
            tools=suite.tools,
            limits=Limits(max_steps=20, same_failure_limit=2),
        )
        r = await loop.run("fix", run_id="same")
        assert r.report is not None
        return r.report.to_json()

    assert await once() == await once()


async def test_report_hook_adds_the_callers_directions_after_polyloops() -> None:
    seen: list[EscalationReport] = []

    def hook(report: EscalationReport) -> list[str]:
        seen.append(report)
        return [f"Ask the orders team about {report.conflict.first.check}."]  # type: ignore[union-attr]

    report = await stopped(
        [[A], [B], [A]], ["orders.py"], Limits(max_steps=20, same_failure_limit=2),
        report_hook=hook,
    )  # fmt: skip
    assert len(seen) == 1 and seen[0].directions == report.directions[:-1]
    assert report.directions[-1] == "Ask the orders team about tests/t.py::test_paid."


async def test_a_report_hook_that_fails_propagates_and_the_run_resumes_with_it_fixed() -> None:
    def broken(report: EscalationReport) -> list[str]:
        raise ZeroDivisionError("hook bug")

    journal = MemoryJournal()
    rounds = [[A], [B], [A]]
    limits = Limits(max_steps=20, same_failure_limit=2)
    suite = Suite(rounds)
    loop = Loop(
        edit_then_run(["orders.py"]), tools=suite.tools, limits=limits, journal=journal,
        report_hook=broken,
    )  # fmt: skip
    with pytest.raises(ZeroDivisionError):
        await loop.run("fix", run_id="h")
    assert not any(isinstance(x, RunEnd) for x in journal.records("h"))
    suite.tests_run = 2  # the third test run is done again on resume (it is idempotent)
    r = await Loop(
        edit_then_run(["orders.py"]), tools=suite.tools, journal=journal,
        report_hook=lambda report: ["Fixed hook."],
    ).resume("h")  # fmt: skip
    assert r.stop_reason == StopReason.repeated_failure
    assert r.report is not None and r.report.directions[-1] == "Fixed hook."


async def test_a_report_hook_must_return_strings() -> None:
    with pytest.raises(TypeError, match="report_hook must return a sequence of str"):
        await stopped(
            [[A], [A]], ["orders.py"], Limits(same_failure_limit=2),
            report_hook=lambda report: "one direction",
        )  # fmt: skip
    with pytest.raises(TypeError, match="report_hook must be callable"):
        Loop(edit_then_run(["x"]), report_hook="no")  # type: ignore[arg-type]
