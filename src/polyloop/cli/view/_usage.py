"""What runs and steps spent, as the viewer and the report show it: tokens (input, output,
cached, reasoning), cost in US dollars and active seconds, each also in a ``data-`` attribute
named after its field (``data-tokens-used="1234"``), empty where the journal has no number."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._html import esc

RUNS_HEADERS = '<th class="num">Tokens</th><th class="num">Cost ($)</th><th class="num">Active</th>'
"""The runs list's usage columns, after Duration."""

_PARTS = (
    ("input", "input_tokens"),
    ("output", "output_tokens"),
    ("cached", "cached_tokens"),
    ("reasoning", "reasoning_tokens"),
)


def _num(value: Any, fmt: str = "") -> str:
    return "" if value is None else format(value, fmt)


def _data(usage: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    return "".join(f' data-{key.replace("_", "-")}="{esc(_num(usage.get(key)))}"' for key in keys)


def cost_text(value: Any) -> str:
    return "—" if value is None else f"${value:.6f}"


def active_text(value: Any) -> str:
    return "—" if value is None else f"{value:.2f} s"


def runs_cells(usage: Mapping[str, Any]) -> str:
    """A run's row cells: tokens used, cost, active seconds."""
    tokens, cost, active = (usage.get(k) for k in ("tokens_used", "cost_usd", "active_seconds"))
    return (
        f'<td class="num tokens-used"{_data(usage, ("tokens_used",))}>{esc(_num(tokens))}</td>'
        f'<td class="num cost-usd"{_data(usage, ("cost_usd",))}>{esc(_num(cost, ".6f"))}</td>'
        f'<td class="num active-seconds"{_data(usage, ("active_seconds",))}>'
        f"{esc(active_text(active))}</td>"
    )


def _breakdown(usage: Mapping[str, Any]) -> str:
    return ", ".join(f"{label} {usage[key]}" for label, key in _PARTS if usage.get(key) is not None)


def run_facts(usage: Mapping[str, Any]) -> str:
    """The run page's facts: tokens (with their parts), cost, active seconds."""
    parts = _breakdown(usage)
    tokens = _num(usage.get("tokens_used")) + (f" ({parts})" if parts else "")
    missing = usage.get("usage_missing")
    if missing:
        tokens += f"; {missing} replies without usage"
    keys = ("tokens_used", "usage_missing", *(k for _, k in _PARTS))
    return (
        f'<dt>Tokens</dt><dd class="tokens-used"{_data(usage, keys)}>{esc(tokens)}</dd>'
        f'<dt>Cost</dt><dd class="cost-usd"{_data(usage, ("cost_usd",))}>'
        f"{esc(cost_text(usage.get('cost_usd')))}</dd>"
        f'<dt>Active</dt><dd class="active-seconds"{_data(usage, ("active_seconds",))}>'
        f"{esc(active_text(usage.get('active_seconds')))}</dd>"
    )


def step_chip(usage: Mapping[str, Any] | None) -> str:
    """A step's usage in its timeline line: ``in I · out O · cached C · reasoning R · $X``."""
    if usage is None:
        return ""
    shown = [f"{label} {usage[key]}" for label, key in _PARTS if usage.get(key) is not None]
    if usage.get("cost_usd") is not None:
        shown.append(cost_text(usage["cost_usd"]))
    keys = (*(k for _, k in _PARTS), "cost_usd")
    text = " · ".join(shown) or "no usage reported"
    return f'<span class="usage"{_data(usage, keys)}>{esc(text)}</span>'
