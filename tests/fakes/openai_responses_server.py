"""Scripted replies in the shapes of OpenAI's Responses API, served by
:class:`tests.fakes.openai_server.FakeOpenAIServer` (it answers any POST, so
``POST /v1/responses`` included, and records each request).

The bodies follow the API reference's response object: ``id``, ``object: "response"``,
``status``, an ``output`` list of ``reasoning`` / ``message`` / ``function_call`` items, and
``usage`` with ``input_tokens``, ``output_tokens`` and
``output_tokens_details.reasoning_tokens``. Error bodies are the same as the chat API's
(``tests.fakes.openai_server.error`` and friends). :func:`response_stream` streams the
response as the API's server-sent events (``response.created`` ... ``response.completed``),
:func:`error_event` is the ``error`` event of a stream that fails mid-way.
"""

from __future__ import annotations

import json
from typing import Any

from tests.fakes._server import SSE_HEADERS, Reply, pieces, sse

__all__ = [
    "error_event",
    "function_call",
    "message",
    "reasoning",
    "response",
    "response_stream",
]

_CREATED = 1_741_476_542


def message(text: str, *, id: str = "msg_1", refusal: str | None = None) -> dict[str, Any]:
    """An assistant ``message`` output item with one ``output_text`` part (and a ``refusal``
    part when given)."""
    content: list[dict[str, Any]] = [
        {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    ]
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {
        "type": "message",
        "id": id,
        "status": "completed",
        "role": "assistant",
        "content": content,
    }


def reasoning(*summaries: str, id: str = "rs_1") -> dict[str, Any]:
    """A ``reasoning`` output item with one ``summary_text`` part per summary."""
    return {
        "type": "reasoning",
        "id": id,
        "summary": [{"type": "summary_text", "text": s} for s in summaries],
        "encrypted_content": None,
        "status": None,
    }


def function_call(name: str, arguments: str, call_id: str = "call_1") -> dict[str, Any]:
    """A ``function_call`` output item; ``arguments`` is the JSON *string* the model wrote."""
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def _response(
    *output: dict[str, Any],
    id: str | None = "resp_1",
    usage: tuple[int, int, int] | None = (75, 1186, 1024),
    cached_tokens: int = 0,
    status: str = "completed",
    error: dict[str, Any] | None = None,
    incomplete: str | None = None,
    model: str = "o4-mini",
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "id": id,
        "object": "response",
        "created_at": _CREATED,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete is not None else None,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": list(output),
        "parallel_tool_calls": False,
        "previous_response_id": None,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "metadata": {},
    }
    if id is None:
        del obj["id"]
    if usage is not None:
        input_tokens, output_tokens, reasoning_tokens = usage
        obj["usage"] = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens,
        }
    return obj


def response(*output: dict[str, Any], **options: Any) -> Reply:
    """A ``response`` object (200). Options: ``id`` (None leaves it out), ``usage`` as
    (input, output, reasoning) tokens, the reasoning ones being part of the output ones (None
    leaves the key out), ``cached_tokens`` (part of the input), ``status``, ``error`` (of a
    ``failed`` response), ``incomplete`` (the ``incomplete_details.reason`` of an
    ``incomplete`` one), ``model``."""
    return Reply(body=json.dumps(_response(*output, **options)).encode())


class _Events:
    """The events of one stream, numbered in order."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def add(self, kind: str, **data: Any) -> None:
        event = {"type": kind, "sequence_number": len(self.frames), **data}
        self.frames.append(sse(event, kind))


def _item_events(events: _Events, index: int, item: dict[str, Any], size: int) -> None:
    """The events that stream one output ``item``, from ``output_item.added`` to
    ``output_item.done``."""
    kind = item["type"]
    at = {"item_id": item["id"], "output_index": index}
    if kind == "message":
        events.add(
            "response.output_item.added",
            output_index=index,
            item={**item, "status": "in_progress", "content": []},
        )
        for n, part in enumerate(item["content"]):
            is_text = part["type"] == "output_text"
            field = "text" if is_text else "refusal"
            name = "output_text" if is_text else "refusal"
            empty = {**part, field: ""}
            events.add("response.content_part.added", **at, content_index=n, part=empty)
            extra = {"logprobs": []} if is_text else {}
            for p in pieces(part[field], size):
                events.add(f"response.{name}.delta", **at, content_index=n, delta=p, **extra)
            events.add(
                f"response.{name}.done", **at, content_index=n, **{field: part[field]}, **extra
            )
            events.add("response.content_part.done", **at, content_index=n, part=part)
    elif kind == "reasoning":
        events.add("response.output_item.added", output_index=index, item={**item, "summary": []})
        for n, part in enumerate(item["summary"]):
            empty = {**part, "text": ""}
            events.add("response.reasoning_summary_part.added", **at, summary_index=n, part=empty)
            for p in pieces(part["text"], size):
                events.add("response.reasoning_summary_text.delta", **at, summary_index=n, delta=p)
            events.add(
                "response.reasoning_summary_text.done", **at, summary_index=n, text=part["text"]
            )
            events.add("response.reasoning_summary_part.done", **at, summary_index=n, part=part)
    elif kind == "function_call":
        events.add(
            "response.output_item.added",
            output_index=index,
            item={**item, "status": "in_progress", "arguments": ""},
        )
        for p in pieces(item["arguments"], size):
            events.add("response.function_call_arguments.delta", **at, delta=p)
        events.add(
            "response.function_call_arguments.done",
            **at,
            name=item["name"],
            arguments=item["arguments"],
        )
    events.add("response.output_item.done", output_index=index, item=item)


def response_stream(*output: dict[str, Any], size: int = 4, **options: Any) -> Reply:
    """The reply of :func:`response` (same arguments) as the Responses API streams it:
    ``response.created`` and ``response.in_progress`` (the response with no output yet), each
    output item's events (text, refusals, reasoning summaries and function-call arguments in
    pieces of ``size`` characters), then ``response.completed`` (or ``response.incomplete``
    / ``response.failed``, as the status says) with the whole response."""
    obj = _response(*output, **options)
    events = _Events()
    started = {
        **obj,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
    }
    events.add("response.created", response=started)
    events.add("response.in_progress", response=started)
    for index, item in enumerate(obj["output"]):
        _item_events(events, index, item, size)
    terminal = {
        "completed": "response.completed",
        "incomplete": "response.incomplete",
        "failed": "response.failed",
    }[obj["status"]]
    events.add(terminal, response=obj)
    return Reply(headers=SSE_HEADERS, mode="stream", events=tuple(events.frames))


def error_event(message: str, *, code: str | None = "server_error") -> bytes:
    """The ``error`` event of a Responses stream that fails after it began."""
    data = {"type": "error", "sequence_number": 99, "code": code, "message": message, "param": None}
    return sse(data, "error")
