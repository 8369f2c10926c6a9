"""A budget that cannot fire says so. Prices for known models come from the genai-prices table
(a model's own ``Pricing`` overrides it, a cost the provider reports beats both); a cost or
token budget that an attempt could not be measured against (no usage reported, or no price
and no reported cost) is warned about once on the ``polyloop`` logger, and the run's end
record says so in ``stop_detail``, live and after a resume alike."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from polyloop import Limits, Loop, ModelReply, Pricing, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.models.openai import OpenAIModel
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import ModelRequest, Usage
from tests.conftest import Crash, RecordingJournal, call, make_tools
from tests.fakes.openai_server import FakeOpenAIServer, completion, completion_stream, tool_call

genai_prices = pytest.importorskip("genai_prices")
pytest.importorskip("openai")

COST = "max_cost cannot be measured"
TOKENS = "max_tokens cannot be measured"


def noop_with(usage: Usage | None) -> ModelReply:
    return ModelReply(tool_calls=call("noop").tool_calls, usage=usage)


def loop_of(model: object, limits: Limits, journal: Any = None) -> Loop:
    journal = journal if journal is not None else RecordingJournal()
    return Loop(model, tools=make_tools(), limits=limits, journal=journal, clock=FakeClock())  # type: ignore[arg-type]


def table_cost(model_ref: str, provider_id: str, n_in: int, n_out: int) -> float:
    usage = genai_prices.Usage(input_tokens=n_in, output_tokens=n_out)
    return float(genai_prices.calc_price(usage, model_ref, provider_id=provider_id).total_price)


def noop_reply(**options: Any) -> Any:
    return completion(tool_calls=[tool_call("noop", "{}")], **options)


# --- where a cost comes from -----------------------------------------------------------------


async def test_a_model_the_price_table_knows_is_priced_from_it() -> None:
    expected = table_cost("gpt-4o-mini", "openai", 100_000, 20_000)
    assert expected > 0
    with FakeOpenAIServer() as fake:
        fake.script(*[noop_reply(usage=(100_000, 20_000))] * 2, completion("done"))
        async with OpenAIModel("gpt-4o-mini", base_url=fake.url) as model:
            r = await loop_of(model, Limits(max_cost=1000.0)).run("go")
    assert r.stop_reason == StopReason.agent_finished
    # Two noop steps and the final answer (82 + 17 tokens) all priced from the table.
    final = table_cost("gpt-4o-mini", "openai", 82, 17)
    assert r.totals.cost_usd == pytest.approx(2 * expected + final)
    assert r.totals.usage_missing == 0 and r.stop_detail is None


async def test_a_models_pricing_overrides_the_price_table() -> None:
    prices = Pricing(input_per_mtok=1.0, output_per_mtok=2.0)
    with FakeOpenAIServer() as fake:
        fake.script(noop_reply(usage=(1_000_000, 1_000_000)), completion("done", usage=(0, 0)))
        async with OpenAIModel("gpt-4o-mini", base_url=fake.url, pricing=prices) as model:
            r = await loop_of(model, Limits(max_cost=1000.0)).run("go")
    assert r.totals.cost_usd == pytest.approx(3.0)


async def test_a_cost_the_provider_reports_is_taken_over_the_price_table() -> None:
    model = ScriptedModel([noop_with(Usage(1_000_000, 0, cost_usd=0.25))] * 2, name="gpt-4o")
    r = await loop_of(model, Limits(max_cost=0.5)).run("go")
    assert r.stop_reason == StopReason.cost_budget and r.totals.cost_usd == pytest.approx(0.5)


async def test_a_named_model_without_a_provider_prefix_is_looked_up_by_its_name() -> None:
    model = ScriptedModel([noop_with(Usage(1_000_000, 0))] * 2, name="gpt-4o")
    r = await loop_of(model, Limits(max_steps=2)).run("go")
    assert r.totals.cost_usd == pytest.approx(2 * table_cost("gpt-4o", "openai", 1_000_000, 0))


# --- a budget that cannot be measured --------------------------------------------------------


async def test_a_cost_budget_with_no_price_warns_once_and_its_stop_detail_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([noop_with(Usage(10, 10))] * 3, name="local:not-a-priced-model")
    journal = SQLiteJournal(tmp_path / "j.db")
    try:
        with caplog.at_level(logging.WARNING, logger="polyloop"):
            r = await loop_of(model, Limits(max_cost=1.0, max_steps=3), journal).run(
                "go", run_id="r1"
            )
    finally:
        await journal.aclose()
    assert r.stop_reason == StopReason.step_budget  # the budget never fired
    assert r.totals.cost_usd == 0.0 and r.totals.usage_missing == 3
    warned = [m for m in caplog.messages if COST in m]
    assert len(warned) == 1, caplog.messages
    assert "run r1" in warned[0] and "'local:not-a-priced-model'" in warned[0]
    assert "Pricing" in warned[0] and "--price-in" in warned[0]
    assert r.stop_detail is not None and COST in r.stop_detail
    with sqlite3.connect(tmp_path / "j.db") as db:
        (detail,) = db.execute("SELECT stop_detail FROM runs WHERE run_id = 'r1'").fetchone()
    assert detail == r.stop_detail


async def test_a_token_budget_against_a_streaming_server_without_usage_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # llama-cpp-python's server streams no usage chunk: the token budget can never fire.
    with FakeOpenAIServer() as fake:
        fake.script(
            *[completion_stream(tool_calls=[tool_call("noop", "{}")], usage=None)] * 3,
        )
        async with OpenAIModel("gemma-3-270m", base_url=fake.url, stream=True) as model:
            with caplog.at_level(logging.WARNING, logger="polyloop"):
                r = await loop_of(model, Limits(max_tokens=100, max_steps=3)).run("go")
    assert r.stop_reason == StopReason.step_budget
    assert r.totals.tokens == 0 and r.totals.usage_missing == 3
    warned = [m for m in caplog.messages if "cannot be measured" in m]
    assert len(warned) == 1, caplog.messages
    assert TOKENS in warned[0] and "no usage" in warned[0]
    assert r.stop_detail is not None and TOKENS in r.stop_detail and COST not in r.stop_detail


async def test_a_budget_that_is_measured_adds_nothing_to_stop_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = ScriptedModel([noop_with(Usage(10, 10))] * 2, pricing=Pricing(1.0, 1.0))
    with caplog.at_level(logging.WARNING, logger="polyloop"):
        r = await loop_of(model, Limits(max_cost=1.0, max_tokens=1000, max_steps=2)).run("go")
    assert r.stop_reason == StopReason.step_budget and r.stop_detail is None
    assert not [m for m in caplog.messages if "cannot be measured" in m]


async def test_without_a_budget_nothing_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="polyloop"):
        r = await loop_of(ScriptedModel([noop_with(None)] * 2), Limits(max_steps=2)).run("go")
    assert r.stop_detail is None and not caplog.messages


async def test_a_detail_of_its_own_comes_first_and_the_warning_after_it() -> None:
    def reply(request: ModelRequest) -> ModelReply:
        if request.step_idx == 0:
            return noop_with(None)
        raise RuntimeError("down")

    r = await loop_of(FunctionModel(reply), Limits(max_tokens=100)).run("go")
    assert r.stop_reason == StopReason.llm_error and r.stop_detail is not None
    assert r.stop_detail.startswith("RuntimeError: down [")
    assert r.stop_detail.endswith("; " + r.stop_detail.split("; ", 1)[1])
    assert TOKENS in r.stop_detail.split("; ", 1)[1]


async def test_a_resumed_run_says_so_too_without_warning_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = RecordingJournal(crash_at=3, crash_after=True)  # a step and a result durable
    model = ScriptedModel([noop_with(None)] * 6)
    with pytest.raises(Crash):
        await loop_of(model, Limits(max_tokens=100, max_steps=3), journal).run("go", run_id="c")
    assert journal.inner.records("c") and journal.end("c") is None
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="polyloop"):
        r = await loop_of(model, Limits(max_tokens=100, max_steps=3), journal).resume("c")
    assert r.stop_reason == StopReason.step_budget
    assert r.stop_detail is not None and TOKENS in r.stop_detail
    assert not [m for m in caplog.messages if "cannot be measured" in m]
