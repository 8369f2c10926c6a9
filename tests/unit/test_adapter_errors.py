"""The failures every model adapter classifies alike, in one table: each real adapter, through
its provider's SDK, against its localhost fake answering in the provider's own error shapes.
A failure is a ``ModelCallError`` whose ``kind``, ``retryable`` and ``retry_after`` are the
same whichever provider sent it, with a one-line message naming the server and the model.
What only one provider says (Anthropic's spend-limit classes, Gemini's ``retryDelay``, an
error type inside a stream) is tested with that adapter."""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from polyloop import ModelCallError, ModelRequest
from tests.fakes._server import Reply
from tests.fakes.providers import IDS, KEY, PROVIDERS, Provider, chosen, free_port


@pytest.fixture(params=PROVIDERS, ids=IDS)
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    return chosen(request.param, monkeypatch)


def request() -> ModelRequest:
    return ModelRequest("run-1", 0, 1, [{"role": "user", "content": "2+3?"}], [])


async def failure(provider: Provider, url: str, **options: Any) -> ModelCallError:
    model = provider.model(url, **options)
    try:
        with pytest.raises(ModelCallError) as info:
            await model.complete(request())
    finally:
        await model.aclose()
    return info.value


def sdk_class(name: str) -> Any:
    """The class ``name`` (``module.Class``) names."""
    module, _, cls = name.rpartition(".")
    return getattr(importlib.import_module(module), cls)


def status(code: int, message: str, *headers: tuple[str, str]) -> Callable[[Provider], Reply]:
    return lambda p: p.http_error(code, message, headers)


HTML = (("Content-Type", "text/html"),)

# (what, the provider's reply, kind, retryable, retry_after): one table for every adapter.
CASES: list[tuple[str, Callable[[Provider], Reply], str, bool, float | None]] = [
    ("429 Retry-After", status(429, "Slow down", ("Retry-After", "2")), "rate_limit", True, 2.0),
    ("429 ms", status(429, "Slow", ("retry-after-ms", "1500")), "rate_limit", True, 1.5),
    ("429 unreadable", status(429, "Slow down", ("Retry-After", "soon")), "rate_limit", True, None),
    ("429 no header", status(429, "Slow down"), "rate_limit", True, None),
    ("500", status(500, "Internal error"), "server", True, None),
    ("503 Retry-After", status(503, "Unavailable", ("Retry-After", "7")), "server", True, 7.0),
    ("401", status(401, "Invalid API key"), "auth", False, None),
    ("403", status(403, "Not allowed"), "permission", False, None),
    ("404", status(404, "No such model"), "not_found", False, None),
    ("400", status(400, "Invalid value for messages"), "bad_request", False, None),
    ("422", status(422, "Unprocessable"), "bad_request", False, None),
    ("409", status(409, "Conflict"), "conflict", True, None),
    ("408", status(408, "Request timeout"), "timeout", True, None),
    ("418 other status", status(418, "I'm a teapot"), "error", False, None),
    ("context length", lambda p: p.too_long(), "context_length", False, None),
    ("malformed json", lambda p: p.malformed(), "bad_response", True, None),
    ("not json", lambda p: Reply(body=b"<html>", headers=HTML), "bad_response", True, None),
    ("wrong shape", lambda p: p.wrong_shape(), "bad_response", True, None),
    ("dropped mid-response", lambda p: p.dropped(), "connection", True, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "kind", "retryable", "retry_after"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
async def test_each_failure_is_the_same_kind_from_every_adapter(
    provider: Provider,
    reply: Callable[[Provider], Reply],
    kind: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    with provider.server() as fake:
        fake.script(reply(provider))
        err = await failure(provider, fake.url, timeout_s=5)
        model = provider.model(fake.url).model
    assert (err.kind, err.retryable, err.retry_after) == (kind, retryable, retry_after)
    assert fake.url in err.message and model in err.message
    assert "\n" not in err.message
    if kind != "bad_response" and provider.sdk_error is not None:
        assert isinstance(err.__cause__, sdk_class(provider.sdk_error))
    assert len(fake.requests) == 1  # the SDK did not retry on its own


async def test_the_sdk_does_not_retry_on_its_own(provider: Provider) -> None:
    with provider.server() as fake:
        fake.script(provider.overloaded(), provider.answer("never reached"))
        model = provider.model(fake.url)
        try:
            if hasattr(model, "client"):  # google-genai's retries are off per request
                assert model.client.max_retries == 0
            with pytest.raises(ModelCallError):
                await model.complete(request())
        finally:
            await model.aclose()
    assert len(fake.requests) == 1
    assert fake.remaining == 1


async def test_retry_after_as_an_http_date_is_seconds_from_now(provider: Provider) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    with provider.server() as fake:
        fake.script(provider.http_error(429, "Slow down", (("Retry-After", when),)))
        err = await failure(provider, fake.url)
    assert err.kind == "rate_limit"
    assert err.retry_after is not None
    assert 27 <= err.retry_after <= 31


async def test_a_call_that_takes_too_long_is_a_retryable_timeout(provider: Provider) -> None:
    with provider.server() as fake:
        fake.script(Reply(mode="hang"))
        err = await failure(provider, fake.url, timeout_s=0.2)
    assert (err.kind, err.retryable) == ("timeout", True)
    if provider.timeout_error is not None:
        assert type(err.__cause__) is sdk_class(provider.timeout_error)


async def test_an_unreachable_server_is_a_retryable_connection_error(provider: Provider) -> None:
    root = provider.server.ROOT
    err = await failure(provider, f"http://127.0.0.1:{free_port()}{root}")
    assert (err.kind, err.retryable) == ("connection", True)
    # the transport's reason is kept
    assert ("ClientConnectorError" if provider.aiohttp else "ConnectError") in err.message


async def test_a_key_echoed_by_the_server_is_masked_in_the_error(provider: Provider) -> None:
    with provider.server() as fake:
        fake.script(provider.http_error(401, f"invalid key {KEY} for this proxy", ()))
        err = await failure(provider, fake.url)
    assert err.kind == "auth"
    assert KEY not in err.message and "invalid key ***" in err.message


async def test_cancellation_propagates_and_closes_the_connection(provider: Provider) -> None:
    with provider.server() as fake:
        fake.script(Reply(mode="hang"))
        model = provider.model(fake.url)
        try:
            task = asyncio.create_task(model.complete(request()))
            for _ in range(500):
                if fake.requests:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await model.aclose()
        assert fake.requests[0].disconnected.wait(5)
