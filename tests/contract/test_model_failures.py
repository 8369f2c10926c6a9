"""``Limits.max_consecutive_model_failures`` (seed awaken-run-termination: the retry policy
bounds the attempts of one step; this bounds the failed steps in a row). Default 1: the first
step whose model call failed after its retries ends the run ``llm_error`` (kernel.md §6 C)."""

from __future__ import annotations

from typing import Any

import pytest

from polyloop import ConfigError, Limits, Loop, ModelCallError, ModelReply, StopReason
from polyloop.journal import MemoryJournal
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import Message, ModelRequest, StepRecord
from tests.conftest import Crash, RecordingJournal, call, make_tools


class Flaky:
    """A model whose ``failing`` attempts fail (non-retryable unless ``retryable``), then
    answer from ``answers``; it keeps the messages of each request."""

    def __init__(self, failing: set[int], answers: list[ModelReply], *, retryable: bool = False):
        self.failing = failing
        self.answers = answers
        self.retryable = retryable
        self.seen: list[tuple[Message, ...]] = []

    def __call__(self, request: ModelRequest) -> ModelReply:
        n = len(self.seen)
        self.seen.append(tuple(request.messages))
        if n in self.failing or not self.answers:
            raise ModelCallError(f"overloaded {n}", retryable=self.retryable, kind="server")
        return self.answers.pop(0)


def loop_of(model: Flaky, journal: Any, **kw: Any) -> Loop:
    return Loop(FunctionModel(model), tools=make_tools(), journal=journal, clock=FakeClock(), **kw)


def failed_step(step: StepRecord) -> bool:
    return step.llm_call_id is None and not step.parse_ok and step.parse_error is None


@pytest.mark.parametrize("bad", [-1, True, False, 1.5, "3", None])
def test_max_consecutive_model_failures_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_consecutive_model_failures"):
        Limits(max_consecutive_model_failures=bad)  # type: ignore[arg-type]


def test_a_ceiling_of_zero_model_failures_is_tightened_to_one() -> None:
    # The seed (awaken-run-termination): zero is tightened to one, so a failing model never
    # makes a run that does not end; it behaves, and is stored, as the default.
    limits = Limits(max_consecutive_model_failures=0)
    assert limits.max_consecutive_model_failures == 1
    assert limits == Limits()
    assert "max_consecutive_model_failures" not in limits.to_dict()


def test_it_is_stored_with_the_run_only_when_not_the_default() -> None:
    assert Limits().max_consecutive_model_failures == 1
    assert "max_consecutive_model_failures" not in Limits().to_dict()  # old readers' dict
    limits = Limits(max_consecutive_model_failures=3)
    assert limits.to_dict()["max_consecutive_model_failures"] == 3
    assert Limits.from_dict(limits.to_dict()) == limits


async def test_by_default_one_failed_step_still_ends_the_run_llm_error() -> None:
    model = Flaky({0}, [ModelReply("done")])
    r = await loop_of(model, MemoryJournal()).run("g")
    assert r.stop_reason == StopReason.llm_error and r.steps_used == 1
    assert failed_step(r.steps[0]) and len(model.seen) == 1


async def test_failed_steps_below_the_limit_are_recorded_and_the_next_step_tries_again() -> None:
    # Each failed step used the retry policy's three attempts first (retryable errors).
    model = Flaky(set(range(6)), [ModelReply("done")], retryable=True)
    limits = Limits(max_consecutive_model_failures=3)
    r = await loop_of(model, MemoryJournal(), limits=limits).run("g")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "done"
    assert [failed_step(s) for s in r.steps] == [True, True, False]
    assert len(model.seen) == 7
    # A failed step adds nothing to the conversation: every call was sent the same messages.
    assert all(messages == model.seen[0] for messages in model.seen)
    assert r.steps[2].prompt_chars == r.steps[0].prompt_chars


async def test_the_limit_of_failed_steps_in_a_row_ends_the_run_llm_error() -> None:
    model = Flaky({0, 1, 2}, [ModelReply("never")])
    r = await loop_of(model, MemoryJournal(), limits=Limits(max_consecutive_model_failures=3)).run(
        "g"
    )
    assert r.stop_reason == StopReason.llm_error and r.steps_used == 3
    assert all(failed_step(s) for s in r.steps)
    assert r.stop_detail == (
        "ModelCallError: overloaded 2 [kind=server, retryable=False, attempts=1]"
    )


async def test_a_successful_model_call_resets_the_count() -> None:
    model = Flaky({0, 1, 3, 4}, [call("noop"), ModelReply("done")])
    r = await loop_of(model, MemoryJournal(), limits=Limits(max_consecutive_model_failures=3)).run(
        "g"
    )
    assert r.stop_reason == StopReason.agent_finished
    assert [failed_step(s) for s in r.steps] == [True, True, False, True, True, False]


async def test_the_step_budget_still_bounds_failed_steps() -> None:
    model = Flaky(set(range(10)), [])
    limits = Limits(max_steps=2, max_consecutive_model_failures=10)
    r = await loop_of(model, MemoryJournal(), limits=limits).run("g")
    assert r.stop_reason == StopReason.step_budget and r.steps_used == 2
    assert all(failed_step(s) for s in r.steps)


# Writes of a run whose model always fails, N=3 (no observers, so each step is written with
# the next step's model intent): 1 intent 0, 2 failure 0, 3 step 0 + intent 1, 4 failure 1,
# 5 step 1 + intent 2, 6 failure 2, 7 step 2 + end.
@pytest.mark.parametrize(
    ("crash_after", "calls_on_resume"),
    [
        (4, 1),  # a model_failure without its step, not the last: step appended, go on
        (5, 1),  # a model intent without result after two failed steps
        (6, 0),  # a model_failure without its step, the last: the run ends, no call
    ],
)
async def test_resume_rebuilds_the_count_of_failed_steps_from_the_journal(
    crash_after: int, calls_on_resume: int
) -> None:
    journal = MemoryJournal()
    limits = Limits(max_consecutive_model_failures=3)
    crashing = RecordingJournal(journal, crash_at=crash_after, crash_after=True)
    with pytest.raises(Crash):
        await loop_of(Flaky(set(range(10)), []), crashing, limits=limits).run("g", run_id="r")
    model = Flaky(set(range(10)), [ModelReply("too late")])
    r = await loop_of(model, journal).resume("r")
    assert len(model.seen) == calls_on_resume
    assert r.stop_reason == StopReason.llm_error and r.steps_used == 3
    assert all(failed_step(s) for s in r.steps)


@pytest.mark.parametrize("after", ["5", float("nan"), -3.0, True])
async def test_a_custom_models_retry_after_that_is_not_seconds_counts_as_not_said(
    after: object,
) -> None:
    # Read once where the model's exception enters: no raw TypeError out of Loop.run, no
    # comparison with NaN; the retry policy's own backoff applies.
    seen: list[int] = []

    def model(request: ModelRequest) -> ModelReply:
        seen.append(request.attempt)
        if request.attempt == 1:
            raise ModelCallError("busy", retryable=True, retry_after=after, kind="rate_limit")  # type: ignore[arg-type]
        return ModelReply("done")

    journal = MemoryJournal()
    r = await Loop(
        FunctionModel(model), tools=make_tools(), journal=journal, clock=FakeClock()
    ).run("g", run_id="r")
    assert r.stop_reason == StopReason.agent_finished and seen == [1, 2]
    _, records = await journal.read("r")
    failed = [x for x in records if type(x).__name__ == "ModelAttemptFailed"]
    assert len(failed) == 1 and failed[0].error.retry_after is None


async def test_a_retry_after_of_forever_makes_the_failure_final_even_with_no_cap() -> None:
    from polyloop import RetryPolicy

    def model(request: ModelRequest) -> ModelReply:
        raise ModelCallError("come back never", retryable=True, retry_after=float("inf"))

    r = await Loop(
        FunctionModel(model),
        tools=make_tools(),
        clock=FakeClock(),
        retry=RetryPolicy(max_attempts=5, max_retry_after_s=None),
    ).run("g")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail is not None and "retryable=False, attempts=1" in r.stop_detail
