"""Streaming (``stream=True``) in each model adapter, through its real SDK against its localhost
fake serving the provider's recorded event shapes: the streamed reply is the reply sent whole,
its pieces reach ``on_delta`` in order, and a stream that breaks off, errs, stalls or is
cancelled is a failed attempt, never a partial reply. The same for the content filter, whole
or streamed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any, Literal

import pytest

from polyloop import ConfigError, ModelCallError, ModelReply, ModelRequest
from tests.fakes._server import cut
from tests.fakes.providers import ADD_SPEC, IDS, PROVIDERS, Provider, chosen

Deltas = list[tuple[str, str]]


@pytest.fixture(params=PROVIDERS, ids=IDS)
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    return chosen(request.param, monkeypatch)


def request(deltas: Deltas | None = None, tools: bool = False) -> ModelRequest:
    on_delta: Callable[[str, str], None] | None = None
    if deltas is not None:
        on_delta = lambda kind, text: deltas.append((kind, text))  # noqa: E731
    specs = [ADD_SPEC] if tools else []
    return ModelRequest("run-1", 0, 1, [{"role": "user", "content": "2+3?"}], specs, on_delta)


def joined(deltas: Deltas, kind: str) -> str:
    return "".join(text for k, text in deltas if k == kind)


async def complete(provider: Provider, url: str, req: ModelRequest, **options: Any) -> ModelReply:
    model = provider.model(url, **options)
    try:
        reply: ModelReply = await model.complete(req)
    finally:
        await model.aclose()
    return reply


async def failure(provider: Provider, url: str, req: ModelRequest, **options: Any) -> Any:
    with pytest.raises(ModelCallError) as info:
        await complete(provider, url, req, **options)
    return info.value


async def test_a_streamed_answer_is_the_answer_sent_whole_with_its_pieces_in_order(
    provider: Provider,
) -> None:
    text, reasoning = "The capital of France is Paris.", "The user asks about France."
    deltas: Deltas = []
    with provider.server() as fake:
        fake.script(provider.answer(text, reasoning), provider.answer(text, reasoning, stream=True))
        whole = await complete(provider, fake.url, request())
        streamed = await complete(provider, fake.url, request(deltas), stream=True)
        plain, asked = fake.requests
    assert streamed == whole  # text, reasoning, call id, usage with its details, model
    assert (streamed.text, streamed.reasoning) == (text, reasoning)
    assert streamed.usage is not None and streamed.usage.cached_tokens is not None
    assert streamed.model is not None
    assert len(deltas) > 2  # in pieces, as they arrived
    assert joined(deltas, "text") == text and joined(deltas, "reasoning") == reasoning
    assert {kind for kind, _ in deltas} == {"text", "reasoning"}
    assert provider.streamed(asked.path, asked.body)
    assert not provider.streamed(plain.path, plain.body)


async def test_a_streamed_tool_call_is_the_call_sent_whole_with_its_arguments_in_pieces(
    provider: Provider,
) -> None:
    arguments = {"a": 2, "b": 3}
    deltas: Deltas = []
    with provider.server() as fake:
        fake.script(
            provider.call("add", arguments, "call_9"),
            provider.call("add", arguments, "call_9", stream=True),
        )
        whole = await complete(provider, fake.url, request(tools=True))
        streamed = await complete(provider, fake.url, request(deltas, tools=True), stream=True)
    assert streamed == whole
    (call,) = streamed.tool_calls
    assert (call.name, call.id) == ("add", "call_9")
    raw = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    assert json.loads(joined(deltas, "tool_call")) == json.loads(raw) == arguments
    if isinstance(call.arguments, str):  # a provider that streams the string: verbatim
        assert joined(deltas, "tool_call") == call.arguments


async def test_without_on_delta_a_stream_still_gives_the_whole_reply(provider: Provider) -> None:
    with provider.server() as fake:
        fake.script(provider.answer("Paris.", "France.", stream=True))
        reply = await complete(provider, fake.url, request(), stream=True)
    assert (reply.text, reply.reasoning) == ("Paris.", "France.")


@pytest.mark.parametrize("end", ["drop", "complete"])
async def test_a_stream_that_ends_before_its_last_event_is_a_retryable_connection_error(
    provider: Provider, end: Literal["drop", "complete"]
) -> None:
    # drop: the connection breaks mid-body; complete: the server ends the body cleanly, but
    # before the event that finishes the reply. Either way, no partial reply.
    streamed = provider.answer("The capital of France is Paris.", stream=True)
    deltas: Deltas = []
    with provider.server() as fake:
        fake.script(cut(streamed, len(streamed.events) // 2, end))
        err = await failure(provider, fake.url, request(deltas), stream=True)
    assert (err.kind, err.retryable) == ("connection", True)
    assert fake.url.rstrip("/") in err.message and "\n" not in err.message
    assert joined(deltas, "text")  # some of it had been shown
    assert "Paris." not in joined(deltas, "text")


async def test_an_error_sent_inside_the_stream_is_kind_as_the_same_error_sent_whole(
    provider: Provider,
) -> None:
    streamed = provider.answer("The capital of France is Paris.", stream=True)
    with provider.server() as fake:
        fake.script(provider.overloaded(), provider.error_in_stream(streamed, 3))
        whole = await failure(provider, fake.url, request())
        inside = await failure(provider, fake.url, request(), stream=True)
    assert (inside.kind, inside.retryable) == (whole.kind, whole.retryable) == ("server", True)
    assert "overloaded" in inside.message.lower()


async def test_a_stream_that_goes_silent_times_out(provider: Provider) -> None:
    streamed = provider.answer("The capital of France is Paris.", stream=True)
    with provider.server() as fake:
        fake.script(cut(streamed, 3, "stall"))
        err = await failure(provider, fake.url, request(), stream=True, timeout_s=0.3)
    assert (err.kind, err.retryable) == ("timeout", True)


async def test_cancelling_mid_stream_propagates_and_closes_the_connection(
    provider: Provider,
) -> None:
    streamed = provider.answer("The capital of France is Paris.", stream=True)
    shown = asyncio.Event()
    deltas: Deltas = []

    def on_delta(kind: str, text: str) -> None:
        deltas.append((kind, text))
        shown.set()

    req = ModelRequest("run-1", 0, 1, [{"role": "user", "content": "?"}], [], on_delta)
    with provider.server() as fake:
        fake.script(cut(streamed, len(streamed.events) - 2, "stall"))
        model = provider.model(fake.url, stream=True)
        try:
            task = asyncio.create_task(model.complete(req))
            await shown.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            (held,) = fake.requests
            assert await asyncio.to_thread(held.disconnected.wait, 10)
        finally:
            await model.aclose()
    assert deltas


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reply_the_content_filter_stopped_is_a_content_filter_error(
    provider: Provider, stream: bool
) -> None:
    with provider.server() as fake:
        fake.script(provider.filtered(stream))
        err = await failure(provider, fake.url, request(), stream=stream)
    assert (err.kind, err.retryable) == ("content_filter", False)
    assert "\n" not in err.message


@pytest.mark.parametrize("value", [1, "yes", None])
def test_stream_must_be_a_bool(provider: Provider, value: object) -> None:
    with pytest.raises(ConfigError, match="stream must be True or False"):
        provider.model("http://127.0.0.1:9", stream=value)


def test_stream_is_off_by_default(provider: Provider) -> None:
    assert provider.model("http://127.0.0.1:9").stream is False
    assert provider.model("http://127.0.0.1:9", stream=True).stream is True
