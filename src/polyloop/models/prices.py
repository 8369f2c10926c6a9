"""The price table: US dollars for the models whose prices are public, from ``genai-prices``
(the table pydantic-ai uses; extra ``polyloop[prices]``, imported lazily).

A ``Loop`` prices an attempt whose provider reported no cost with the model's own ``Pricing``
when it has one, else with this table's entry for the model's ``name``
(``"openai:gpt-4o-mini"``, ``"anthropic:claude-sonnet-4-5"``, ``"gemini:gemini-2.5-flash"``,
or a bare model name); a model the table does not know, or any model when ``genai-prices`` is
not installed, has no price (its attempts' cost is not known: see ``Limits.max_cost``).

The table prices by name, not by endpoint: a local server that serves a model under a name the
table knows is priced as that model (give it ``Pricing(0, 0)`` to count it free). Each attempt
is priced at the table's rates of the moment it is priced, tiers and cache reads included.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from ..seams import Pricer
from ..types import Usage

__all__ = ["TablePrice", "table_price"]

# The adapters' name prefixes (``polyloop run --model``) and the table's provider ids.
_PROVIDERS = {
    "openai": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "google",
}


class TablePrice:
    """One model's entry in the price table: ``cost(usage)`` in US dollars."""

    __slots__ = ("_calc", "_provider", "_ref", "_usage")

    def __init__(self, ref: str, provider: str | None, sdk: Any) -> None:
        self._ref = ref
        self._provider = provider
        self._calc = sdk.calc_price
        self._usage = sdk.Usage

    def __repr__(self) -> str:
        return f"TablePrice({self._ref!r}, provider={self._provider!r})"

    def cost(self, usage: Usage) -> float | None:
        """US dollars for ``usage`` (a count not reported counts 0; the cached part of the
        input at the cache-read price); None when the table cannot price it."""
        total_in = usage.input_tokens or 0
        cached = min(usage.cached_tokens or 0, total_in)
        counts = self._usage(
            input_tokens=total_in, cache_read_tokens=cached, output_tokens=usage.output_tokens or 0
        )
        try:
            price = float(self._calc(counts, self._ref, provider_id=self._provider).total_price)
        except Exception:  # the table is data from outside: a failure is "no price"
            return None
        return price if 0 <= price < math.inf else None  # NaN fails


@functools.cache
def table_price(name: str) -> Pricer | None:
    """The table's price of the model named ``name`` (a model's ``name``), or None when the
    table does not know it or ``genai-prices`` is not installed. Looked up once per name: the
    first call imports the table (a few hundred milliseconds)."""
    try:
        import genai_prices
    except ImportError:
        return None
    prefix, colon, ref = name.partition(":")
    provider = _PROVIDERS.get(prefix) if colon else None
    if colon and provider is None:
        return None  # a custom model's own "kind:name": not a provider the table is read for
    if not colon:
        ref = name
    entry = TablePrice(ref, provider, genai_prices)
    try:
        genai_prices.calc_price(
            genai_prices.Usage(input_tokens=0, output_tokens=0), ref, provider_id=provider
        )
    except Exception:  # LookupError: not in the table
        return None
    return entry
