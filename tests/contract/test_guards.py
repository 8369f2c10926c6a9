"""kernel.md §10: run-end guards (E) and the failure guard (G), journaled for resume."""

from __future__ import annotations

from typing import Any

import pytest

from polyloop import (
    ActionStatus,
    Complete,
    Failure,
    GuardContext,
    Limits,
    Loop,
    ModelReply,
    Outcome,
    RunEndGuard,
    Steer,
    StopReason,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel, ScriptedModel
from polyloop.types import FailureSeen, GuardVerdict, ModelRequest, RunEnd
from tests.conftest import Crash, RecordingJournal, call, make_tools

# --- run-end guards ---------------------------------------------------------------------------


def steer_times(n: int, seen: list[GuardContext] | None = None) -> RunEndGuard:
    def cites_a_source(ctx: GuardContext) -> Steer | Complete:
        if seen is not None:
            seen.append(ctx)
        return Steer(f"cite a source ({ctx.steers + 1})") if ctx.steers < n else Complete()

    return RunEndGuard(cites_a_source, max_steers=5)


async def test_a_guard_that_steers_twice_then_completes_finishes_after_two_extra_steps() -> None:
    seen: list[GuardContext] = []
    model = ScriptedModel(["answer 1", "answer 2", "answer 3"])
    r = await Loop(model, guards=[steer_times(2, seen)]).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert r.final_answer == "answer 3" and r.steps_used == 3
    assert [c.steers for c in seen] == [0, 1, 2]
    assert [len(c.steps) for c in seen] == [0, 1, 2]  # the history before each answer


async def test_a_steered_final_answer_resets_the_consecutive_invalid_count() -> None:
    """§6: any valid decision (E or F) resets the count; a steered answer is one (E)."""
    model = ScriptedModel(["", "answer 1", "", "answer 2"])
    loop = Loop(model, guards=[steer_times(1)], limits=Limits(max_consecutive_invalid=2))
    r = await loop.run("g")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "answer 2"
    assert [s.parse_ok for s in r.steps] == [False, True, False, True]


async def test_a_steered_step_holds_the_feedback_as_its_synthetic_observation() -> None:
    model = ScriptedModel(["first try", "better"])
    r = await Loop(model, guards=[steer_times(1)]).run("g")
    step = r.steps[0]
    assert (step.parse_ok, step.parse_error, step.action, step.tool_name) == (
        True,
        None,
        None,
        None,
    )
    assert step.observation == "cite a source (1)" and step.observation_synthetic is True
    assert step.action_status is None and step.llm_call_id is not None
    # The model saw the feedback as the next user message.
    assert model.requests[1].messages[-1] == {"role": "user", "content": "cite a source (1)"}


async def test_an_always_steering_guard_is_skipped_after_its_own_limit() -> None:
    def never_happy(ctx: GuardContext) -> Steer:
        return Steer("no")

    model = ScriptedModel(["a", "b", "c", "d"])
    r = await Loop(model, guards=[RunEndGuard(never_happy, max_steers=2)]).run("g")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "c"
    assert r.steps_used == 3


async def test_with_a_tighter_step_budget_a_steer_ends_step_budget_without_an_answer() -> None:
    def never_happy(ctx: GuardContext) -> Steer:
        return Steer("no")

    r = await Loop(
        ScriptedModel(["a", "b", "c"]),
        guards=[RunEndGuard(never_happy, 5)],
        limits=Limits(max_steps=2),
    ).run("g")
    assert r.stop_reason == StopReason.step_budget and r.final_answer is None
    assert r.steps_used == 2


async def test_guards_run_in_order_and_the_first_steer_wins() -> None:
    calls: list[str] = []

    def first(ctx: GuardContext) -> Complete:
        calls.append("first")
        return Complete()

    def second(ctx: GuardContext) -> Steer | Complete:
        calls.append("second")
        return Steer("again") if ctx.steers == 0 else Complete()

    def third(ctx: GuardContext) -> Complete:
        calls.append("third")
        return Complete()

    journal = RecordingJournal()
    await Loop(ScriptedModel(["x", "y"]), guards=[first, second, third], journal=journal).run(
        "g", run_id="o"
    )
    assert calls == ["first", "second", "first", "second", "third"]
    batches = journal.kinds()
    # Written with the step (and the next step's model intent).
    assert ["guard_verdict", "guard_verdict", "step", "model_intent"] in batches
    assert batches[-1] == ["guard_verdict"] * 3 + ["step", "end"]


async def test_async_guards_are_awaited() -> None:
    async def later(ctx: GuardContext) -> Steer | Complete:
        return Steer("once more") if ctx.steers == 0 else Complete()

    r = await Loop(ScriptedModel(["a", "b"]), guards=[later]).run("g")
    assert r.steps_used == 2 and r.stop_reason == StopReason.agent_finished


async def test_a_guard_that_raises_propagates_and_the_run_stays_resumable() -> None:
    def buggy(ctx: GuardContext) -> Complete:
        raise ZeroDivisionError("guard bug")

    journal = MemoryJournal()
    with pytest.raises(ZeroDivisionError):
        await Loop(ScriptedModel(["a"]), guards=[buggy], journal=journal).run("g", run_id="b")
    assert not any(isinstance(x, RunEnd) for x in journal.records("b"))


async def test_guards_do_not_run_on_a_marker_tool_completion() -> None:
    called: list[int] = []

    def guard(ctx: GuardContext) -> Steer:
        called.append(1)
        return Steer("no")

    r = await Loop(
        ScriptedModel([call("done", {"answer": "x"})]), tools=make_tools(), guards=[guard]
    ).run("g")
    assert r.stop_reason == StopReason.task_completed and called == []


async def test_steer_counts_survive_a_crash_and_resume() -> None:
    def never_happy(ctx: GuardContext) -> Steer:
        return Steer("no")

    guard = RunEndGuard(never_happy, name="strict", max_steers=2)
    journal = MemoryJournal()
    # Writes per steered step: intent, result, verdict+step. Crash after the 2nd steered step.
    with pytest.raises(Crash):
        await Loop(
            ScriptedModel(["a", "b", "c"]),
            guards=[guard],
            journal=RecordingJournal(journal, crash_at=6, crash_after=True),
        ).run("g", run_id="s")
    verdicts = [x for x in journal.records("s") if isinstance(x, GuardVerdict)]
    assert [v.steer for v in verdicts] == [True, True]
    r = await Loop(ScriptedModel(["c"]), guards=[guard], journal=journal).resume("s")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "c"
    assert r.steps_used == 3  # the guard, at its limit after resume, was skipped


def test_guard_names_must_be_distinct_and_limits_positive() -> None:
    from polyloop import ConfigError

    def g(ctx: GuardContext) -> Complete:
        return Complete()

    with pytest.raises(ConfigError, match="distinct"):
        Loop(ScriptedModel([]), guards=[g, g])
    with pytest.raises(ConfigError, match="max_steers"):
        RunEndGuard(g, max_steers=0)


# --- the failure guard -------------------------------------------------------------------------


def test_identical_failures_with_different_timings_addresses_and_temp_paths_match() -> None:
    a = Failure(
        "tests/test_orders.py::test_cancel",
        "AssertionError",
        "shop/orders.py:51",
        "5 != 3 after 0.013s; <Order at 0x7f3a2b1c> in /tmp/pytest-of-root/pytest-7/t0",
    )
    b = Failure(
        "tests/test_orders.py::test_cancel",
        "AssertionError",
        "shop/orders.py:51",
        "5 != 3 after 2.5 s; <Order at 0x55d1e0> in /tmp/tmpab12cd/t0",
    )
    assert a.fingerprint() == b.fingerprint() and len(a.fingerprint()) == 12


@pytest.mark.parametrize(
    "other",
    [
        Failure("tests/test_orders.py::test_ship", "AssertionError", "shop/orders.py:51", "x"),
        Failure("tests/test_orders.py::test_cancel", "KeyError", "shop/orders.py:51", "x"),
        Failure("tests/test_orders.py::test_cancel", "AssertionError", "shop/orders.py:60", "x"),
        Failure("tests/test_orders.py::test_cancel", "AssertionError", "shop/orders.py:51", "y"),
    ],
)
def test_a_different_check_type_frame_or_message_gives_another_fingerprint(
    other: Failure,
) -> None:
    base = Failure("tests/test_orders.py::test_cancel", "AssertionError", "shop/orders.py:51", "x")
    assert base.fingerprint() != other.fingerprint()


FAIL_A = Failure("tests/t.py::test_paid", "AssertionError", "orders.py:24", "status is PAID")
FAIL_B = Failure("tests/t.py::test_cancelled", "AssertionError", "orders.py:26", "CANCELLED")


def fix_loop(order: list[str], *, complete_at: int | None = None) -> ToolRegistry:
    """run_tests reports failure A or B in the given order; edit_file touches a file."""
    tools = ToolRegistry()
    rounds = iter(order)

    @tools.tool
    def edit_file(path: str) -> str:
        """Edit a file."""
        return f"edited {path}"

    @tools.tool
    def run_tests() -> Outcome:
        """Run the tests."""
        which = next(rounds)
        if which == "ok":
            return Outcome(ActionStatus.executed, "all passed", completed=True)
        failure = FAIL_A if which == "A" else FAIL_B
        return Outcome(ActionStatus.executed, f"FAILED {failure.check}", failure=failure)

    return tools


def edit_then_test(request: ModelRequest) -> ModelReply:
    if request.step_idx % 2 == 0:
        return call("edit_file", {"path": f"orders.py#{request.step_idx // 2 % 2}"})
    return call("run_tests")


async def test_failures_a_b_a_stop_at_the_third_round_with_a_limit_of_two() -> None:
    journal = RecordingJournal()
    r = await Loop(
        FunctionModel(edit_then_test),
        tools=fix_loop(["A", "B", "A", "B"]),
        journal=journal,
        limits=Limits(max_steps=20, same_failure_limit=2),
    ).run("fix", run_id="f")
    assert r.stop_reason == StopReason.repeated_failure
    assert r.steps_used == 6  # three rounds of edit + test
    report = r.report
    assert report is not None and report.pattern == "alternating"
    assert [(e.fingerprint, e.count, e.steps) for e in report.fingerprints] == [
        (FAIL_A.fingerprint(), 2, (1, 5)),
        (FAIL_B.fingerprint(), 1, (3,)),
    ]
    assert report.stopped_at_step == 5 and report.limit == 2
    assert report.attempts[0].startswith("run_tests") and len(report.attempts) == 5
    md = report.to_markdown()
    assert "alternating" in md and FAIL_A.fingerprint() in md and "decide" in md
    assert '"pattern":"alternating"' in report.to_json()
    # The ledger is in the journal, each entry written with its step.
    assert ["action_result", "failure_seen", "step", "model_intent"] in journal.kinds()
    end = journal.end("f")
    assert end is not None and end.report == report


async def test_the_same_failure_unchanged_is_reported_as_unchanged() -> None:
    r = await Loop(
        FunctionModel(edit_then_test),
        tools=fix_loop(["A", "A"]),
        limits=Limits(same_failure_limit=2),
    ).run("fix")
    assert r.stop_reason == StopReason.repeated_failure
    assert r.report is not None and r.report.pattern == "unchanged"


async def test_completion_on_a_round_that_would_trip_the_guard_is_task_completed() -> None:
    tools = fix_loop(["A"])

    @tools.tool
    def finish() -> Outcome:
        """Passes, but reports the old failure too."""
        return Outcome(ActionStatus.executed, "done", completed=True, failure=FAIL_A)

    script = [call("run_tests"), call("finish")]
    r = await Loop(ScriptedModel(script), tools=tools, limits=Limits(same_failure_limit=2)).run(
        "fix"
    )
    assert r.stop_reason == StopReason.task_completed and r.report is None


async def test_the_failure_guard_is_off_by_default_and_writes_no_ledger() -> None:
    journal = RecordingJournal()
    r = await Loop(
        FunctionModel(edit_then_test),
        tools=fix_loop(["A"] * 5),
        journal=journal,
        limits=Limits(max_steps=8),
    ).run("fix", run_id="n")
    assert r.stop_reason == StopReason.step_budget
    assert not any(isinstance(x, FailureSeen) for x in journal.inner.records("n"))


async def test_resume_continues_the_ledger_and_a_new_run_starts_clean() -> None:
    journal = MemoryJournal()
    limits = Limits(max_steps=20, same_failure_limit=2)
    # Crash after round 2's test step (the first model intent, then two writes per action
    # step: step 3 ends at write 9).
    with pytest.raises(Crash):
        await Loop(
            FunctionModel(edit_then_test),
            tools=fix_loop(["A", "B"]),
            limits=limits,
            journal=RecordingJournal(journal, crash_at=9, crash_after=True),
        ).run("fix", run_id="c")
    assert sum(isinstance(x, FailureSeen) for x in journal.records("c")) == 2
    r = await Loop(
        FunctionModel(edit_then_test), tools=fix_loop(["A"]), journal=journal, limits=limits
    ).resume("c")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 6
    fresh = await Loop(
        FunctionModel(edit_then_test), tools=fix_loop(["A", "ok"]), journal=journal, limits=limits
    ).run("fix again")
    assert fresh.stop_reason == StopReason.task_completed  # the old ledger does not count


async def test_a_tool_exception_feeds_the_failure_guard() -> None:
    tools = ToolRegistry()

    @tools.tool
    def flaky(n: int) -> str:
        """Always fails the same way."""
        raise ValueError(f"bad value at 0x{id(tools) + n:x}")

    script: list[Any] = [call("flaky", {"n": 1}), call("flaky", {"n": 2}), "unused"]
    r = await Loop(ScriptedModel(script), tools=tools, limits=Limits(same_failure_limit=2)).run("g")
    assert r.stop_reason == StopReason.repeated_failure


@pytest.mark.parametrize(
    ("fingerprints", "files", "pattern"),
    [
        (["A", "A"], [1, 1], "unchanged"),
        (["A", "B", "A"], [1, 1, 1], "alternating"),
        (["A", "B", "A", "B"], [1, 2, 2, 2], "alternating"),
        (["A", "B", "C", "A"], [1, 2, 3, 4], "spreading"),
        (["A", "B", "C", "A"], [1, 1, 1, 1], "recurring"),
        (["B", "A", "A"], [1, 1, 1], "unchanged"),
    ],
)
def test_the_report_names_the_pattern(
    fingerprints: list[str], files: list[int], pattern: str
) -> None:
    from polyloop.types import detect_pattern

    assert detect_pattern(fingerprints, files) == pattern


async def test_failures_that_change_while_the_edits_spread_are_reported_as_spreading() -> None:
    tools = ToolRegistry()
    order = iter(["A", "B", "C", "A"])
    fails = {
        "A": FAIL_A,
        "B": FAIL_B,
        "C": Failure("tests/t.py::test_ship", "KeyError", "orders.py:40", "'x'"),
    }

    @tools.tool
    def edit_file(path: str) -> str:
        """Edit a file."""
        return f"edited {path}"

    @tools.tool
    def run_tests() -> Outcome:
        """Run the tests."""
        f = fails[next(order)]
        return Outcome(ActionStatus.executed, f"FAILED {f.check}", failure=f)

    def spread(request: ModelRequest) -> ModelReply:
        if request.step_idx % 2 == 0:
            return call("edit_file", {"path": f"module_{request.step_idx // 2}.py"})
        return call("run_tests")

    r = await Loop(
        FunctionModel(spread), tools=tools, limits=Limits(max_steps=20, same_failure_limit=2)
    ).run("fix")
    assert r.stop_reason == StopReason.repeated_failure and r.report is not None
    assert r.report.pattern == "spreading"
    assert r.report.files_touched == ("module_0.py", "module_1.py", "module_2.py", "module_3.py")
