"""The price table (polyloop.models.prices): a model's name to its genai-prices entry."""

from __future__ import annotations

import sys

import pytest

from polyloop.models.prices import table_price
from polyloop.types import Usage

genai_prices = pytest.importorskip("genai_prices")

MTOK = Usage(1_000_000, 1_000_000)


def expected(ref: str, provider: str, **counts: int) -> float:
    usage = genai_prices.Usage(**counts)
    return float(genai_prices.calc_price(usage, ref, provider_id=provider).total_price)


@pytest.mark.parametrize(
    ("name", "ref", "provider"),
    [
        ("openai:gpt-4o-mini", "gpt-4o-mini", "openai"),
        ("openai-responses:gpt-4o-mini", "gpt-4o-mini", "openai"),
        ("anthropic:claude-sonnet-4-5", "claude-sonnet-4-5", "anthropic"),
        ("gemini:gemini-2.5-flash", "gemini-2.5-flash", "google"),
        ("gpt-4o", "gpt-4o", "openai"),
    ],
)
def test_each_adapters_names_are_read_as_the_tables_provider_and_model(
    name: str, ref: str, provider: str
) -> None:
    price = table_price(name)
    assert price is not None
    want = expected(ref, provider, input_tokens=1_000_000, output_tokens=1_000_000)
    assert want > 0 and price.cost(MTOK) == pytest.approx(want)


def test_cached_input_is_priced_as_a_cache_read() -> None:
    price = table_price("openai:gpt-4o-mini")
    assert price is not None
    cached = Usage(1_000_000, 0, cached_tokens=1_000_000)
    want = expected("gpt-4o-mini", "openai", input_tokens=1_000_000, cache_read_tokens=1_000_000)
    assert price.cost(cached) == pytest.approx(want)
    assert want < price.cost(Usage(1_000_000, 0))  # type: ignore[operator]
    # More cached than input (a provider's slip) counts the input, all cached.
    assert price.cost(Usage(10, 0, cached_tokens=99)) == price.cost(Usage(10, 0, cached_tokens=10))


@pytest.mark.parametrize(
    "name", ["openai:gemma-3-270m", "local:gpt-4o", "not-a-model-anyone-sells", "f:priced"]
)
def test_a_model_the_table_does_not_know_has_no_price(name: str) -> None:
    assert table_price(name) is None


def test_without_genai_prices_no_model_has_a_price(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "genai_prices", None)  # as if not installed
    assert table_price.__wrapped__("openai:gpt-4o-mini") is None
