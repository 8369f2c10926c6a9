"""The SDK client an adapter on ``_base.sdk_client`` builds (``OpenAIModel``,
``AnthropicModel``): its key and base URL from the arguments, else from the environment read
at construction; no key needed for a server on this machine, a one-line ``ConfigError`` for
one elsewhere; and ``client=`` or ``base_url=``/``api_key=``, not both."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from polyloop import ConfigError, ModelRequest
from polyloop.models._http import NO_KEY_PLACEHOLDER
from tests.fakes.providers import PROVIDERS, Provider, chosen
from tests.unit.test_adapter_facts import ANTHROPIC_HINT, OPENAI_HINT

# provider id -> (module, class, model, the base URL's variable, the key's variable)
CLIENTS = {
    "openai": ("openai", "OpenAIModel", "gpt-test", "OPENAI_BASE_URL", "OPENAI_API_KEY"),
    "anthropic": (
        "anthropic",
        "AnthropicModel",
        "claude-test",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
    ),
}
SDK_CLIENTS = {"openai": "AsyncOpenAI", "anthropic": "AsyncAnthropic"}
HINTS = {"openai": OPENAI_HINT, "anthropic": ANTHROPIC_HINT}
CHOSEN = [p for p in PROVIDERS if p.id in CLIENTS]


@pytest.fixture(params=CHOSEN, ids=[p.id for p in CHOSEN])
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    for variables in CLIENTS.values():
        for var in variables[3:]:
            monkeypatch.delenv(var, raising=False)
    return chosen(request.param, monkeypatch)


@pytest.fixture
def fake(provider: Provider) -> Iterator[Any]:
    with provider.server() as server:
        server.script(provider.answer("hi"))
        yield server


def build(provider: Provider, **options: Any) -> Any:
    module, cls, model = CLIENTS[provider.id][:3]
    adapter = getattr(importlib.import_module(f"polyloop.models.{module}"), cls)
    return adapter(model, **options)


def request() -> ModelRequest:
    return ModelRequest("run-1", 0, 1, [{"role": "user", "content": "hi"}], [])


async def test_key_and_base_url_come_from_the_environment_at_construction(
    provider: Provider, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_var, key_var = CLIENTS[provider.id][3:]
    monkeypatch.setenv(key_var, "sk-from-env")
    monkeypatch.setenv(base_var, fake.url)
    async with build(provider) as m:
        monkeypatch.setenv(key_var, "sk-changed-later")
        await m.complete(request())
    assert fake.requests[0].headers["authorization"] == "Bearer sk-from-env"


async def test_arguments_win_over_the_environment(
    provider: Provider, fake: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    base_var, key_var = CLIENTS[provider.id][3:]
    monkeypatch.setenv(key_var, "sk-env")
    monkeypatch.setenv(base_var, f"http://127.0.0.1:9{provider.server.ROOT}")
    async with build(provider, base_url=fake.url, api_key="sk-arg") as m:
        await m.complete(request())
    assert fake.requests[0].headers["authorization"] == "Bearer sk-arg"


async def test_a_local_server_needs_no_key(provider: Provider, fake: Any) -> None:
    async with build(provider, base_url=fake.url) as m:
        await m.complete(request())
    assert fake.requests[0].headers["authorization"] == f"Bearer {NO_KEY_PLACEHOLDER}"


@pytest.mark.parametrize("base_url", [None, "https://api.example.com"])
def test_a_remote_server_without_a_key_is_a_config_error(
    provider: Provider, base_url: str | None
) -> None:
    with pytest.raises(ConfigError, match=CLIENTS[provider.id][4]):
        build(provider, base_url=base_url)


def test_client_with_base_url_or_api_key_is_a_type_error(provider: Provider) -> None:
    sdk = importlib.import_module(CLIENTS[provider.id][0])
    client = getattr(sdk, SDK_CLIENTS[provider.id])(api_key="k", base_url="http://127.0.0.1:9")
    with pytest.raises(TypeError, match="not both"):
        build(provider, client=client, api_key="k2")


async def test_aclose_closes_the_client_it_built_but_not_one_passed_in(
    provider: Provider, fake: Any
) -> None:
    own = build(provider, base_url=fake.url, api_key="k")
    await own.aclose()
    await own.aclose()  # idempotent
    assert own.client.is_closed()

    sdk = importlib.import_module(CLIENTS[provider.id][0])
    theirs = getattr(sdk, SDK_CLIENTS[provider.id])(api_key="k", base_url=fake.url, max_retries=5)
    async with build(provider, client=theirs) as m:
        assert m.client.max_retries == 0 and theirs.max_retries == 5
        assert (await m.complete(request())).text == "hi"
    assert not theirs.is_closed()
    await theirs.close()


def test_constructing_without_the_sdk_names_the_extra(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, CLIENTS[provider.id][0], None)
    with pytest.raises(ImportError) as info:
        build(provider, api_key="k")
    assert str(info.value) == HINTS[provider.id]
