"""A model call's reported usage and the prices that turn it into dollars."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._checks import MAX_PRICE_PER_MTOK, MAX_REPORTED, _shown, check_number, trusted_cost
from ._fast import fast_init

__all__ = ["Pricing", "Usage", "usage_from", "usage_refusal"]


@fast_init
@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one model call, as the provider reported it (None: not reported).

    ``input_tokens`` counts every prompt token, ``cached_tokens`` those of them the provider
    read from its prompt cache (a part of ``input_tokens``, billed at the cached price);
    ``output_tokens`` counts every generated token, ``reasoning_tokens`` the hidden reasoning
    among them (a part of ``output_tokens``). The adapters bring each provider to these
    meanings (Anthropic reports cache reads beside the input, Gemini thoughts beside the
    output: the adapter adds them in).

    A usage the kernel cannot believe is refused, never trusted and never fatal: a token count
    that is not an int (a bool, a float, anything else) from 0 to 10**12, or a ``cost_usd``
    that is not a finite number in that range. The attempt's reply is used as normal, but its
    usage is recorded as not reported (its ``model_calls`` counts are NULL, and it counts in
    the run's ``usage_missing``), and a warning on the ``polyloop`` logger names the run, step,
    attempt and the refused values. Building a Usage checks nothing (adapters and custom
    models may build one from anything); :func:`polyloop.types.usage_refusal` is the check."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_usd: float | None = None
    """What the call cost in US dollars, where the provider reports it (OpenRouter's
    ``usage.cost``, say); else the kernel prices the tokens with the model's ``Pricing``."""

    def __add__(self, other: Usage) -> Usage:
        def add(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else a + b

        return Usage(
            add(self.input_tokens, other.input_tokens),
            add(self.output_tokens, other.output_tokens),
            add(self.cached_tokens, other.cached_tokens),
            add(self.reasoning_tokens, other.reasoning_tokens),
            add(self.cost_usd, other.cost_usd),
        )

    @property
    def total_tokens(self) -> int | None:
        """Input plus output, or None when neither was reported."""
        if self.input_tokens is None and self.output_tokens is None:
            return None
        return (self.input_tokens or 0) + (self.output_tokens or 0)


def usage_from(d: Mapping[str, Any] | None) -> Usage | None:
    """A usage as a journal stores it (a reader's boundary): None when there is none, or when
    it cannot be believed (:func:`usage_refusal`; an older version may have stored one)."""
    if d is None:
        return None
    u = Usage(
        d["input_tokens"],
        d["output_tokens"],
        d.get("cached_tokens"),
        d.get("reasoning_tokens"),
        d.get("cost_usd"),
    )
    return None if usage_refusal(u) is not None else u


@dataclass(frozen=True, slots=True)
class Pricing:
    """A model's prices in US dollars per million tokens, for ``Limits.max_cost``.

    ``cached_input_per_mtok`` prices the input tokens read from the provider's cache
    (``Usage.cached_tokens``, a part of ``input_tokens``); None prices them as other input.
    Give a model its prices with its ``pricing`` attribute (``OpenAIModel(..., pricing=...)``,
    ``ScriptedModel(..., pricing=...)``); a provider that reports the cost itself
    (``Usage.cost_usd``) is taken at its word, when that word can be believed (see
    :class:`Usage`). Each price is a finite number >= 0 (not a bool), else ``ConfigError``."""

    input_per_mtok: float
    output_per_mtok: float
    cached_input_per_mtok: float | None = None

    def __post_init__(self) -> None:
        # Below MAX_PRICE_PER_MTOK, a believable usage (at most MAX_REPORTED tokens) always
        # costs a finite amount that the journal's reader believes too.
        below = MAX_PRICE_PER_MTOK
        check_number("Pricing.input_per_mtok", self.input_per_mtok, below=below)
        check_number("Pricing.output_per_mtok", self.output_per_mtok, below=below)
        check_number(
            "Pricing.cached_input_per_mtok",
            self.cached_input_per_mtok,
            below=below,
            none="the input price",
        )

    def cost(self, usage: Usage) -> float:
        """US dollars for ``usage`` (a token count not reported counts 0)."""
        total_in = usage.input_tokens or 0
        cached = min(usage.cached_tokens or 0, total_in)
        cached_price = (
            self.input_per_mtok
            if self.cached_input_per_mtok is None
            else self.cached_input_per_mtok
        )
        return (
            (total_in - cached) * self.input_per_mtok
            + cached * cached_price
            + (usage.output_tokens or 0) * self.output_per_mtok
        ) / 1_000_000


def _count_ok(n: object) -> bool:
    return n is None or (type(n) is int and 0 <= n <= MAX_REPORTED)


def usage_refusal(usage: Usage) -> str | None:
    """None when every value of ``usage`` can be believed; else the refused values, e.g.
    ``"input_tokens=-5, cost_usd=nan"``. A token count must be an int (not a bool) from 0 to
    :data:`MAX_REPORTED`, a cost a finite number in that range. Cheap when all is well (it is
    called for every model reply)."""
    m = MAX_REPORTED
    i, o, c, r = (
        usage.input_tokens,
        usage.output_tokens,
        usage.cached_tokens,
        usage.reasoning_tokens,
    )
    cost = usage.cost_usd
    if (  # inline: no call per field
        (i is None or (type(i) is int and 0 <= i <= m))
        and (o is None or (type(o) is int and 0 <= o <= m))
        and (c is None or (type(c) is int and 0 <= c <= m))
        and (r is None or (type(r) is int and 0 <= r <= m))
        and (cost is None or ((type(cost) is float or type(cost) is int) and 0 <= cost <= m))
    ):
        return None
    refused = [
        f"{name}={_shown(getattr(usage, name))}"
        for name in ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
        if not _count_ok(getattr(usage, name))
    ]
    if cost is not None and trusted_cost(cost) is None:
        refused.append(f"cost_usd={_shown(cost)}")
    return ", ".join(refused)
