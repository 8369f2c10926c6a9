"""A usage report that cannot be believed (a negative, non-int or absurd token count, a cost that
is NaN, infinite or negative) is refused: the attempt counts as usage not reported
(``usage_missing``), its reply is used as normal, a warning names it, and no total ever goes
down or turns NaN, so the token and cost budgets hold. The same on every adapter, for a
custom model, through a FallbackModel, and for a journal an older version wrote."""

from __future__ import annotations

import logging
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from polyloop import FallbackModel, Limits, Loop, ModelCallError, ModelReply, Pricing, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import (
    ModelRequest,
    ModelResult,
    Usage,
    record_from_dict,
    record_to_dict,
    usage_refusal,
)
from tests.conftest import RecordingJournal, call, make_tools
from tests.fakes import anthropic_server as anthropic
from tests.fakes import gemini_server as gemini
from tests.fakes import openai_responses_server as responses
from tests.fakes import openai_server as openai
from tests.fakes.providers import IDS, PROVIDERS, Provider, chosen

NAN = float("nan")


def noop_with(usage: Usage | None) -> ModelReply:
    return ModelReply(tool_calls=call("noop").tool_calls, usage=usage)


def loop_of(model: object, limits: Limits, journal: Any = None, **kw: Any) -> Loop:
    kw.setdefault("clock", FakeClock())
    return Loop(
        model,  # type: ignore[arg-type]
        tools=make_tools(),
        limits=limits,
        journal=journal if journal is not None else RecordingJournal(),
        **kw,
    )


@pytest.mark.parametrize(
    "bad",
    [
        Usage(-5, 1),
        Usage(1, -1),
        Usage(10, 1, cached_tokens=-3),
        Usage(10, 1, reasoning_tokens=-1),
        Usage(True, 1),  # type: ignore[arg-type]
        Usage(1.5, 1),  # type: ignore[arg-type]
        Usage("100", 1),  # type: ignore[arg-type]
        Usage(10**30, 1),
        Usage(10, 1, cost_usd=NAN),
        Usage(10, 1, cost_usd=math.inf),
        Usage(10, 1, cost_usd=-0.5),
    ],
    ids=repr,
)
def test_the_shared_check_refuses_every_value_that_cannot_be_believed(bad: Usage) -> None:
    refused = usage_refusal(bad)
    assert refused is not None and "\n" not in refused
    assert usage_refusal(Usage(10, 1, cached_tokens=0, reasoning_tokens=0, cost_usd=0.0)) is None
    assert usage_refusal(Usage()) is None


async def test_a_negative_count_from_a_custom_model_never_lowers_the_token_total(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Trusted, -5 + 1 would leave room for five more steps of 15; refused, it counts nothing.
    model = ScriptedModel([noop_with(Usage(-5, 1))] + [noop_with(Usage(10, 5))] * 5)
    with caplog.at_level(logging.WARNING, logger="polyloop"):
        r = await loop_of(model, Limits(max_tokens=30)).run("go", run_id="neg")
    assert r.stop_reason == StopReason.token_budget and r.steps_used == 3
    assert r.totals.tokens == 30 and r.totals.usage_missing == 1
    warned = [m for m in caplog.messages if "refused the reported usage" in m]
    assert len(warned) == 1
    assert "run neg step 0 attempt 1" in warned[0] and "input_tokens=-5" in warned[0]


async def test_a_nan_cost_counts_as_missing_and_never_poisons_the_cost_total(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(
        [noop_with(Usage(10, 10, cost_usd=NAN))] + [noop_with(Usage(10, 10, cost_usd=0.01))] * 5
    )
    journal = SQLiteJournal(tmp_path / "j.db")
    try:
        r = await loop_of(model, Limits(max_cost=0.02), journal).run("go", run_id="nan")
    finally:
        journal.close()
    assert r.stop_reason == StopReason.cost_budget and r.steps_used == 3
    assert r.totals.cost_usd == pytest.approx(0.02) and r.totals.usage_missing == 1
    with sqlite3.connect(tmp_path / "j.db") as db:
        (cost, missing) = db.execute("SELECT cost_usd, usage_missing FROM runs").fetchone()
        calls = db.execute(
            "SELECT input_tokens, cost_usd FROM model_calls ORDER BY step_idx"
        ).fetchall()
    assert cost == pytest.approx(0.02) and missing == 1  # never NULL
    assert calls[0] == (None, None)  # recorded as not reported
    assert calls[1] == (10, pytest.approx(0.01))


async def test_a_refused_usage_is_not_priced_and_the_reply_is_used_as_normal() -> None:
    # Priced, -1_000_000 input tokens would be a negative cost; refused, it is missing.
    prices = Pricing(input_per_mtok=2.0, output_per_mtok=10.0)

    def reply(request: ModelRequest) -> ModelReply:
        if request.step_idx == 0:
            return noop_with(Usage(-1_000_000, 10))
        return noop_with(Usage(100_000, 0))  # $0.20

    model = FunctionModel(reply)
    model.pricing = prices  # type: ignore[attr-defined]
    r = await loop_of(model, Limits(max_cost=0.3, max_steps=5)).run("go")
    assert r.stop_reason == StopReason.cost_budget and r.steps_used == 3
    assert r.totals.cost_usd == pytest.approx(0.4) and r.totals.usage_missing == 1
    assert r.actions_executed == 3  # the refused reply's action ran


async def test_a_fallback_models_refused_usage_counts_as_missing() -> None:
    def broken(request: ModelRequest) -> ModelReply:
        raise ModelCallError("down", retryable=False, kind="server")

    model = FallbackModel(FunctionModel(broken), ScriptedModel([noop_with(Usage(-(10**6), 1))] * 3))
    r = await loop_of(model, Limits(max_tokens=100, max_steps=3)).run("go")
    assert r.stop_reason == StopReason.step_budget
    assert r.totals.tokens == 0 and r.totals.usage_missing == 3


def test_a_journal_reader_refuses_a_usage_an_older_version_stored() -> None:
    # An older version journaled what it was told: read back, it must not lower a total.
    stored = ModelResult(1, "i1", 1, "c1", noop_with(Usage(-5, 1, cost_usd=NAN)), 1.0, 0, NAN)
    read = record_from_dict(record_to_dict(stored))
    assert isinstance(read, ModelResult)
    assert read.reply.usage is None and read.cost_usd is None
    negative = ModelResult(1, "i1", 1, "c1", noop_with(Usage(5, 1)), 1.0, 0, -3.0)
    read = record_from_dict(record_to_dict(negative))
    assert isinstance(read, ModelResult) and read.cost_usd is None
    assert read.reply.usage == Usage(5, 1)


# --- every adapter ---------------------------------------------------------------------------


def negative_prompt(provider: Provider) -> Any:
    """A text answer whose provider reports -100000 prompt tokens."""
    if provider.id == "openai":
        return openai.completion("hi", usage=(-100_000, 17))
    if provider.id == "openai-responses":
        return responses.response(responses.message("hi"), usage=(-100_000, 17, 0))
    if provider.id == "anthropic":
        return anthropic.message(
            anthropic.text("hi"), usage={"input_tokens": -100_000, "cache_read_input_tokens": 40}
        )
    return gemini.generated(
        gemini.text("hi"), usage={"promptTokenCount": -100_000, "candidatesTokenCount": 17}
    )


@pytest.fixture(params=PROVIDERS, ids=IDS)
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    return chosen(request.param, monkeypatch)


async def test_every_adapter_reports_a_negative_count_so_that_the_kernel_refuses_it(
    provider: Provider,
) -> None:
    with provider.server() as fake:
        fake.script(negative_prompt(provider))
        model = provider.model(fake.url)
        r = await Loop(model, limits=Limits(max_tokens=500)).run("hello")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "hi"
    assert r.totals.tokens == 0 and r.totals.usage_missing == 1
