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

:func:`message_stream` streams the reply :func:`message` sends whole, as the API's
server-sent events (``message_start`` ... ``message_stop``), and :func:`error_event` is the
``error`` event of a stream that fails mid-way. The HTTP machinery (threads, :class:`Reply`
modes, a clean ``stop()``) is ``tests.fakes._server``'s; only the recorded shapes differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.fakes._server import (
    SSE_HEADERS,
    Received,
    Reply,
    ScriptedServer,
    hang,
    json_reply,
    pieces,
    sse,
)

__all__ = [
    "FakeAnthropicServer",
    "Received",
    "Reply",
    "dropped_connection",
    "error",
    "error_event",
    "hang",
    "malformed_json",
    "message",
    "message_stream",
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
    return json_reply(status, obj, (("request-id", "req_fake"), *headers))


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


def _message(
    *content: dict[str, Any],
    id: str | None = "msg_01",
    stop_reason: str | None = None,
    usage: dict[str, Any] | None = None,
    model: str = "claude-test",
) -> dict[str, Any]:
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
    return obj


def message(*content: dict[str, Any], **options: Any) -> Reply:
    """A Message object (200). Options: ``id`` (None leaves it out), ``stop_reason`` (default
    ``tool_use`` when a block calls a tool, else ``end_turn``), ``usage`` (fields merged over
    82 in, 17 out, no cache; e.g. ``cache_read_input_tokens``, ``output_tokens_details``),
    ``model``."""
    return _json(200, _message(*content, **options))


def _start_block(block: dict[str, Any]) -> dict[str, Any]:
    """A block as ``content_block_start`` announces it: its text, thinking or input empty."""
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": "", "citations": None}
    if kind == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if kind == "tool_use":
        return {**block, "input": {}}
    return block  # redacted_thinking and others arrive whole


def _deltas(block: dict[str, Any], size: int) -> list[dict[str, Any]]:
    kind = block["type"]
    if kind == "text":
        return [{"type": "text_delta", "text": p} for p in pieces(block["text"], size)]
    if kind == "thinking":
        thought = [
            {"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"], size)
        ]
        return [*thought, {"type": "signature_delta", "signature": block["signature"]}]
    if kind == "tool_use":
        arguments = json.dumps(block["input"]) if block["input"] else ""
        return [{"type": "input_json_delta", "partial_json": ""}] + [
            {"type": "input_json_delta", "partial_json": p} for p in pieces(arguments, size)
        ]
    return []


def message_stream(*content: dict[str, Any], size: int = 4, **options: Any) -> Reply:
    """The reply of :func:`message` (same arguments) as the Messages API streams it:
    ``message_start`` (the message with no content, its input usage and 1 output token so
    far), a ``ping``, per block ``content_block_start`` / ``content_block_delta`` (text,
    thinking and tool input JSON in pieces of ``size`` characters, a thinking block's
    signature last) / ``content_block_stop``, ``message_delta`` (the stop reason and the
    output usage) and ``message_stop``."""
    obj = _message(*content, **options)
    usage = obj["usage"]
    start = {**obj, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    start["usage"].pop("output_tokens_details", None)
    events = [
        _event("message_start", {"message": start}),
        _event("ping", {}),
    ]
    for index, block in enumerate(obj["content"]):
        events.append(
            _event("content_block_start", {"index": index, "content_block": _start_block(block)})
        )
        events += [
            _event("content_block_delta", {"index": index, "delta": delta})
            for delta in _deltas(block, size)
        ]
        events.append(_event("content_block_stop", {"index": index}))
    final = {"output_tokens": usage["output_tokens"]}
    if "output_tokens_details" in usage:
        final["output_tokens_details"] = usage["output_tokens_details"]
    events.append(
        _event(
            "message_delta",
            {"delta": {"stop_reason": obj["stop_reason"], "stop_sequence": None}, "usage": final},
        )
    )
    events.append(_event("message_stop", {}))
    return Reply(
        headers=(*SSE_HEADERS, ("request-id", "req_fake")), mode="stream", events=tuple(events)
    )


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return sse({"type": kind, **data}, kind)


def error_event(status: int, message: str, *, type: str | None = None) -> bytes:
    """The ``error`` event the Messages API sends when a stream fails after it began (e.g.
    ``overloaded_error``), typed as the status would be."""
    err = {"type": type or ERROR_TYPES.get(status, "api_error"), "message": message}
    return sse({"type": "error", "error": err, "request_id": "req_fake"}, "error")


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


@dataclass
class FakeAnthropicServer(ScriptedServer):
    """The server. ``url`` is the ``base_url`` to give the SDK (no ``/v1``: the SDK adds it)."""

    def exhausted(self) -> Reply:
        return error(500, "fake server: the script is exhausted")
