"""A scripted OpenAI-compatible HTTP server on 127.0.0.1, for driving the real ``openai`` SDK.

Each POST to ``/v1/chat/completions`` takes the next scripted :class:`Reply` (in order) and
records the request (decoded JSON body and headers). The bodies follow the shapes the OpenAI
API reference documents for the chat completion object and for error responses.

    with FakeOpenAIServer() as fake:
        fake.script(completion(text="hi"), rate_limited(retry_after="2"))
        ... OpenAIModel("gpt-test", base_url=fake.url) ...
        assert fake.requests[0].body["parallel_tool_calls"] is False

A request with nothing left in the script gets a 500 saying so. ``stop()`` releases any
request held by :func:`hang` and joins every handler thread, so nothing outlives the test.

``FakeOpenAIServer(strict=True)`` also checks every request the way llama-cpp-python 0.3.x's
server does (see :func:`strict_violation`): a body it would refuse gets its answer, HTTP 500,
and uses up no scripted reply.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, NotRequired

import pydantic
from typing_extensions import TypedDict

__all__ = [
    "FakeOpenAIServer",
    "Received",
    "Reply",
    "completion",
    "context_length_exceeded",
    "dropped_connection",
    "error",
    "hang",
    "malformed_json",
    "rate_limited",
    "server_error",
    "strict_violation",
    "tool_call",
    "unauthorized",
]

_CREATED = 1_741_570_283


@dataclass(frozen=True)
class Reply:
    """One scripted response.

    ``mode``: ``respond`` sends ``status``/``headers``/``body`` whole; ``drop`` sends the
    headers (announcing the full length) and half the body, then closes the socket; ``hang``
    sends nothing until the server stops (for timeouts and cancellation).
    """

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    mode: Literal["respond", "drop", "hang"] = "respond"


@dataclass(frozen=True)
class Received:
    """One request as the server saw it (header names in lowercase)."""

    path: str
    headers: dict[str, str]
    body: Any


def _json(status: int, obj: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(
        status=status,
        body=json.dumps(obj).encode(),
        headers=(("Content-Type", "application/json"), *headers),
    )


def tool_call(name: str, arguments: str, id: str = "call_1") -> dict[str, Any]:
    """A ``tool_calls`` entry; ``arguments`` is the JSON *string* the model produced."""
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(
    text: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    id: str | None = "chatcmpl-1",
    usage: tuple[int, int] | None = (82, 17),
    reasoning_content: str | None = None,
    reasoning: str | None = None,
    model: str = "gpt-test",
) -> Reply:
    """A ``chat.completion`` object (200). ``usage=None`` leaves the ``usage`` key out, as
    some OpenAI-compatible servers do; ``reasoning_content``/``reasoning`` add the extra
    message field that DeepSeek / vLLM / Ollama-style servers return."""
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
                "logprobs": None,
                "finish_reason": "tool_calls" if tool_calls else "stop",
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
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
    return _json(200, obj)


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
    return _json(status, body, headers)


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


def hang() -> Reply:
    """No response until the server stops."""
    return Reply(mode="hang")


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


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        fake = self.server.fake
        headers = {name.lower(): value for name, value in self.headers.items()}
        reply = fake._take(Received(self.path, headers, body))
        self.close_connection = True
        if reply.mode == "hang":
            fake._stopping.wait()
            return
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if reply.mode == "drop":
            self.wfile.write(reply.body[: len(reply.body) // 2])
            self.wfile.flush()
            self.connection.close()
            return
        self.wfile.write(reply.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads: a clean shutdown
    block_on_close = True
    fake: FakeOpenAIServer


@dataclass
class FakeOpenAIServer:
    """The server. ``url`` is the ``base_url`` to give the SDK (ends in ``/v1``)."""

    requests: list[Received] = field(default_factory=list)
    strict: bool = field(default=False, kw_only=True)
    """Refuse, as llama-cpp-python 0.3.x does, requests whose shape it does not accept."""
    _script: deque[Reply] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: _Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        """Queue replies, served one per request in order."""
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def _take(self, received: Received) -> Reply:
        violation = strict_violation(received.body) if self.strict else None
        with self._lock:
            self.requests.append(received)
            if violation is not None:
                return _refused(violation)
            if self._script:
                return self._script.popleft()
        return error(500, "fake server: the script is exhausted", type="server_error")

    def start(self) -> FakeOpenAIServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
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

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
