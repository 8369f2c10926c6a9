"""A scripted Gemini API server on 127.0.0.1, for driving the real ``google-genai`` SDK.

Each POST (``/v1beta/models/{model}:generateContent``) takes the next scripted reply and records
the request, as :class:`tests.fakes.openai_server.FakeOpenAIServer` does (the same server
machinery). The bodies follow the shapes the Gemini API reference documents for
``GenerateContentResponse`` (camelCase JSON) and for errors (``google.rpc.Status``:
``{"error": {"code", "message", "status", "details"}}``).

    with FakeGeminiServer() as fake:
        fake.script(generated(text("hi")), rate_limited(retry_delay="20s"))
        ... GeminiModel("gemini-test", base_url=fake.url, api_key="k") ...
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from tests.fakes.openai_server import FakeOpenAIServer, Received, Reply, dropped_connection, hang

__all__ = [
    "FakeGeminiServer",
    "Received",
    "Reply",
    "api_key_invalid",
    "blocked",
    "context_too_long",
    "dropped",
    "error",
    "function_call",
    "generated",
    "hang",
    "rate_limited",
    "text",
]


def _json(status: int, obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(
        status=status,
        body=json.dumps(obj).encode(),
        headers=(("Content-Type", "application/json; charset=UTF-8"), *headers),
    )


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


def generated(
    *parts: dict[str, Any],
    response_id: str | None = "resp-1",
    usage: dict[str, int] | None = None,
    finish_reason: str = "STOP",
    model_version: str = "gemini-test-001",
) -> Reply:
    """A ``GenerateContentResponse`` (200) with one candidate of ``parts``. ``usage``
    defaults to ``promptTokenCount`` 82, ``candidatesTokenCount`` 17, ``thoughtsTokenCount`` 5,
    ``cachedContentTokenCount`` 40."""
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
    return _json(200, obj)


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
class FakeGeminiServer(FakeOpenAIServer):
    """The server. ``url`` is the ``base_url`` to give the SDK (the root: it adds
    ``/v1beta``)."""

    @property
    def url(self) -> str:
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _take(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            if self._script:
                return self._script.popleft()
        return error(500, "fake server: the script is exhausted", "INTERNAL")

    def start(self) -> FakeGeminiServer:
        super().start()
        return self

    def __enter__(self) -> FakeGeminiServer:
        return self.start()
