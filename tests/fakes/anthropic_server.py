"""A scripted Anthropic Messages API server on 127.0.0.1, for driving the real ``anthropic`` SDK.

Each POST to ``/v1/messages`` takes the next scripted :class:`Reply` (in order) and records the
request (decoded JSON body and headers). The bodies follow the shapes Anthropic's API reference
documents for the Message object (``content`` blocks: ``text``, ``thinking``,
``redacted_thinking``, ``tool_use``; ``stop_reason``; ``usage`` with the cache counts) and for
error responses (``{"type": "error", "error": {"type", "message"}, "request_id"}``, with
``error.details.error_code`` where the SDK picks a more specific class by it).

    with FakeAnthropicServer() as fake:
        fake.script(message(text("hi")), rate_limited(retry_after="2"))
        ... AnthropicModel("claude-test", base_url=fake.url) ...
        assert fake.requests[0].body["tool_choice"]["disable_parallel_tool_use"] is True

The HTTP machinery (threads, :class:`Reply` modes ``respond``/``drop``/``hang``, a clean
``stop()``) is the OpenAI fake's; only the recorded shapes differ.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from tests.fakes.openai_server import Received, Reply, _Handler, _Server

__all__ = [
    "FakeAnthropicServer",
    "Received",
    "Reply",
    "dropped_connection",
    "error",
    "hang",
    "malformed_json",
    "message",
    "rate_limited",
    "redacted_thinking",
    "text",
    "thinking",
    "tool_use",
]

# The error type Anthropic's API sends with each status (docs: "HTTP errors").
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _json(status: int, obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(
        status=status,
        body=json.dumps(obj).encode(),
        headers=(("Content-Type", "application/json"), ("request-id", "req_fake"), *headers),
    )


def text(value: str) -> dict[str, Any]:
    """A ``text`` content block."""
    return {"type": "text", "text": value, "citations": None}


def thinking(value: str, signature: str = "sig-fake") -> dict[str, Any]:
    """A ``thinking`` content block (extended thinking), with its signature."""
    return {"type": "thinking", "thinking": value, "signature": signature}


def redacted_thinking(data: str = "encrypted-fake") -> dict[str, Any]:
    """A ``redacted_thinking`` block: encrypted, not readable."""
    return {"type": "redacted_thinking", "data": data}


def tool_use(name: str, input: dict[str, Any], id: str = "toolu_01") -> dict[str, Any]:
    """A ``tool_use`` block; ``input`` is the object the model produced."""
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def message(
    *content: dict[str, Any],
    id: str | None = "msg_01",
    stop_reason: str | None = None,
    usage: dict[str, int] | None = None,
    model: str = "claude-test",
) -> Reply:
    """A Message object (200). ``stop_reason`` defaults to ``tool_use`` when a block calls a
    tool, else ``end_turn``; ``usage`` defaults to 82 in, 17 out, no cache."""
    calls = any(block["type"] == "tool_use" for block in content)
    obj: dict[str, Any] = {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(content),
        "stop_reason": stop_reason or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": 82,
            "output_tokens": 17,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "service_tier": "standard",
            **(usage or {}),
        },
    }
    if id is None:
        del obj["id"]
    return _json(200, obj)


def error(
    status: int,
    message: str,
    *,
    type: str | None = None,
    error_code: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Reply:
    """An error response; ``error_code`` adds ``error.details.error_code``."""
    err: dict[str, Any] = {"type": type or ERROR_TYPES.get(status, "api_error"), "message": message}
    if error_code is not None:
        err["details"] = {"error_code": error_code}
    return _json(status, {"type": "error", "error": err, "request_id": "req_fake"}, headers)


def rate_limited(retry_after: str | None = "2", *, retry_after_ms: str | None = None) -> Reply:
    """429 with ``retry-after`` (seconds or an HTTP date) and/or ``retry-after-ms``."""
    headers: list[tuple[str, str]] = []
    if retry_after is not None:
        headers.append(("retry-after", retry_after))
    if retry_after_ms is not None:
        headers.append(("retry-after-ms", retry_after_ms))
    return error(
        429,
        "This request would exceed the rate limit for your organization of 50 requests "
        "per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
        headers=tuple(headers),
    )


def malformed_json() -> Reply:
    """200 whose body claims to be JSON but is cut short."""
    return Reply(body=b'{"id": "msg_broken", "type": "mess')


def dropped_connection() -> Reply:
    """Headers and half a body, then the socket closes."""
    return Reply(body=message(text("this reply never arrives whole")).body, mode="drop")


def hang() -> Reply:
    """No response until the server stops."""
    return Reply(mode="hang")


@dataclass
class FakeAnthropicServer:
    """The server. ``url`` is the ``base_url`` to give the SDK (no ``/v1``: the SDK adds it)."""

    requests: list[Received] = field(default_factory=list)
    _script: deque[Reply] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: _Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply) -> None:
        """Queue replies, served one per request in order."""
        with self._lock:
            self._script.extend(replies)

    def _take(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            if self._script:
                return self._script.popleft()
        return error(500, "fake server: the script is exhausted")

    def start(self) -> FakeAnthropicServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self  # type: ignore[assignment]  # the handler needs _take and _stopping
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeAnthropicServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
