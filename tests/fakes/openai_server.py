"""A scripted OpenAI-compatible HTTP server on 127.0.0.1, for driving the real ``openai`` SDK.

Each POST to ``/v1/chat/completions`` takes the next scripted :class:`Reply` (in order) and
records the request (decoded JSON body and headers). The bodies follow the shapes the OpenAI
API reference documents for the chat completion object, its streamed chunks
(``chat.completion.chunk`` events ending in ``data: [DONE]``, the usage chunk of
``stream_options.include_usage``) and error responses.

    with FakeOpenAIServer() as fake:
        fake.script(completion(text="hi"), rate_limited(retry_after="2"))
        ... OpenAIModel("gpt-test", base_url=fake.url) ...
        assert fake.requests[0].body["parallel_tool_calls"] is False

:func:`completion_stream` streams the reply :func:`completion` sends whole (same arguments);
``tests.fakes._server.cut`` and ``then`` cut it short or add an error chunk. A request with
nothing left in the script gets a 500 saying so. ``stop()`` releases any request held by
:func:`hang` and joins every handler thread, so nothing outlives the test.

``FakeOpenAIServer(strict=True)`` also checks every request the way llama-cpp-python 0.3.x's
server does (see :func:`strict_violation`): a body it would refuse gets its answer, HTTP 500,
and uses up no scripted reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, NotRequired

import pydantic
from typing_extensions import TypedDict

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
    "FakeOpenAIServer",
    "Received",
    "Reply",
    "completion",
    "completion_stream",
    "context_length_exceeded",
    "dropped_connection",
    "error",
    "error_chunk",
    "hang",
    "malformed_json",
    "rate_limited",
    "server_error",
    "stream_refused",
    "strict_violation",
    "tool_call",
    "unauthorized",
]

_CREATED = 1_741_570_283


def tool_call(name: str, arguments: str, id: str = "call_1") -> dict[str, Any]:
    """A ``tool_calls`` entry; ``arguments`` is the JSON *string* the model produced."""
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _completion(
    text: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    id: str | None = "chatcmpl-1",
    usage: tuple[int, int] | None = (82, 17),
    cached_tokens: int = 0,
    reasoning_tokens: int = 0,
    reasoning_content: str | None = None,
    reasoning: str | None = None,
    model: str = "gpt-test",
    finish_reason: str | None = None,
    logprobs: Any = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text,
        "refusal": None,
        "annotations": [],
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    if reasoning is not None:
        message["reasoning"] = reasoning
    obj: dict[str, Any] = {
        "id": id,
        "object": "chat.completion",
        "created": _CREATED,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }
    if id is None:
        del obj["id"]
    if usage is not None:
        prompt, completion_tokens = usage
        obj["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
    return obj


def completion(text: str | None = None, **options: Any) -> Reply:
    """A ``chat.completion`` object (200). Options: ``tool_calls``, ``id`` (None leaves it
    out), ``usage`` as (prompt, completion) tokens (None leaves the key out, as some
    OpenAI-compatible servers do) with ``cached_tokens`` and ``reasoning_tokens`` for its
    details, ``reasoning_content``/``reasoning`` (the extra message field DeepSeek / vLLM /
    Ollama-style servers return), ``model``, ``finish_reason`` (default ``tool_calls`` or
    ``stop``), ``logprobs`` (the entries of the choice's ``logprobs.content``, sent as given;
    None: ``"logprobs": null``)."""
    return json_reply(200, _completion(text, **options))


def completion_stream(text: str | None = None, *, size: int = 4, **options: Any) -> Reply:
    """The reply of :func:`completion` (same arguments) as OpenAI streams it with
    ``stream_options.include_usage``: a first chunk with the role, the reasoning, text and
    each tool call's arguments in pieces of ``size`` characters (a call's id, type and name
    in its first chunk, at its ``index``), a chunk with the ``finish_reason``, a last chunk
    with no choices and the ``usage`` (when there is one), then ``data: [DONE]``. Every chunk
    carries the response's id, model and fingerprint."""
    obj = _completion(text, **options)
    head = {
        k: obj[k]
        for k in ("id", "created", "model", "service_tier", "system_fingerprint")
        if k in obj
    }
    head["object"] = "chat.completion.chunk"
    usage = obj.get("usage")
    choice = obj["choices"][0]
    message = choice["message"]

    entries = list(choice["logprobs"]["content"]) if choice["logprobs"] else None

    def chunk(delta: dict[str, Any], finish: str | None = None, take: int | None = None) -> bytes:
        lp = None
        if entries is not None and (take is not None or finish is not None):
            n = len(entries) if take is None else take
            lp = {"content": entries[:n], "refusal": None}
            del entries[:n]
        data = {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }
        if usage is not None:
            data["usage"] = None
        return sse(data)

    events = [chunk({"role": "assistant", "content": "" if text else None, "refusal": None})]
    for key in ("reasoning_content", "reasoning"):
        events += [chunk({key: p}) for p in pieces(message.get(key) or "", size)]
    texts = list(pieces(text or "", size))
    per = -(-len(entries) // len(texts)) if entries and texts else 0
    events += [chunk({"content": p}, take=per) for p in texts]
    for index, call in enumerate(message.get("tool_calls") or ()):
        fn = call["function"]
        first = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": fn["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [first]}))
        events += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in pieces(fn["arguments"], size)
        ]
    events.append(chunk({}, choice["finish_reason"]))
    if usage is not None:
        events.append(sse({**head, "choices": [], "usage": usage}))
    events.append(sse("[DONE]"))
    return Reply(headers=SSE_HEADERS, mode="stream", events=tuple(events))


def stream_refused() -> Reply:
    """llama-cpp-python 0.3.x's answer to a streamed request it cannot stream, byte for byte as
    recorded from its server (``--chat_format chatml-function-calling``, a request with tools,
    ``tool_choice`` "auto", and the model choosing a tool call): 200 with the headers of an
    event stream (sse-starlette's), then a body that ends cleanly with no event at all, not
    even ``data: [DONE]``. The server's reason ("Automatic streaming tool choice is not
    supported", a ValueError raised once the response has begun) is only in its own log.
    A streamed reply that chooses to answer in text is streamed normally."""
    headers = (
        ("cache-control", "no-store"),
        ("x-accel-buffering", "no"),
        ("content-type", "text/event-stream; charset=utf-8"),
        ("openai-processing-ms", "5"),
        ("x-request-id", "a9a873860de848ea9aab4cc3ad9e4c53"),
        ("vary", "Origin"),
    )
    return Reply(headers=headers, mode="stream", events=())


def error_chunk(
    message: str, *, type: str = "server_error", code: str | int | None = None
) -> bytes:
    """The event an OpenAI-compatible server sends when a stream fails after it began:
    ``data: {"error": {...}}`` (vLLM's ``code`` is the HTTP status)."""
    return sse({"error": {"message": message, "type": type, "param": None, "code": code}})


def error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Reply:
    """An error response: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return json_reply(status, body, headers)


def rate_limited(retry_after: str | None = "2", *, retry_after_ms: str | None = None) -> Reply:
    """429 with ``Retry-After`` (seconds or an HTTP date) and/or ``retry-after-ms``."""
    headers: list[tuple[str, str]] = []
    if retry_after is not None:
        headers.append(("Retry-After", retry_after))
    if retry_after_ms is not None:
        headers.append(("retry-after-ms", retry_after_ms))
    return error(
        429,
        "Rate limit reached for gpt-test in organization org-fake on requests per min (RPM): "
        "Limit 3, Used 3, Requested 1. Please try again in 20s.",
        type="requests",
        code="rate_limit_exceeded",
        headers=tuple(headers),
    )


def server_error(status: int = 500, retry_after: str | None = None) -> Reply:
    """A 5xx with OpenAI's generic server-error body."""
    headers = (("Retry-After", retry_after),) if retry_after is not None else ()
    return error(
        status,
        "The server had an error while processing your request. Sorry about that!",
        type="server_error",
        headers=headers,
    )


def unauthorized() -> Reply:
    """401 for a wrong key."""
    return error(
        401,
        "Incorrect API key provided: sk-fake***1234. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
        code="invalid_api_key",
    )


def context_length_exceeded() -> Reply:
    """400 ``context_length_exceeded``, exactly as OpenAI sends it."""
    return error(
        400,
        "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130475 tokens. Please reduce the length of the messages.",
        param="messages",
        code="context_length_exceeded",
    )


def malformed_json() -> Reply:
    """200 whose body claims to be JSON but is cut short."""
    return Reply(body=b'{"id": "chatcmpl-broken", "object": "chat.compl')


def dropped_connection() -> Reply:
    """Headers and half a body, then the socket closes."""
    full = completion("this reply never arrives whole").body
    return Reply(body=full, mode="drop")


# --- strict mode: the request shapes llama-cpp-python 0.3.x accepts -----------------------------
# Its server declares the chat request's messages, tools and tool_choice as TypedDicts
# (llama_cpp/llama_types.py) and FastAPI validates the body against them with pydantic; its
# RouteErrorHandler answers any exception, a validation error included, with HTTP 500. These
# are the same shapes, validated the same way (keys not declared are ignored, as there).


class _Function(TypedDict):
    name: str
    arguments: str


class _ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: _Function


class _TextPart(TypedDict):
    type: Literal["text"]
    text: str


class _ImageUrl(TypedDict):
    url: str
    detail: NotRequired[Literal["auto", "low", "high"]]


class _ImagePart(TypedDict):
    type: Literal["image_url"]
    image_url: str | _ImageUrl


class _System(TypedDict):
    role: Literal["system"]
    content: str | None


class _User(TypedDict):
    role: Literal["user"]
    content: str | list[_TextPart | _ImagePart] | None


class _Assistant(TypedDict):
    # content is a string or absent, never null: the field llama-cpp-python refuses.
    role: Literal["assistant"]
    content: NotRequired[str]
    tool_calls: NotRequired[list[_ToolCall]]
    function_call: NotRequired[_Function]


class _Tool(TypedDict):
    role: Literal["tool"]
    content: str | None
    tool_call_id: str


class _FunctionResult(TypedDict):
    role: Literal["function"]
    content: str | None
    name: str


class _ToolFunction(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: dict[str, Any]


class _ToolSpec(TypedDict):
    type: Literal["function"]
    function: _ToolFunction


class _NamedFunction(TypedDict):
    name: str


class _NamedToolChoice(TypedDict):
    type: Literal["function"]
    function: _NamedFunction


class _StrictRequest(TypedDict):
    messages: NotRequired[list[_System | _User | _Assistant | _Tool | _FunctionResult]]
    tools: NotRequired[list[_ToolSpec] | None]
    tool_choice: NotRequired[Literal["none", "auto", "required"] | _NamedToolChoice | None]


_STRICT = pydantic.TypeAdapter(_StrictRequest)


def strict_violation(body: Any) -> str | None:
    """Why llama-cpp-python 0.3.x's server would refuse a chat request ``body`` (the decoded
    JSON), in pydantic's words; None when it would accept it."""
    try:
        _STRICT.validate_python(body)
    except pydantic.ValidationError as exc:
        return str(exc)
    return None


def _refused(violation: str) -> Reply:
    """llama-cpp-python's answer to a request it cannot validate."""
    return error(500, violation, type="internal_server_error")


@dataclass
class FakeOpenAIServer(ScriptedServer):
    """The server. ``url`` is the ``base_url`` to give the SDK (ends in ``/v1``)."""

    ROOT: ClassVar[str] = "/v1"
    strict: bool = field(default=False, kw_only=True)
    """Refuse, as llama-cpp-python 0.3.x does, requests whose shape it does not accept."""

    def exhausted(self) -> Reply:
        return error(500, "fake server: the script is exhausted", type="server_error")

    def _take(self, received: Received) -> Reply:
        violation = strict_violation(received.body) if self.strict else None
        if violation is None:
            return super()._take(received)
        with self._lock:
            self.requests.append(received)
        return _refused(violation)
