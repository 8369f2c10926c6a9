"""A scripted Gemini API server on 127.0.0.1, for driving the real ``google-genai`` SDK.

Each POST (``/v1beta/models/{model}:generateContent``, or ``:streamGenerateContent?alt=sse``)
takes the next scripted reply and records the request (the server machinery is
``tests.fakes._server``'s). The bodies follow the shapes the Gemini API reference documents for
``GenerateContentResponse`` (camelCase JSON) and for errors (``google.rpc.Status``:
``{"error": {"code", "message", "status", "details"}}``). :func:`generated_stream` streams a
reply as ``alt=sse`` chunks; :func:`error_chunk` is the chunk of a stream that fails mid-way.

    with FakeGeminiServer() as fake:
        fake.script(generated(text("hi")), rate_limited(retry_delay="20s"))
        ... GeminiModel("gemini-test", base_url=fake.url, api_key="k") ...
"""

from __future__ import annotations

import base64
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
from tests.fakes.openai_server import dropped_connection

__all__ = [
    "FakeGeminiServer",
    "Received",
    "Reply",
    "api_key_invalid",
    "blocked",
    "context_too_long",
    "dropped",
    "error",
    "error_chunk",
    "function_call",
    "generated",
    "generated_stream",
    "hang",
    "rate_limited",
    "text",
]


def _json(status: int, obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return json_reply(status, obj, headers, content_type="application/json; charset=UTF-8")


def text(value: str, *, thought: bool = False) -> dict[str, Any]:
    """A text part; ``thought=True`` marks a thought summary."""
    part: dict[str, Any] = {"text": value}
    if thought:
        part["thought"] = True
    return part


def function_call(
    name: str, args: dict[str, Any], *, id: str | None = None, signature: bytes | None = None
) -> dict[str, Any]:
    """A ``functionCall`` part (``args`` an object, as Gemini sends it), with the base64
    ``thoughtSignature`` thinking models attach."""
    call: dict[str, Any] = {"name": name, "args": args}
    if id is not None:
        call["id"] = id
    part: dict[str, Any] = {"functionCall": call}
    if signature is not None:
        part["thoughtSignature"] = base64.b64encode(signature).decode()
    return part


def _generated(
    *parts: dict[str, Any],
    response_id: str | None = "resp-1",
    usage: dict[str, int] | None = None,
    finish_reason: str = "STOP",
    model_version: str = "gemini-test-001",
    logprobs_result: dict[str, Any] | None = None,
) -> dict[str, Any]:
    counts = (
        usage
        if usage is not None
        else {
            "promptTokenCount": 82,
            "candidatesTokenCount": 17,
            "thoughtsTokenCount": 5,
            "cachedContentTokenCount": 40,
        }
    )
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": list(parts)}, "index": 0}
    if finish_reason:
        candidate["finishReason"] = finish_reason
    if logprobs_result is not None:
        candidate["logprobsResult"] = logprobs_result
    obj: dict[str, Any] = {
        "candidates": [candidate],
        "modelVersion": model_version,
    }
    if counts:
        obj["usageMetadata"] = {
            **counts,
            "totalTokenCount": sum(v for k, v in counts.items() if k != "cachedContentTokenCount"),
            "promptTokensDetails": [
                {"modality": "TEXT", "tokenCount": counts.get("promptTokenCount", 0)}
            ],
        }
    if response_id is not None:
        obj["responseId"] = response_id
    return obj


def generated(*parts: dict[str, Any], **options: Any) -> Reply:
    """A ``GenerateContentResponse`` (200) with one candidate of ``parts``. Options:
    ``response_id``, ``usage`` (default ``promptTokenCount`` 82, ``candidatesTokenCount`` 17,
    ``thoughtsTokenCount`` 5, ``cachedContentTokenCount`` 40), ``finish_reason`` (default
    ``STOP``), ``model_version``, ``logprobs_result`` (the candidate's ``logprobsResult``,
    sent as given)."""
    return _json(200, _generated(*parts, **options))


def generated_stream(*parts: dict[str, Any], size: int = 4, **options: Any) -> Reply:
    """The reply of :func:`generated` (same arguments) as ``streamGenerateContent?alt=sse``
    sends it: one ``data:`` chunk per piece of text (``size`` characters, a thought's pieces
    marked ``thought``) and per function call (whole, as Gemini sends it), each with the
    ``modelVersion``, the ``responseId`` and the usage so far (the prompt's); the last chunk
    has the ``finishReason``, the whole ``usageMetadata`` and the ``logprobsResult`` (when
    there is one). Events end with CRLF, as
    Gemini's do."""
    obj = _generated(*parts, **options)
    candidate = obj["candidates"][0]
    head = {k: obj[k] for k in ("modelVersion", "responseId") if k in obj}
    usage = obj.get("usageMetadata")
    running = (
        {
            "promptTokenCount": usage["promptTokenCount"],
            "totalTokenCount": usage["promptTokenCount"],
        }
        if usage and "promptTokenCount" in usage
        else None
    )
    chunks: list[list[dict[str, Any]]] = []
    for part in candidate["content"]["parts"]:
        if "text" in part:
            chunks += [[{**part, "text": p}] for p in pieces(part["text"], size)]
        else:
            chunks.append([part])
    if not chunks:
        chunks.append([])
    events = []
    for n, chunk_parts in enumerate(chunks):
        last = n == len(chunks) - 1
        entry: dict[str, Any] = {"index": 0}
        if chunk_parts or not last:
            entry["content"] = {"role": "model", "parts": chunk_parts}
        if last and "finishReason" in candidate:
            entry["finishReason"] = candidate["finishReason"]
        if last and "logprobsResult" in candidate:
            entry["logprobsResult"] = candidate["logprobsResult"]
        data: dict[str, Any] = {"candidates": [entry]}
        if (usage if last else running) is not None:
            data["usageMetadata"] = usage if last else running
        events.append(sse({**data, **head}, newline="\r\n"))
    return Reply(headers=SSE_HEADERS, mode="stream", events=tuple(events))


def error_chunk(code: int, message: str, status: str) -> bytes:
    """The chunk Gemini sends when a stream fails after it began: a ``google.rpc.Status``."""
    return sse({"error": {"code": code, "message": message, "status": status}}, newline="\r\n")


def blocked(reason: str = "SAFETY") -> Reply:
    """200 with no candidates: the prompt was blocked."""
    return _json(
        200,
        {
            "promptFeedback": {"blockReason": reason},
            "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
            "modelVersion": "gemini-test-001",
            "responseId": "resp-blocked",
        },
    )


def error(
    code: int,
    message: str,
    status: str,
    *,
    details: list[dict[str, Any]] | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Reply:
    """A ``google.rpc.Status`` error body."""
    body: dict[str, Any] = {"error": {"code": code, "message": message, "status": status}}
    if details is not None:
        body["error"]["details"] = details
    return _json(code, body, headers)


def rate_limited(retry_delay: str | None = "20s", *, retry_after: str | None = None) -> Reply:
    """429 ``RESOURCE_EXHAUSTED`` as Gemini sends it: a ``QuotaFailure`` and a ``RetryInfo``
    with ``retryDelay``; ``retry_after`` adds a ``Retry-After`` header."""
    details: list[dict[str, Any]] = [
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [
                {
                    "quotaMetric": "generativelanguage.googleapis.com/"
                    "generate_content_free_tier_requests",
                    "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                    "quotaValue": "10",
                }
            ],
        },
        {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "Learn more"}]},
    ]
    if retry_delay is not None:
        details.append(
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
        )
    headers = (("Retry-After", retry_after),) if retry_after is not None else ()
    return error(
        429,
        "You exceeded your current quota, please check your plan and billing details.",
        "RESOURCE_EXHAUSTED",
        details=details,
        headers=headers,
    )


def api_key_invalid() -> Reply:
    """Gemini's answer to a wrong key: 400 ``INVALID_ARGUMENT`` with reason
    ``API_KEY_INVALID``."""
    return error(
        400,
        "API key not valid. Please pass a valid API key.",
        "INVALID_ARGUMENT",
        details=[
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID",
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        ],
    )


def context_too_long() -> Reply:
    """400 for an input longer than the model's window, in Gemini's words."""
    return error(
        400,
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        "INVALID_ARGUMENT",
    )


def dropped() -> Reply:
    """Headers and half a body, then the socket closes."""
    return dropped_connection()


@dataclass
class FakeGeminiServer(ScriptedServer):
    """The server. ``url`` is the ``base_url`` to give the SDK (the root: it adds
    ``/v1beta``)."""

    def exhausted(self) -> Reply:
        return error(500, "fake server: the script is exhausted", "INTERNAL")
