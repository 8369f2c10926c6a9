"""Every float setting is a finite number in its range, or a one-line ConfigError at
construction that names the parameter as the caller wrote it. NaN, infinity and bools are never
numbers; "never" or "no limit" is None where a setting has it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polyloop import ConfigError, Limits, Loop, Pricing, RetryPolicy, ToolRegistry
from polyloop.batch.sweeper import find_stalled
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from polyloop.tools.builtin import workspace_tools

LOCAL = "http://127.0.0.1:9/v1"
BAD = [math.nan, math.inf, -1, True]


def _loop(**kw: Any) -> Any:
    return Loop(ScriptedModel(["x"]), **kw)


def _tool(v: Any) -> Any:
    def f() -> str:
        """F."""
        return ""

    return ToolRegistry().register(f, timeout_s=v)


def _openai(**kw: Any) -> Any:
    pytest.importorskip("openai")
    from polyloop.models.openai import OpenAIModel

    return OpenAIModel("m", base_url=LOCAL, api_key="k", **kw)


def _responses(**kw: Any) -> Any:
    pytest.importorskip("openai")
    from polyloop.models.openai_responses import OpenAIResponsesModel

    return OpenAIResponsesModel("m", base_url=LOCAL, api_key="k", **kw)


def _anthropic(**kw: Any) -> Any:
    pytest.importorskip("anthropic")
    from polyloop.models.anthropic import AnthropicModel

    return AnthropicModel("m", base_url=LOCAL, api_key="k", **kw)


def _gemini(**kw: Any) -> Any:
    pytest.importorskip("google.genai")
    from polyloop.models.gemini import GeminiModel

    return GeminiModel("m", api_key="k", **kw)


def _mcp(**kw: Any) -> Any:
    pytest.importorskip("mcp")
    from polyloop.tools.mcp import MCPServer

    return MCPServer(argv=["true"], **kw)


def _postgres(v: Any) -> Any:
    pytest.importorskip("psycopg")
    from polyloop.journal.postgres import PostgresJournal

    return PostgresJournal("postgresql://127.0.0.1:9/none", timeout_s=v)


def _sqlite(tmp: Path, v: Any) -> Any:
    return SQLiteJournal(tmp / "j.db", busy_timeout_s=v)


def _stalled(tmp: Path, v: Any) -> Any:
    journal = SQLiteJournal(tmp / "s.db")
    try:
        return asyncio.run(find_stalled(journal, older_than_s=v))
    finally:
        journal.close()


# (the name the message must hold, a builder taking (tmp_path, value))
SETTINGS: dict[str, tuple[str, Callable[[Path, Any], Any]]] = {
    "Loop.lease_ttl_s": ("lease_ttl_s", lambda t, v: _loop(lease_ttl_s=v)),
    "Loop.cancel_grace_s": ("cancel_grace_s", lambda t, v: _loop(cancel_grace_s=v)),
    "Loop.approval_timeout_s": ("approval_timeout_s", lambda t, v: _loop(approval_timeout_s=v)),
    **{
        f"RetryPolicy.{name}": (f"RetryPolicy.{name}", lambda t, v, n=name: RetryPolicy(**{n: v}))
        for name in (
            "initial_backoff_s",
            "max_backoff_s",
            "multiplier",
            "jitter",
            "max_retry_after_s",
        )
    },
    "Limits.max_seconds": ("Limits.max_seconds", lambda t, v: Limits(max_seconds=v)),
    "Limits.max_cost": ("Limits.max_cost", lambda t, v: Limits(max_cost=v)),
    "Pricing.input": ("Pricing.input_per_mtok", lambda t, v: Pricing(v, 1.0)),
    "Pricing.output": ("Pricing.output_per_mtok", lambda t, v: Pricing(1.0, v)),
    "Pricing.cached": ("Pricing.cached_input_per_mtok", lambda t, v: Pricing(1.0, 1.0, v)),
    "tool timeout_s": ("timeout_s", lambda t, v: _tool(v)),
    "shell_timeout_s": ("shell_timeout_s", lambda t, v: workspace_tools(t, shell_timeout_s=v)),
    "MCPServer.timeout_s": ("MCPServer timeout_s", lambda t, v: _mcp(timeout_s=v)),
    "MCPServer.connect_timeout_s": (
        "MCPServer connect_timeout_s",
        lambda t, v: _mcp(connect_timeout_s=v),
    ),
    "OpenAIModel.timeout_s": ("OpenAIModel timeout_s", lambda t, v: _openai(timeout_s=v)),
    "OpenAIModel.temperature": ("OpenAIModel temperature", lambda t, v: _openai(temperature=v)),
    "OpenAIResponsesModel.timeout_s": (
        "OpenAIResponsesModel timeout_s",
        lambda t, v: _responses(timeout_s=v),
    ),
    "AnthropicModel.timeout_s": ("AnthropicModel timeout_s", lambda t, v: _anthropic(timeout_s=v)),
    "GeminiModel.timeout_s": ("GeminiModel timeout_s", lambda t, v: _gemini(timeout_s=v)),
    "GeminiModel.temperature": ("GeminiModel temperature", lambda t, v: _gemini(temperature=v)),
    "SQLiteJournal.busy_timeout_s": ("busy_timeout_s", _sqlite),
    "PostgresJournal.timeout_s": ("PostgresJournal timeout_s", lambda t, v: _postgres(v)),
    "find_stalled.older_than_s": ("older_than_s", _stalled),
}


@pytest.mark.parametrize("value", BAD, ids=repr)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_every_float_setting_refuses_nan_inf_negative_and_bool_in_one_line(
    setting: str, value: Any, tmp_path: Path
) -> None:
    name, build = SETTINGS[setting]
    with pytest.raises(ConfigError) as err:
        build(tmp_path, value)
    message = str(err.value)
    assert "\n" not in message and name in message, message


def test_a_nan_lease_is_refused_before_it_can_break_exclusivity() -> None:
    with pytest.raises(ConfigError, match=r"lease_ttl_s must be .*got nan"):
        Loop(ScriptedModel(["x"]), lease_ttl_s=float("nan"))


def test_infinity_where_it_would_mean_never_says_to_pass_none() -> None:
    with pytest.raises(ConfigError, match="use None for never"):
        Loop(ScriptedModel(["x"]), approval_timeout_s=math.inf)
    with pytest.raises(ConfigError, match="use None for no limit"):
        Limits(max_seconds=math.inf)
    with pytest.raises(ConfigError, match="use None for no cap"):
        RetryPolicy(max_retry_after_s=math.inf)


def test_none_is_never_and_a_finite_number_is_taken() -> None:
    policy = RetryPolicy(max_retry_after_s=None, jitter=0, initial_backoff_s=1)
    assert policy.allows_retry(1, retry_after=86_400.0)  # no cap: waits as asked
    assert not RetryPolicy().allows_retry(1, retry_after=301.0)
    _loop(lease_ttl_s=1, cancel_grace_s=0, approval_timeout_s=None)
    assert Limits(max_seconds=1, max_cost=None).max_seconds == 1
    assert Pricing(0, 0.5, None).cached_input_per_mtok is None


def test_an_infinite_budget_an_older_version_stored_reads_as_no_limit() -> None:
    # Older versions took max_cost=inf for "no limit"; its run must stay readable.
    stored = {**Limits().to_dict(), "max_cost": math.inf, "max_seconds": math.inf}
    limits = Limits.from_dict(stored)
    assert limits.max_cost is None and limits.max_seconds is None
    with pytest.raises(ConfigError):
        Limits.from_dict({**Limits().to_dict(), "max_cost": math.nan})


@pytest.mark.parametrize("make", [lambda v: Pricing(v, 1.0), lambda v: Pricing(1.0, v)])
def test_a_price_that_makes_a_believable_usage_cost_infinite_is_refused(make: Any) -> None:
    # Pricing(1e308, 0) priced 10**6 tokens at inf dollars: live totals and those the
    # journal's reader believes would disagree. Prices stop below MAX_PRICE_PER_MTOK.
    from polyloop.types import Usage
    from polyloop.types._checks import MAX_PRICE_PER_MTOK, MAX_REPORTED

    with pytest.raises(ConfigError, match="per_mtok must be >= 0 and < 100000"):
        make(1e308)
    with pytest.raises(ConfigError, match="per_mtok"):
        make(MAX_PRICE_PER_MTOK)
    dearest = Pricing(MAX_PRICE_PER_MTOK - 1, MAX_PRICE_PER_MTOK - 1)
    cost = dearest.cost(Usage(MAX_REPORTED, MAX_REPORTED))
    assert math.isfinite(cost) and cost <= MAX_REPORTED
