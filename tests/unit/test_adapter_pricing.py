"""Each adapter carries its prices (pricing=) for Limits.max_cost; a bad one is a one-line
ConfigError naming the adapter."""

from __future__ import annotations

from typing import Any

import pytest

from polyloop import ConfigError, Pricing
from polyloop.models.anthropic import AnthropicModel
from polyloop.models.gemini import GeminiModel
from polyloop.models.openai import OpenAIModel
from polyloop.models.openai_responses import OpenAIResponsesModel

LOCAL = "http://127.0.0.1:9/v1"
PRICES = Pricing(3.0, 15.0, 0.3)


def build(cls: type, **kw: Any) -> Any:
    if cls is GeminiModel:
        return cls("gemini-2.5-flash", api_key="k", **kw)
    return cls("m", base_url=LOCAL, **kw)


@pytest.mark.parametrize("cls", [OpenAIModel, OpenAIResponsesModel, AnthropicModel, GeminiModel])
def test_an_adapter_carries_its_pricing_and_refuses_a_bad_one(cls: type) -> None:
    assert build(cls, pricing=PRICES).pricing is PRICES
    assert build(cls).pricing is None
    with pytest.raises(ConfigError, match=cls.__name__) as err:
        build(cls, pricing={"input": 3.0})
    assert "\n" not in str(err.value)
