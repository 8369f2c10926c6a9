"""The token, cost and time budgets (Limits.max_tokens, max_cost, max_seconds): settled at rule A
like the step and action budgets, in a fixed order, carried across crashes and resumes, and
overridable on resume."""

from __future__ import annotations

import pytest

from polyloop import ConfigError, Limits, Loop, ModelReply, Pricing, StopReason
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import ModelRequest, RunTotals, Usage
from tests.conftest import Crash, RecordingJournal, call, make_tools


def used(n_in: int, n_out: int, **kw: object) -> Usage:
    return Usage(n_in, n_out, **kw)  # type: ignore[arg-type]


def noop_with(usage: Usage | None) -> ModelReply:
    return ModelReply(tool_calls=call("noop").tool_calls, usage=usage)


def loop_of(model: object, limits: Limits, journal: RecordingJournal, **kw: object) -> Loop:
    kw.setdefault("clock", FakeClock())
    return Loop(model, tools=make_tools(), limits=limits, journal=journal, **kw)  # type: ignore[arg-type]


# --- tokens ----------------------------------------------------------------------------------


async def test_token_budget_stops_at_the_start_of_the_iteration_that_would_exceed_it() -> None:
    model = ScriptedModel([noop_with(used(10, 5))] * 5)
    r = await loop_of(model, Limits(max_tokens=30), RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.token_budget and r.steps_used == 2
    assert r.totals.tokens == 30 and r.totals.usage_missing == 0


async def test_a_completion_on_the_step_that_spends_the_last_tokens_is_task_completed() -> None:
    done = ModelReply(tool_calls=call("done", {"answer": "x"}).tool_calls, usage=used(100, 100))
    r = await loop_of(ScriptedModel([done]), Limits(max_tokens=1), RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.task_completed and r.totals.tokens == 200


async def test_a_reply_without_usage_counts_zero_and_the_run_says_usage_was_missing() -> None:
    model = ScriptedModel([noop_with(None), noop_with(used(20, 0)), noop_with(None)])
    r = await loop_of(model, Limits(max_tokens=20, max_steps=3), RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.token_budget and r.steps_used == 2
    assert r.totals == RunTotals(tokens=20, cost_usd=0.0, active_s=0.0, usage_missing=1)


# --- cost ------------------------------------------------------------------------------------

PRICES = Pricing(input_per_mtok=2.0, output_per_mtok=10.0, cached_input_per_mtok=0.5)


def test_pricing_prices_cached_input_apart_and_checks_its_numbers() -> None:
    # 1M input of which 400k cached, 100k output: 600k*2 + 400k*0.5 + 100k*10 per million.
    assert PRICES.cost(used(1_000_000, 100_000, cached_tokens=400_000)) == pytest.approx(2.4)
    assert Pricing(1.0, 1.0).cost(used(500_000, 0, cached_tokens=500_000)) == 0.5
    with pytest.raises(ConfigError, match="output_per_mtok"):
        Pricing(1.0, -1.0)


async def test_cost_budget_from_the_models_pricing() -> None:
    model = ScriptedModel([noop_with(used(100_000, 10_000))] * 9, pricing=PRICES)  # $0.30 each
    r = await loop_of(model, Limits(max_cost=0.75), RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.cost_budget and r.steps_used == 3
    assert r.totals.cost_usd == pytest.approx(0.9)


async def test_a_cost_the_provider_reports_is_taken_over_the_price_table() -> None:
    reply = noop_with(used(100_000, 10_000, cost_usd=0.01))
    model = ScriptedModel([reply] * 3, pricing=PRICES)
    r = await loop_of(model, Limits(max_cost=0.02), RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.cost_budget and r.steps_used == 2
    assert r.totals.cost_usd == pytest.approx(0.02)


async def test_without_a_price_the_cost_counts_zero_and_usage_missing_says_so() -> None:
    model = ScriptedModel([noop_with(used(10, 10))] * 2)
    r = await loop_of(model, Limits(max_cost=1.0, max_steps=2), RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.step_budget
    assert r.totals.cost_usd == 0.0 and r.totals.usage_missing == 2


async def test_a_pricing_that_is_not_a_pricing_is_a_config_error() -> None:
    model = ScriptedModel(["x"])
    model.pricing = {"input": 1}  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"must be a polyloop\.Pricing"):
        await loop_of(model, Limits(), RecordingJournal()).run("go")


# --- time ------------------------------------------------------------------------------------


def slow_model(clock: FakeClock, seconds: float) -> FunctionModel:
    def reply(request: ModelRequest) -> ModelReply:
        clock.now += seconds  # the call takes this long
        return noop_with(None)

    return FunctionModel(reply)


async def test_time_budget_counts_the_runs_active_time() -> None:
    clock = FakeClock()
    r = await loop_of(
        slow_model(clock, 4.0), Limits(max_seconds=10), RecordingJournal(), clock=clock
    ).run("go")
    assert r.stop_reason == StopReason.time_budget and r.steps_used == 3
    assert r.totals.active_s == 12.0


def test_limits_refuse_bad_amounts_in_one_line() -> None:
    for kw in ({"max_cost": 0}, {"max_seconds": -1.0}, {"max_tokens": 1.5}, {"max_cost": "1"}):
        with pytest.raises(ConfigError) as err:
            Limits(**kw)  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
    assert Limits(max_cost=0.5, max_seconds=1.5).to_dict()["max_cost"] == 0.5
    assert "max_tokens" not in Limits().to_dict()  # stored as before when unset


# --- order, resume, override -----------------------------------------------------------------


async def test_several_budgets_exhausted_at_once_stop_in_the_documented_order() -> None:
    clock = FakeClock()

    def reply(request: ModelRequest) -> ModelReply:
        clock.now += 10.0
        return noop_with(used(50, 50))

    # After one step: tokens 100, cost $0.0006, 10 s: all three exhausted; tokens come first.
    limits = Limits(max_tokens=100, max_cost=0.0001, max_seconds=10)
    model = FunctionModel(reply, pricing=PRICES)
    r = await loop_of(model, limits, RecordingJournal(), clock=clock).run("go")
    assert r.stop_reason == StopReason.token_budget
    r = await loop_of(
        FunctionModel(reply, pricing=PRICES),
        Limits(max_cost=0.0001, max_seconds=10),
        RecordingJournal(),
        clock=clock,
    ).run("go")
    assert r.stop_reason == StopReason.cost_budget
    # And the step budget before all of them.
    r = await loop_of(
        FunctionModel(reply), Limits(max_steps=1, max_tokens=1), RecordingJournal(), clock=clock
    ).run("go")
    assert r.stop_reason == StopReason.step_budget


async def test_resume_carries_the_token_cost_and_time_counts() -> None:
    clock = FakeClock()

    def reply(request: ModelRequest) -> ModelReply:
        clock.now += 3.0
        return noop_with(used(10, 10))

    limits = Limits(max_tokens=60, max_steps=30)
    # After two steps: the first model intent, then two writes a step (the model result with
    # the action intent; the action result and the step with the next step's model intent).
    journal = RecordingJournal(crash_at=5, crash_after=True)
    with pytest.raises(Crash):
        await loop_of(FunctionModel(reply, pricing=PRICES), limits, journal, clock=clock).run(
            "go", run_id="r"
        )
    clock.now += 1000.0  # the time the run lay crashed does not count
    resumed = loop_of(
        FunctionModel(reply, pricing=PRICES), limits, RecordingJournal(journal.inner), clock=clock
    )
    r = await resumed.resume("r")
    assert r.stop_reason == StopReason.token_budget and r.steps_used == 3
    assert r.totals.tokens == 60
    assert r.totals.cost_usd == pytest.approx(3 * (10 * 2.0 + 10 * 10.0) / 1e6)
    assert r.totals.active_s == pytest.approx(9.0)


async def test_an_override_on_resume_lifts_a_spent_budget() -> None:
    journal = RecordingJournal()
    model = ScriptedModel([noop_with(used(10, 10))] * 2 + ["done"])
    r = await loop_of(model, Limits(max_tokens=20), journal).run("go", run_id="r")
    assert r.stop_reason == StopReason.token_budget
    # An ended run comes back as it ended; a run stopped mid-way is resumed with more room.
    journal2 = RecordingJournal(crash_at=5, crash_after=True)
    model2 = ScriptedModel([noop_with(used(10, 10))] * 3 + ["done"])
    with pytest.raises(Crash):  # dies after two steps, with 40 of its 40 tokens spent
        await loop_of(model2, Limits(max_tokens=40), journal2).run("go", run_id="r2")
    r2 = await loop_of(model2, Limits(max_tokens=40), RecordingJournal(journal2.inner)).resume(
        "r2", limits=Limits(max_tokens=1_000)
    )
    assert r2.stop_reason == StopReason.agent_finished and r2.totals.tokens == 60
    assert r2.totals.usage_missing == 1  # the final answer came without usage


async def test_the_budget_hint_shows_what_is_left_and_resume_rebuilds_it_byte_for_byte() -> None:
    from polyloop.context import ChatContextBuilder

    clock = FakeClock()

    def reply(request: ModelRequest) -> ModelReply:
        clock.now += 2.5
        return noop_with(used(100, 20))

    limits = Limits(max_steps=5, max_tokens=1000, max_cost=1.0, max_seconds=60)
    journal = RecordingJournal(crash_at=5, crash_after=True)  # after two steps
    builder = ChatContextBuilder(system_prompt="S", budget_hint=True)

    def loop(j: RecordingJournal) -> Loop:
        return loop_of(
            FunctionModel(reply, pricing=PRICES), limits, j, clock=clock, context=builder
        )

    with pytest.raises(Crash):
        await loop(journal).run("go", run_id="r")
    r = await loop(RecordingJournal(journal.inner)).resume("r")
    tool_texts = [m["content"] for m in r.messages if m["role"] == "tool"]
    # $0.0004 per step; the first step's write came 2.5 s into the run.
    assert tool_texts[0] == ("ok\n[step 1 of 5 · 880 tokens left · $1.00 left · 58 s left]")
    assert tool_texts[1] == "ok\n[step 2 of 5 · 760 tokens left · $1.00 left · 55 s left]"
    # The same run undisturbed sees the same conversation.
    clock.now = FakeClock().now
    again = await loop(RecordingJournal()).run("go", run_id="r")
    assert [m for m in again.messages] == [m for m in r.messages]
