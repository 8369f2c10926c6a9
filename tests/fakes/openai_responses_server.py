"""Scripted replies in the shapes of OpenAI's Responses API, served by
:class:`tests.fakes.openai_server.FakeOpenAIServer` (it answers any POST, so
``POST /v1/responses`` included, and records each request).

The bodies follow the API reference's response object: ``id``, ``object: "response"``,
``status``, an ``output`` list of ``reasoning`` / ``message`` / ``function_call`` items, and
``usage`` with ``input_tokens``, ``output_tokens`` and
``output_tokens_details.reasoning_tokens``. Error bodies are the same as the chat API's
(``tests.fakes.openai_server.error`` and friends).
"""

from __future__ import annotations

import json
from typing import Any

from tests.fakes.openai_server import Reply

__all__ = ["function_call", "message", "reasoning", "response"]

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


def response(
    *output: dict[str, Any],
    id: str | None = "resp_1",
    usage: tuple[int, int, int] | None = (75, 1186, 1024),
    status: str = "completed",
    error: dict[str, Any] | None = None,
    model: str = "o4-mini",
) -> Reply:
    """A ``response`` object (200). ``usage`` is (input, output, reasoning) tokens, the
    reasoning ones being part of the output ones; None leaves the key out."""
    obj: dict[str, Any] = {
        "id": id,
        "object": "response",
        "created_at": _CREATED,
        "status": status,
        "error": error,
        "incomplete_details": None,
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
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens,
        }
    return Reply(body=json.dumps(obj).encode())
