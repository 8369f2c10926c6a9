"""The four model adapters and their localhost fakes behind one interface, for the tests that
ask the same of every adapter (streaming, through a run): each :class:`Provider` builds its
adapter for a fake's URL and scripts its recorded shapes, whole or streamed.

    with provider.server() as fake:
        fake.script(provider.answer("Paris.", stream=True))
        model = provider.model(fake.url, stream=True)

``gemini-aiohttp`` is the Gemini adapter with google-genai on aiohttp (which it prefers when
installed): :func:`chosen` skips it where aiohttp is not installed, and runs the plain
``gemini`` one on httpx even where it is. A test module parametrizes over them with

    @pytest.fixture(params=PROVIDERS, ids=IDS)
    def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
        return chosen(request.param, monkeypatch)
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from polyloop import ToolRegistry
from tests.fakes import anthropic_server as anthropic
from tests.fakes import gemini_server as gemini
from tests.fakes import openai_responses_server as responses
from tests.fakes import openai_server as openai
from tests.fakes._server import Reply, ScriptedServer, then

__all__ = ["ADD_SPEC", "IDS", "PROVIDERS", "Provider", "adder", "chosen", "free_port"]

KEY = "key-for-the-fake-0123"

ADD_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
"""An OpenAI-format tool spec every adapter converts (the one the scripted calls call)."""


def adder() -> ToolRegistry:
    """The tools of a run whose model calls ``add``."""
    tools = ToolRegistry()

    @tools.tool
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return str(a + b)

    return tools


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on (a connection to it is refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Provider:
    """One adapter with its fake. ``answer``/``call`` script a text answer (with reasoning)
    and a tool call, whole or as the provider streams them; ``overloaded`` is an overload
    error sent before any chunk; ``error_in_stream(reply, after)`` a streamed reply that
    breaks off after ``after`` events with the provider's overload error event;
    ``filtered`` a reply the provider's content filter stopped; ``streams_to(path)`` tells a
    streamed request's path (and ``streamed(body)`` its body) from a plain one's.

    The failures, in the provider's error shapes: ``http_error(status, message, headers)``
    an error response with that status, ``too_long`` its answer to a prompt longer than the
    model's context window, ``malformed`` a 200 whose JSON is cut short, ``wrong_shape`` a 200
    of valid JSON that is not a reply, ``dropped`` a response whose body breaks off.
    ``sdk_error`` names the SDK's base exception class (``module.Class``), which the cause of
    every failure but a ``bad_response`` is, and ``timeout_error`` the class of a timeout's
    (None: not so for this SDK: google-genai lets its transport's exceptions through)."""

    id: str
    server: type[ScriptedServer]
    build: Callable[..., Any]
    answer_of: Callable[[str, str | None, bool], Reply]
    call_of: Callable[[str, dict[str, Any], str, bool], Reply]
    overloaded: Callable[[], Reply]
    error_event: Callable[[], bytes]
    filtered: Callable[[bool], Reply]
    streamed: Callable[[str, Any], bool]
    http_error: Callable[[int, str, tuple[tuple[str, str], ...]], Reply]
    too_long: Callable[[], Reply]
    malformed: Callable[[], Reply]
    wrong_shape: Callable[[], Reply]
    dropped: Callable[[], Reply]
    sdk_error: str | None = None
    timeout_error: str | None = None
    aiohttp: bool = False

    def model(self, url: str, **options: Any) -> Any:
        """The adapter for the fake at ``url`` (``options`` its constructor's)."""
        return self.build(url, **options)

    def answer(self, text: str, reasoning: str | None = None, *, stream: bool = False) -> Reply:
        return self.answer_of(text, reasoning, stream)

    def call(
        self, name: str, arguments: dict[str, Any], id: str = "call_1", *, stream: bool = False
    ) -> Reply:
        return self.call_of(name, arguments, id, stream)

    def error_in_stream(self, reply: Reply, after: int) -> Reply:
        return then(reply, after, self.error_event())


def _openai(url: str, **options: Any) -> Any:
    from polyloop.models.openai import OpenAIModel

    return OpenAIModel("gpt-test", base_url=url, api_key=KEY, **options)


def _responses(url: str, **options: Any) -> Any:
    from polyloop.models.openai_responses import OpenAIResponsesModel

    return OpenAIResponsesModel("o4-mini", base_url=url, api_key=KEY, **options)


def _anthropic(url: str, **options: Any) -> Any:
    from polyloop.models.anthropic import AnthropicModel

    return AnthropicModel("claude-test", base_url=url, api_key=KEY, **options)


def _gemini(url: str, **options: Any) -> Any:
    from polyloop.models.gemini import GeminiModel

    return GeminiModel("gemini-test", base_url=url, api_key=KEY, **options)


# The google.rpc status Gemini sends with each HTTP status.
_GRPC_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def _openai_error(status: int, message: str, headers: tuple[tuple[str, str], ...]) -> Reply:
    return openai.error(status, message, headers=headers)


def _gemini_error(status: int, message: str, headers: tuple[tuple[str, str], ...]) -> Reply:
    return gemini.error(status, message, _GRPC_STATUS.get(status, "UNKNOWN"), headers=headers)


def _body_stream(path: str, body: Any) -> bool:
    return isinstance(body, dict) and body.get("stream") is True


OPENAI = Provider(
    "openai",
    openai.FakeOpenAIServer,
    _openai,
    lambda text, reasoning, stream: (openai.completion_stream if stream else openai.completion)(
        text,
        reasoning_content=reasoning,
        model="gpt-test-2025-04-14",
        cached_tokens=32,
        reasoning_tokens=6,
    ),
    lambda name, arguments, id, stream: (openai.completion_stream if stream else openai.completion)(
        tool_calls=[openai.tool_call(name, json.dumps(arguments), id)], id=f"chatcmpl-{id}"
    ),
    lambda: openai.server_error(503),
    lambda: openai.error_chunk("The server is overloaded.", type="server_error"),
    lambda stream: (openai.completion_stream if stream else openai.completion)(
        "I cannot", finish_reason="content_filter"
    ),
    _body_stream,
    http_error=_openai_error,
    too_long=openai.context_length_exceeded,
    malformed=openai.malformed_json,
    wrong_shape=lambda: Reply(body=b'{"id": "x", "object": "chat.completion"}'),
    dropped=openai.dropped_connection,
    sdk_error="openai.OpenAIError",
    timeout_error="openai.APITimeoutError",
)

RESPONSES = Provider(
    "openai-responses",
    openai.FakeOpenAIServer,
    _responses,
    lambda text, reasoning, stream: (responses.response_stream if stream else responses.response)(
        *((responses.reasoning(reasoning),) if reasoning else ()),
        responses.message(text),
        cached_tokens=32,
        model="o4-mini-2025-04-16",
    ),
    lambda name, arguments, id, stream: (
        responses.response_stream if stream else responses.response
    )(responses.function_call(name, json.dumps(arguments), id), id=f"resp_{id}"),
    lambda: openai.server_error(503),
    lambda: responses.error_event("The server is overloaded.", code="server_error"),
    lambda stream: (responses.response_stream if stream else responses.response)(
        responses.message("I cannot"), status="incomplete", incomplete="content_filter"
    ),
    _body_stream,
    http_error=_openai_error,
    too_long=openai.context_length_exceeded,
    malformed=openai.malformed_json,
    wrong_shape=lambda: Reply(body=b'{"id": "resp_x", "object": "response"}'),
    dropped=openai.dropped_connection,
    sdk_error="openai.OpenAIError",
    timeout_error="openai.APITimeoutError",
)

ANTHROPIC = Provider(
    "anthropic",
    anthropic.FakeAnthropicServer,
    _anthropic,
    lambda text, reasoning, stream: (anthropic.message_stream if stream else anthropic.message)(
        *((anthropic.thinking(reasoning),) if reasoning else ()),
        anthropic.text(text),
        model="claude-test-20250929",
        usage={"cache_read_input_tokens": 40, "output_tokens_details": {"thinking_tokens": 6}},
    ),
    lambda name, arguments, id, stream: (anthropic.message_stream if stream else anthropic.message)(
        anthropic.tool_use(name, arguments, id), id=f"msg_{id}"
    ),
    lambda: anthropic.error(529, "Overloaded"),
    lambda: anthropic.error_event(529, "Overloaded"),
    lambda stream: (anthropic.message_stream if stream else anthropic.message)(
        anthropic.text("I cannot"), stop_reason="refusal"
    ),
    _body_stream,
    http_error=lambda status, message, headers: anthropic.error(status, message, headers=headers),
    too_long=lambda: anthropic.error(400, "prompt is too long: 215000 tokens > 200000 maximum"),
    malformed=anthropic.malformed_json,
    wrong_shape=lambda: Reply(body=b'{"id": "msg_x", "type": "message"}'),
    dropped=anthropic.dropped_connection,
    sdk_error="anthropic.AnthropicError",
    timeout_error="anthropic.APITimeoutError",
)


def _gemini_streamed(path: str, body: Any) -> bool:
    return path.endswith(":streamGenerateContent?alt=sse")


def _gemini_provider(id: str, aiohttp: bool) -> Provider:
    return Provider(
        id,
        gemini.FakeGeminiServer,
        _gemini,
        lambda text, reasoning, stream: (gemini.generated_stream if stream else gemini.generated)(
            *((gemini.text(reasoning, thought=True),) if reasoning else ()),
            gemini.text(text),
            model_version="gemini-test-001",
        ),
        lambda name, arguments, id, stream: (
            gemini.generated_stream if stream else gemini.generated
        )(gemini.function_call(name, arguments, id=id), response_id=f"resp-{id}"),
        lambda: gemini.error(503, "The model is overloaded.", "UNAVAILABLE"),
        lambda: gemini.error_chunk(503, "The model is overloaded.", "UNAVAILABLE"),
        lambda stream: (gemini.generated_stream if stream else gemini.generated)(
            gemini.text("I cannot"), finish_reason="SAFETY"
        ),
        _gemini_streamed,
        http_error=_gemini_error,
        too_long=gemini.context_too_long,
        malformed=lambda: Reply(body=b'{"candidates": [{"cont'),
        wrong_shape=lambda: Reply(body=b'{"responseId": "r"}'),
        dropped=gemini.dropped,
        aiohttp=aiohttp,
    )


PROVIDERS: tuple[Provider, ...] = (
    OPENAI,
    RESPONSES,
    ANTHROPIC,
    _gemini_provider("gemini", aiohttp=False),
    _gemini_provider("gemini-aiohttp", aiohttp=True),
)
IDS = [p.id for p in PROVIDERS]


def chosen(param: Provider, monkeypatch: pytest.MonkeyPatch) -> Provider:
    """``param`` ready for a test (a test module's ``provider`` fixture, parametrized over
    :data:`PROVIDERS`, returns it): its SDK skipped when not installed, and google-genai's
    HTTP client chosen: aiohttp for ``gemini-aiohttp`` (skipped without it), httpx otherwise."""
    sdk = {"openai": "openai", "openai-responses": "openai", "anthropic": "anthropic"}
    pytest.importorskip(sdk.get(param.id, "google.genai"))
    if param.id.startswith("gemini"):
        if param.aiohttp:
            pytest.importorskip("aiohttp")
        else:
            from google.genai import _api_client

            monkeypatch.setattr(_api_client, "has_aiohttp", False)
    return param
