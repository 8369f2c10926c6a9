"""The time budget bounds time (Limits.max_seconds, polyloop.kernel.deadline): every model call
attempt and every action is given what is left of the budget plus the Loop's
``time_budget_grace_s``, no retry starts after the budget's end, the wrap-up call has a grace
of its own; A still decides the stop reason (``time_budget``). A call the cap stops is
recorded as a timeout of its kind is.

The calls here have timeouts of their own far beyond the budget (what the run waited for
before): each test would end only after that timeout, or for another reason, without the cap.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from polyloop import (
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    RetryPolicy,
    StopReason,
    ToolRegistry,
)
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import (
    ActionResult,
    ActionStatus,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelRequest,
    Record,
    ToolContext,
)
from tests.conftest import Crash, RecordingJournal, call, make_tools

OWN_TIMEOUT_S = 20.0  # what a call here waits for without the cap
GRACE_S = 0.25


class HangingModel:
    """A model whose calls never answer: each ends at its own request timeout, as an
    adapter's does (a retryable ``timeout``). Replies ``first`` before hanging, if given."""

    def __init__(self, *first: ModelReply) -> None:
        self.first = list(first)
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        if self.first:
            return self.first.pop(0)
        await asyncio.sleep(OWN_TIMEOUT_S)
        raise ModelCallError("request timed out", retryable=True, kind="timeout")


def records(journal: RecordingJournal) -> list[Record]:
    return [r for batch in journal.appends for r in batch]


def model_failures(journal: RecordingJournal) -> list[ModelFailure | ModelAttemptFailed]:
    return [r for r in records(journal) if isinstance(r, ModelFailure | ModelAttemptFailed)]


def loop_of(model: object, limits: Limits, journal: RecordingJournal, **kw: object) -> Loop:
    kw.setdefault("tools", make_tools())
    return Loop(model, limits=limits, journal=journal, time_budget_grace_s=GRACE_S, **kw)  # type: ignore[arg-type]


# --- model calls -----------------------------------------------------------------------------


async def test_a_model_call_that_hangs_is_cut_at_what_is_left_plus_the_grace() -> None:
    journal = RecordingJournal()
    model = HangingModel()
    loop = loop_of(model, Limits(max_seconds=0.5), journal, clock=FakeClock())
    r = await loop.run("go")
    assert r.stop_reason == StopReason.time_budget
    # One attempt, cut at 0.5 s left + 0.25 s grace, recorded as a request timeout is (a
    # retryable timeout); no retry started after the budget; the step is a model failure.
    [failure] = model_failures(journal)
    assert isinstance(failure, ModelFailure) and failure.attempt == 1
    assert failure.error.kind == "timeout" and failure.error.retryable is True
    assert failure.error.type == "ModelCallError"
    assert failure.error.message.startswith("no answer within 0.75 s"), failure.error
    assert model.calls == 1
    [step] = r.steps
    assert step.llm_call_id is None and step.action_status is None
    assert r.totals.active_s >= 0.5


async def test_no_retry_starts_after_the_budget_and_the_run_ends_time_budget() -> None:
    clock = FakeClock()
    started: list[float] = []

    def fail(request: ModelRequest) -> ModelReply:
        started.append(clock.now - FakeClock().now)
        clock.now += 1.0
        raise ModelCallError("overloaded", retryable=True, kind="server")

    journal = RecordingJournal()
    retry = RetryPolicy(max_attempts=10, initial_backoff_s=1.5, multiplier=1.0, jitter=0.0)
    loop = loop_of(FunctionModel(fail), Limits(max_seconds=4.5), journal, clock=clock, retry=retry)
    r = await loop.run("go")
    # Attempts at 0 and 2.5 s; the third would start at 5.0 s, after the budget's end: it is
    # not started, the run waits out the 1.0 s left and A ends it (not llm_error after ten).
    assert r.stop_reason == StopReason.time_budget, r.stop_detail
    assert started == [0.0, 2.5]
    assert clock.sleeps == [1.5, 1.0]
    assert r.totals.active_s == 4.5
    kinds = [type(f).__name__ for f in model_failures(journal)]
    assert kinds == ["ModelAttemptFailed", "ModelFailure"]
    intents = [x.attempt for x in records(journal) if isinstance(x, ModelIntent)]
    assert intents == [1, 2]


async def test_a_retry_after_beyond_the_budget_is_not_waited_for() -> None:
    clock = FakeClock()

    def limited(request: ModelRequest) -> ModelReply:
        raise ModelCallError("rate limited", retryable=True, retry_after=120.0, kind="rate_limit")

    journal = RecordingJournal()
    loop = loop_of(FunctionModel(limited), Limits(max_seconds=10), journal, clock=clock)
    r = await loop.run("go")
    assert r.stop_reason == StopReason.time_budget
    assert clock.sleeps == [10.0] and r.totals.active_s == 10.0  # the budget, not 120 s
    [failure] = model_failures(journal)
    assert isinstance(failure, ModelFailure) and failure.error.kind == "rate_limit"


async def test_the_wrap_up_call_has_a_grace_of_its_own() -> None:
    clock = FakeClock()
    noop = ModelReply(tool_calls=call("noop").tool_calls)

    class Late(HangingModel):
        async def complete(self, request: ModelRequest) -> ModelReply:
            if self.first:
                clock.now += 2.0  # the first step spends the 1 s budget and more
            return await super().complete(request)

    journal = RecordingJournal()
    loop = loop_of(Late(noop), Limits(max_seconds=1.0), journal, clock=clock, wrap_up=True)
    r = await loop.run("go")
    assert r.stop_reason == StopReason.time_budget
    assert r.steps[-1].wrap_up is True and r.final_answer is None
    assert r.stop_detail is not None
    assert r.stop_detail.startswith(
        "the wrap-up call failed: ModelCallError: no answer within 0.25 s"
    )
    assert [f.attempt for f in model_failures(journal)] == [1]  # not retried: budget spent


async def test_after_a_resume_the_cap_is_what_was_left_of_the_budget() -> None:
    clock = FakeClock()

    def step(request: ModelRequest) -> ModelReply:
        clock.now += 1.5
        return ModelReply(tool_calls=call("noop").tool_calls)

    limits = Limits(max_seconds=3.5)
    crashed = RecordingJournal(crash_at=5, crash_after=True)  # after two steps: 3.0 s active
    with pytest.raises(Crash):
        await loop_of(FunctionModel(step), limits, crashed, clock=clock).run("go", run_id="r")
    clock.now += 1000.0  # the time the run lay crashed does not count
    journal = RecordingJournal(crashed.inner)
    r = await loop_of(HangingModel(), limits, journal, clock=clock).resume("r")
    assert r.stop_reason == StopReason.time_budget
    [failure] = model_failures(journal)
    assert failure.error.message.startswith("no answer within 0.75 s"), failure.error  # 0.5 + 0.25
    assert len(r.steps) == 3


def test_the_grace_is_a_number_of_seconds_at_least_zero() -> None:
    from polyloop import ConfigError

    for bad in (-1.0, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ConfigError, match="time_budget_grace_s"):
            Loop(FunctionModel(lambda r: ModelReply("x")), time_budget_grace_s=bad)  # type: ignore[arg-type]
    Loop(FunctionModel(lambda r: ModelReply("x")), time_budget_grace_s=0)


# --- tool calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("own", [OWN_TIMEOUT_S, None])
async def test_a_tool_that_hangs_is_stopped_at_the_budget_as_at_its_own_timeout(
    own: float | None,
) -> None:
    tools = ToolRegistry()
    given: list[float | None] = []

    @tools.tool(timeout_s=own, replay="never")
    async def wait(ctx: ToolContext) -> str:
        """Wait for something that never comes."""
        given.append(ctx.timeout_s)
        await asyncio.sleep(3600)
        return "never"

    journal = RecordingJournal()
    model = HangingModel(ModelReply(tool_calls=call("wait").tool_calls))
    r = await loop_of(model, Limits(max_seconds=0.5), journal, tools=tools).run("go")
    assert r.stop_reason == StopReason.time_budget
    [seconds] = given
    assert seconds is not None and 0.5 < seconds <= 0.75  # 0.5 s left (less the model's turn)
    # Recorded as the tool's own timeout is: executed (it may have acted: never replayed),
    # TimeoutError, the timeout template with the seconds it was given.
    step = r.steps[0]
    assert step.action_status is ActionStatus.executed and r.actions_executed == 1
    [result] = [x for x in records(journal) if isinstance(x, ActionResult)]
    failure = result.outcome.failure
    assert failure is not None and failure.error_type == "TimeoutError"
    assert failure.message == f"timed out after {seconds:g} s"
    assert step.observation is not None
    assert step.observation.startswith(f"Error: 'wait' timed out after {seconds:g} s")
    assert len(r.steps) == 1  # A stopped the run at the next iteration


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("sleep") is None, reason="POSIX shell")
async def test_a_shell_command_that_hangs_is_killed_at_the_budget_as_at_its_timeout(
    tmp_path: Path,
) -> None:
    from polyloop.tools.builtin import CommandPolicy, workspace_tools

    policy = CommandPolicy(default="allow")
    tools = workspace_tools(tmp_path, shell_timeout_s=OWN_TIMEOUT_S, command_policy=policy)
    reply = ModelReply(tool_calls=call("shell", {"command": "echo started; sleep 600"}).tool_calls)
    journal = RecordingJournal()
    r = await loop_of(HangingModel(reply), Limits(max_seconds=0.5), journal, tools=tools).run("go")
    assert r.stop_reason == StopReason.time_budget
    step = r.steps[0]
    assert step.action_status is ActionStatus.executed
    # The shell's own timeout report, with its output so far, at the budget's seconds.
    assert step.observation is not None
    assert step.observation.startswith("started\n[timed out after 0.7"), step.observation
    assert "killed" in step.observation
