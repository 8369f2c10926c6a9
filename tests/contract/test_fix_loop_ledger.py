"""kernel.md §10, the failure ledger: known failures, rounds, net progress, spreading, and the
edits of test files — journaled, and rebuilt on resume."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from polyloop import (
    ActionStatus,
    ConfigError,
    Failure,
    FileEdit,
    Limits,
    Loop,
    ModelReply,
    Outcome,
    StopReason,
    ToolContext,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel
from polyloop.types import FailureKnown, FailureSeen, ModelRequest, TestEdit
from tests.conftest import Crash, RecordingJournal, call

UNRELATED = Failure("tests/t.py::test_unrelated", "KeyError", "legacy.py:3", "'x'")
A = Failure("tests/t.py::test_paid", "AssertionError", "orders.py:24", "status is PAID")
A2 = Failure("tests/t.py::test_paid", "AssertionError", "orders.py:25", "status is NEW")
B = Failure("tests/t.py::test_cancelled", "AssertionError", "orders.py:26", "CANCELLED")
C = Failure("tests/t.py::test_ship", "KeyError", "orders.py:40", "'ship'")


class Suite:
    """``edit_file(path)`` reports an edit of ``path``; ``run_tests`` reports the next set of
    failures of ``rounds`` (an empty set passes and completes the run)."""

    def __init__(self, rounds: Sequence[Sequence[Failure]]) -> None:
        self.rounds = list(rounds)
        self.tests_run = 0
        self.tools = ToolRegistry()

        @self.tools.tool(replay="idempotent")
        def edit_file(path: str) -> Outcome:
            """Edit a file."""
            test = path.startswith("tests/")
            signs = ("assertion_deleted",) if test else ()
            return Outcome(
                ActionStatus.executed, f"edited {path}", edits=(FileEdit(path, test, signs),)
            )

        @self.tools.tool(replay="idempotent")
        def run_tests() -> Outcome:
            """Run the tests."""
            failing = tuple(self.rounds[min(self.tests_run, len(self.rounds) - 1)])
            self.tests_run += 1
            if not failing:
                return Outcome(ActionStatus.executed, "all passed", completed=True)
            return Outcome(ActionStatus.executed, f"{len(failing)} failed", failures=failing)


def rounds_of(paths: Sequence[str], *, test_first: bool) -> FunctionModel:
    """Edit ``paths[i]`` and run the tests, round after round; ``test_first``: run the tests
    before the first edit."""

    def reply(request: ModelRequest) -> ModelReply:
        i = request.step_idx
        if i % 2 == (0 if test_first else 1):
            return call("run_tests")
        return call("edit_file", {"path": paths[(i // 2) % len(paths)]})

    return FunctionModel(reply)


def run_then_edit(paths: Sequence[str]) -> FunctionModel:
    return rounds_of(paths, test_first=True)


def edit_then_run(paths: Sequence[str]) -> FunctionModel:
    return rounds_of(paths, test_first=False)


async def test_a_known_failure_never_counts_and_the_report_lists_it_apart() -> None:
    # The unrelated failure is reported first in every round; the real one changes.
    suite = Suite([[UNRELATED, A], [UNRELATED, B], [UNRELATED, C], [UNRELATED, A]])
    limits = Limits(max_steps=20, same_failure_limit=2, known_failures=(UNRELATED.check or "",))
    r = await Loop(edit_then_run(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 8
    report = r.report
    assert report is not None
    assert [e.fingerprint for e in report.fingerprints] == [
        A.fingerprint(),
        B.fingerprint(),
        C.fingerprint(),
    ]
    assert [(k.name, k.source, k.failure, k.step) for k in report.known] == [
        (UNRELATED.check, "given", UNRELATED, 1)
    ]
    assert "Known failures" in report.to_markdown()


async def test_without_it_the_unrelated_failure_trips_the_guard_on_the_second_round() -> None:
    suite = Suite([[UNRELATED, A], [UNRELATED, B]])
    limits = Limits(max_steps=20, same_failure_limit=2)
    r = await Loop(edit_then_run(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 4
    assert r.report is not None and r.report.fingerprints[0].failure == UNRELATED


async def test_a_known_failure_may_be_named_by_its_fingerprint() -> None:
    suite = Suite([[UNRELATED], [UNRELATED], [UNRELATED], []])
    limits = Limits(max_steps=20, same_failure_limit=2, known_failures=(UNRELATED.fingerprint(),))
    r = await Loop(edit_then_run(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.task_completed


async def test_the_baseline_makes_the_first_test_runs_failures_known() -> None:
    journal = RecordingJournal()
    # the unrelated failure is there from the start and stays as it was: it never counts
    suite = Suite([[UNRELATED, A], [UNRELATED, A2], [UNRELATED, B], [UNRELATED, A2], []])
    limits = Limits(max_steps=30, same_failure_limit=2, baseline=True)
    r = await Loop(
        run_then_edit(["orders.py"]), tools=suite.tools, limits=limits, journal=journal
    ).run("fix", run_id="b")
    assert r.stop_reason == StopReason.repeated_failure
    report = r.report
    assert report is not None and report.fingerprints[0].failure == A2
    known = {k.name: k for k in report.known}
    assert known[UNRELATED.check or ""].released_at is None  # still known
    assert known[A.check or ""].released_at == 2  # the first edit changed it: the fix's now
    records = journal.inner.records("b")
    assert [x.failure for x in records if isinstance(x, FailureKnown)] == [UNRELATED, A]
    seen = [x for x in records if isinstance(x, FailureSeen)]
    assert [(x.round, x.known) for x in seen] == [(1, True), (2, False), (3, False), (4, False)]
    assert seen[1].failing == (UNRELATED.check, A.check) and seen[1].changed == ("orders.py",)


async def test_two_failures_both_there_before_the_first_edit_still_alternate_to_a_stop() -> None:
    """Fixing A breaks B and back: each leaves the report once, so neither stays known."""
    suite = Suite([[A, B], [A], [B], [A], [B]])
    limits = Limits(max_steps=30, same_failure_limit=2, baseline=True)
    r = await Loop(run_then_edit(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.repeated_failure
    assert r.report is not None and r.report.pattern == "alternating"
    assert r.steps_used == 9  # rounds 1 (the baseline) to 5


async def test_no_progress_rounds_stops_a_loop_whose_failing_set_does_not_shrink() -> None:
    # the failures change every round, so no fingerprint repeats; the set never gets smaller
    suite = Suite([[A, B], [A2, C], [B, C], [A, C], [A2, B]])
    limits = Limits(max_steps=30, same_failure_limit=3, no_progress_rounds=3)
    r = await Loop(edit_then_run(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 8  # 4 rounds
    report = r.report
    assert report is not None and report.signals == ("no_progress",)
    assert "no fewer failing checks for 3 rounds" in report.why
    assert [len(x.failing) for x in report.rounds] == [2, 2, 2, 2]


async def test_a_shrinking_failing_set_is_progress() -> None:
    suite = Suite([[A, B, C], [A2, B], [B, C], [C], [A], []])
    limits = Limits(max_steps=30, no_progress_rounds=2)
    r = await Loop(edit_then_run(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.task_completed


async def test_spreading_stops_when_each_round_changes_a_new_file() -> None:
    suite = Suite([[A], [B], [C], [A2], [B]])
    files = ["orders.py", "stock.py", "auth.py", "fixtures.py", "enum.py"]
    limits = Limits(max_steps=30, spreading_rounds=3)
    r = await Loop(edit_then_run(files), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 6
    report = r.report
    assert report is not None and report.signals == ("spreading",)
    assert report.files_touched == ("orders.py", "stock.py", "auth.py")
    assert [x.changed for x in report.rounds] == [("orders.py",), ("stock.py",), ("auth.py",)]


async def test_rounds_that_change_the_same_file_do_not_spread() -> None:
    suite = Suite([[A], [B], [C], [A2], []])
    limits = Limits(max_steps=30, spreading_rounds=2)
    r = await Loop(edit_then_run(["orders.py"]), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.task_completed


async def test_test_edits_are_journaled_and_named_in_the_result_also_without_the_guard() -> None:
    journal = RecordingJournal()
    suite = Suite([[A], []])
    r = await Loop(edit_then_run(["tests/test_orders.py"]), tools=suite.tools, journal=journal).run(
        "fix", run_id="t"
    )
    assert r.stop_reason == StopReason.task_completed
    assert r.test_edits == (
        TestEdit(0, "tests/test_orders.py", ("assertion_deleted",)),
        TestEdit(2, "tests/test_orders.py", ("assertion_deleted",)),
    )
    # Written with its step (and the next step's model intent).
    assert ["action_result", "test_edit", "step", "model_intent"] in journal.kinds()
    rebuilt = await Loop(edit_then_run([]), tools=suite.tools, journal=journal.inner).resume("t")
    assert rebuilt.test_edits == r.test_edits


async def test_the_report_lists_the_rounds_and_the_test_edits() -> None:
    suite = Suite([[A], [B], [A]])
    limits = Limits(max_steps=30, same_failure_limit=2)
    loop = Loop(edit_then_run(["orders.py", "tests/t.py"]), tools=suite.tools, limits=limits)
    r = await loop.run("fix")
    report = r.report
    assert report is not None
    assert [(x.round, x.first_step, x.step, x.changed) for x in report.rounds] == [
        (1, 0, 1, ("orders.py",)),
        (2, 2, 3, ("tests/t.py",)),
        (3, 4, 5, ("orders.py",)),
    ]
    assert report.test_edits == (TestEdit(2, "tests/t.py", ("assertion_deleted",)),)
    md = report.to_markdown()
    assert "**Rounds**" in md and "`tests/t.py` at step 2: assertion_deleted" in md


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_resume_after_a_crash_at_any_write_rebuilds_the_ledger(after: bool) -> None:
    rounds = [[UNRELATED, A], [UNRELATED, A2], [UNRELATED, B], [UNRELATED, A2]]
    limits = Limits(max_steps=30, same_failure_limit=2, no_progress_rounds=5, baseline=True)
    paths = ["orders.py", "tests/t.py"]
    ref_journal = RecordingJournal()
    ref = await Loop(run_then_edit(paths), tools=Suite(rounds).tools, limits=limits,
                     journal=ref_journal).run("fix", run_id="r")  # fmt: skip
    assert ref.stop_reason == StopReason.repeated_failure
    for n in range(1, ref_journal.count + 1):
        inner = MemoryJournal()
        suite = Suite(rounds)
        with pytest.raises(Crash):
            await Loop(run_then_edit(paths), tools=suite.tools, limits=limits,
                       journal=RecordingJournal(inner, crash_at=n, crash_after=after)
                       ).run("fix", run_id="r")  # fmt: skip
        suite.tests_run = sum(1 for x in inner.records("r") if isinstance(x, FailureSeen))
        r = await Loop(
            run_then_edit(paths), tools=suite.tools, limits=limits, journal=inner
        ).resume("r")
        assert (r.stop_reason, r.report, r.test_edits) == (
            ref.stop_reason,
            ref.report,
            ref.test_edits,
        ), n
        kinds = [x.kind for x in inner.records("r")]
        for kind in ("failure_seen", "failure_known", "test_edit"):
            assert kinds.count(kind) == [x.kind for x in ref_journal.inner.records("r")].count(
                kind
            ), (n, kind)


def test_the_new_limits_are_checked_and_stored_only_when_set() -> None:
    assert "known_failures" not in Limits().to_dict() and "baseline" not in Limits().to_dict()
    limits = Limits(no_progress_rounds=2, known_failures=["t::a"], baseline=True)  # type: ignore[arg-type]
    assert limits.known_failures == ("t::a",)
    assert Limits.from_dict(limits.to_dict()) == limits
    assert limits.failure_guard and not Limits(known_failures=("t::a",)).failure_guard
    with pytest.raises(ConfigError, match="known_failures must be a list"):
        Limits(known_failures="t::a")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="each must be a non-empty str"):
        Limits(known_failures=("",))
    with pytest.raises(ConfigError, match="no_progress_rounds must be > 0"):
        Limits(no_progress_rounds=0)
    with pytest.raises(ConfigError, match="baseline must be a bool"):
        Limits(baseline=1)  # type: ignore[arg-type]


async def test_with_the_budget_hint_the_model_sees_how_often_the_failure_was_seen() -> None:
    from polyloop.context import ChatContextBuilder

    journal = MemoryJournal()
    suite = Suite([[A], [A], [B]])
    loop = Loop(
        edit_then_run(["orders.py"]),
        tools=suite.tools,
        context=ChatContextBuilder(budget_hint=True),
        limits=Limits(max_steps=6, same_failure_limit=3),
        journal=journal,
    )
    r = await loop.run("fix", run_id="h")
    tool_texts = [m["content"] for m in r.messages if m["role"] == "tool"]
    assert tool_texts[0].endswith("[step 1 of 6]")  # an edit: nothing counted
    assert tool_texts[1].endswith("[step 2 of 6 · this failure seen 1 of 3 times]")
    assert tool_texts[3].endswith("[step 4 of 6 · this failure seen 2 of 3 times]")
    assert tool_texts[5].endswith("[step 6 of 6 · this failure seen 1 of 3 times]")  # B
    rebuilt = await Loop(edit_then_run([]), context=ChatContextBuilder(budget_hint=True),
                         journal=journal).resume("h")  # fmt: skip
    assert rebuilt.messages == r.messages


# --- the crash-injection scenario (tests/durability/test_crash_injection.py) -------------------

# What each test run reports, by its step: keyed by step, so a test run done again on resume
# reports the same.
CRASH_ROUNDS = {0: (UNRELATED, A), 2: (UNRELATED, A2), 4: (UNRELATED, B), 6: (UNRELATED, A2)}
CRASH_LIMITS = Limits(max_steps=30, same_failure_limit=2, no_progress_rounds=5, baseline=True)


def fix_loop(journal: object) -> Loop:
    """A fix loop that writes every ledger record: the baseline's failure_known records (step
    0), a test_edit (step 3), a failure_seen per round, and a repeated_failure end with its
    report (step 6). Both tools are idempotent: a crash never leaves it unsure."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def edit_file(path: str) -> Outcome:
        """Edit a file."""
        signs = ("assertion_changed",) if path.startswith("tests/") else ()
        edit = FileEdit(path, path.startswith("tests/"), signs)
        return Outcome(ActionStatus.executed, f"edited {path}", edits=(edit,))

    @tools.tool(replay="idempotent")
    def run_tests(ctx: ToolContext) -> Outcome:
        """Run the tests."""
        failing = CRASH_ROUNDS[ctx.step_idx]
        return Outcome(ActionStatus.executed, f"{len(failing)} failed", failures=failing)

    model = run_then_edit(["orders.py", "tests/t.py"])
    return Loop(model, tools=tools, journal=journal, limits=CRASH_LIMITS)  # type: ignore[arg-type]


async def test_the_crash_scenario_writes_every_ledger_record() -> None:
    journal = RecordingJournal()
    r = await fix_loop(journal).run("fix", run_id="f")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 7
    kinds = [k for batch in journal.kinds() for k in batch]
    assert (kinds.count("failure_known"), kinds.count("failure_seen")) == (2, 4)
    assert kinds.count("test_edit") == 1 and journal.count == 15
