"""The facts every model adapter object gives alike (its ``name``, ``model``, ``base_url``,
``repr``) and its lifetime, for each adapter."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.fakes.providers import IDS, KEY, PROVIDERS, Provider, chosen

URL = "http://user:secret@127.0.0.1:9"

# provider id -> (its class, the prefix of its name, the model the provider's fixture uses)
FACTS = {
    "openai": ("OpenAIModel", "openai", "gpt-test"),
    "openai-responses": ("OpenAIResponsesModel", "openai-responses", "o4-mini"),
    "anthropic": ("AnthropicModel", "anthropic", "claude-test"),
    "gemini": ("GeminiModel", "gemini", "gemini-test"),
    "gemini-aiohttp": ("GeminiModel", "gemini", "gemini-test"),
}


@pytest.fixture(params=PROVIDERS, ids=IDS)
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    return chosen(request.param, monkeypatch)


async def test_name_model_base_url_and_repr(provider: Provider) -> None:
    cls, prefix, model_name = FACTS[provider.id]
    model = provider.model(URL)
    try:
        assert type(model).__name__ == cls
        assert model.model == model_name
        assert model.name == f"{prefix}:{model_name}"  # the model string of --model
        assert model.base_url.startswith("http://***@127.0.0.1:9")
        shown = repr(model)
        assert shown == f"{cls}(model={model_name!r}, base_url={model.base_url!r})"
        assert "secret" not in shown and KEY not in shown
    finally:
        await model.aclose()


async def test_aclose_is_idempotent_and_async_with_closes(provider: Provider) -> None:
    model = provider.model(URL)
    async with model as entered:
        assert entered is model
    await model.aclose()  # closed already: nothing happens


OPENAI_HINT = "the OpenAI adapter needs the openai package: pip install 'polyloop[openai]'"
ANTHROPIC_HINT = (
    "the Anthropic adapter needs the anthropic package: pip install 'polyloop[anthropic]'"
)
GEMINI_HINT = "the Gemini adapter needs the google-genai package: pip install 'polyloop[gemini]'"

# module, class, a model, the SDK it imports, the one-line ImportError without it
LAZY = [
    ("openai", "OpenAIModel", "gpt-test", "openai", OPENAI_HINT),
    ("openai_responses", "OpenAIResponsesModel", "o4-mini", "openai", OPENAI_HINT),
    ("anthropic", "AnthropicModel", "claude-test", "anthropic", ANTHROPIC_HINT),
    ("gemini", "GeminiModel", "gemini-test", "google.genai", GEMINI_HINT),
]


@pytest.mark.parametrize(("module", "cls", "model", "sdk", "hint"), LAZY, ids=[c[0] for c in LAZY])
def test_importing_the_module_does_not_import_the_sdk(
    module: str, cls: str, model: str, sdk: str, hint: str
) -> None:
    code = (
        "import sys\n"
        f"import polyloop, polyloop.models, polyloop.models.{module} as m\n"
        f"print({sdk!r} in sys.modules)\n"
        f"sys.modules[{sdk!r}] = None\n"
        "try:\n"
        f"    m.{cls}({model!r}, api_key='k')\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.splitlines() == ["False", hint]
