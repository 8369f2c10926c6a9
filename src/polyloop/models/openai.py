"""``OpenAIModel``: the Model seam over any OpenAI-compatible chat completions server.

Built on the official ``openai`` SDK (extra ``polyloop[openai]``), imported lazily: this module
imports without it, and constructing an :class:`OpenAIModel` without it raises a one-line
``ImportError`` naming the extra. Works with OpenAI and with servers that speak its chat
completions API (vLLM, Ollama, llama.cpp server, LiteLLM proxy, ...) through ``base_url``.

Every SDK failure is translated here, once, into :class:`~polyloop.ModelCallError` with a
``kind`` (``raise ... from`` keeps the original as ``__cause__``). Retryable:

* ``rate_limit``: ``RateLimitError`` (429), with ``retry_after`` from ``retry-after-ms`` or
  ``Retry-After`` (seconds or an HTTP date);
* ``timeout``: ``APITimeoutError``, and HTTP 408;
* ``connection``: ``APIConnectionError`` (refused, reset, dropped mid-response);
* ``server``: ``InternalServerError`` and any other 5xx, honouring ``Retry-After``;
* ``conflict``: ``ConflictError`` (409);
* ``bad_response``: a 200 whose body is not a chat completion (invalid JSON, which the SDK
  raises as a bare ``JSONDecodeError``; a wrong shape; ``APIResponseValidationError``).

With ``stream=True`` a stream that breaks off (the connection dropped, or the server ended it
before any chunk had a ``finish_reason``) is ``connection``, retryable: the attempt failed,
and what arrived of it is no reply. An error the server sends inside the stream
(``data: {"error": {...}}``, which the SDK raises as a bare ``APIError``) is kind by its
``code`` (an HTTP status, as vLLM sends it) or its ``type``/``code`` string
(``server_error`` is ``server``, ``rate_limit_exceeded`` ``rate_limit``,
``context_length_exceeded`` ``context_length``, ...), as the same error sent as a response
would be. A stream that ends cleanly before its first event is the server's refusal to stream
(llama-cpp-python's server answers a tool call under ``tool_choice`` "auto" so): kind
``stream_refused``, retryable, and the model sends every later request whole (see ``stream``).

Not retryable:

* ``auth``: ``AuthenticationError`` (401); ``permission``: ``PermissionDeniedError`` (403);
  ``not_found``: ``NotFoundError`` (404: an unknown model or a wrong base URL);
* ``context_length``: a 4xx whose code or message says the prompt does not fit the model's
  context window (OpenAI's ``context_length_exceeded``, vLLM's, llama.cpp's, Ollama's wording);
* ``bad_request``: any other ``BadRequestError`` (400) or ``UnprocessableEntityError`` (422);
* ``content_filter``: a reply whose ``finish_reason`` is ``content_filter`` (the provider's
  filter withheld or cut it; Azure OpenAI sends it);
* ``error``: any other ``openai.OpenAIError``, other 4xx statuses included.

What a context-length error ends a run with, and which exceptions propagate: as for every
adapter (:mod:`polyloop.models`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from ..types import (
    Message,
    ModelCallError,
    ModelReply,
    ModelRequest,
    Pricing,
    check_number,
    import_extra,
)
from ._base import Adapter, check_max_tokens, check_model, check_stream, sdk_client
from ._common import drain, stream_refused
from ._errors import (
    ERROR,
    KIND_BY_STATUS,
    Failure,
    by_status,
    hints,
    kind_along_mro,
    translating,
    translator,
)
from ._http import NO_KEY_PLACEHOLDER, checked_pricing
from ._logprobs import check_logprobs
from ._openai_replies import Chunks, reply

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["NO_KEY_PLACEHOLDER", "OpenAIModel"]

"""The API key sent to a ``base_url`` on this machine when no key is configured (local servers
such as Ollama or llama.cpp ignore it, but the SDK insists on sending one)."""

_INSTALL_HINT: Final = "the OpenAI adapter needs the openai package: pip install 'polyloop[openai]'"

log = logging.getLogger("polyloop")

# kind and retryability of every exception class the SDK exports, by class name (so an SDK
# version without some of them still works). Resolved along the exception's MRO: the most
# specific class listed wins. A test fails when the SDK exports a class missing from here.
_ERROR_KINDS: Final[Mapping[str, tuple[str, bool]]] = {
    "RateLimitError": ("rate_limit", True),
    "APITimeoutError": ("timeout", True),
    "APIConnectionError": ("connection", True),
    "InternalServerError": ("server", True),
    "ConflictError": ("conflict", True),
    "APIResponseValidationError": ("bad_response", True),
    "AuthenticationError": ("auth", False),
    "OAuthError": ("auth", False),
    "PermissionDeniedError": ("permission", False),
    "NotFoundError": ("not_found", False),
    "BadRequestError": ("bad_request", False),  # or context_length, see _translate
    "UnprocessableEntityError": ("bad_request", False),
    "APIStatusError": ("error", False),  # other statuses: 5xx -> server, 408 -> timeout
    "APIError": ("error", False),
    # Raised only by the SDK's parse()/streaming/websocket helpers, which this adapter does
    # not use; listed so that the decision is explicit.
    "LengthFinishReasonError": ("error", False),
    "ContentFilterFinishReasonError": ("error", False),
    "WebSocketConnectionClosedError": ("error", False),
    "WebSocketQueueFullError": ("error", False),
    "OpenAIError": ("error", False),
}

# The kind of an error sent inside a stream, which has no HTTP status: by its HTTP status when
# its code is one (vLLM), else by its code or type string (OpenAI's).
_BY_CODE: Final[Mapping[str, tuple[str, bool]]] = {
    "server_error": ("server", True),
    "internal_error": ("server", True),
    "internal_server_error": ("server", True),
    "service_unavailable": ("server", True),
    "rate_limit_exceeded": ("rate_limit", True),
    "requests": ("rate_limit", True),
    "tokens": ("rate_limit", True),
    "invalid_api_key": ("auth", False),
    "authentication_error": ("auth", False),
    "permission_error": ("permission", False),
    "model_not_found": ("not_found", False),
    "context_length_exceeded": ("context_length", False),
    "invalid_request_error": ("bad_request", False),
}

# How OpenAI, vLLM, llama.cpp, Ollama and LiteLLM word "the prompt does not fit" (lowercase).
_CONTEXT_LENGTH_PHRASES: Final = (
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "too many tokens",
    "context length",
    "context size",
    "exceed_context_size",
    "prompt is too long",
)

_HINTS: Final = hints("check the API key (api_key= or OPENAI_API_KEY)")


def _sdk() -> ModuleType:
    """The ``openai`` module, imported on first use (layout.md rule 6)."""
    return import_extra("openai", _INSTALL_HINT)


class OpenAIModel(Adapter):
    """The Model seam over an OpenAI-compatible chat completions endpoint.

    One ``complete`` is one ``POST /chat/completions`` with the request's messages and, when
    there are tools, ``tools``, ``tool_choice`` and ``parallel_tool_calls=false`` (the kernel
    executes one action per step). The messages are sent as given, history included, except
    that a message whose ``content`` is null or absent is sent with ``"content": ""``: OpenAI
    accepts both, but llama-cpp-python's server (0.3.x) answers HTTP 500 to an assistant
    message with null content and older servers require the key, so "" is what every
    compatible server takes. The request's message dicts are never modified. Nothing else is
    added: the reply's reasoning is recorded in the step, never sent back (servers differ on
    whether they accept a ``reasoning_content`` field); fields a history message carries
    are passed on as given. The SDK's own retries are off (``max_retries=0``):
    PolyLoop's :class:`~polyloop.RetryPolicy` owns retrying, so every attempt is journaled,
    counted and backed off on PolyLoop's clock; SDK retries would be invisible to all three.

    The environment is read here, at construction, never on import.

    Args:
        model: the model name the server knows, e.g. ``"gpt-4o-mini"`` or ``"qwen2.5:7b"``.
        base_url: the API root, e.g. ``"http://127.0.0.1:8000/v1"``. Default:
            ``OPENAI_BASE_URL``, else OpenAI's.
        api_key: default ``OPENAI_API_KEY``. When neither is set and the base URL is on this
            machine (``localhost``, ``127.0.0.0/8``, ``[::1]``, ``0.0.0.0``),
            :data:`NO_KEY_PLACEHOLDER` is sent instead: local servers need no key. A server
            elsewhere that needs none can be given any string.
        client: an ``openai.AsyncOpenAI`` to use instead of building one (then ``base_url``
            and ``api_key`` must not be given). It is used through a copy with
            ``max_retries=0`` that shares its connection pool, and :meth:`aclose` leaves it
            open: it is the caller's to close.
        temperature: sent when not None.
        max_tokens: sent as ``max_tokens`` when not None (the name every compatible server
            accepts; models that want ``max_completion_tokens`` take it via ``extra_body``).
        timeout_s: seconds one call may take, applied to every call (also through ``client``).
        extra_body: extra JSON fields merged into every request body.
        tool_choice: sent with the tools (``"auto"``, ``"required"``, or a function choice);
            None leaves it out.
        stream: stream each reply (``stream=true`` with ``stream_options.include_usage``)
            and pass its pieces to ``request.on_delta`` as they arrive (text, reasoning, tool
            call arguments: the kernel makes each a ``ModelDelta`` event). ``complete`` still
            returns the one complete reply, the same as without streaming; a stream cut off
            mid-way is a failed attempt (kind ``connection``), never a partial reply. A server
            that refuses to stream (it ends the stream before its first event, as
            llama-cpp-python's server does for a tool call under ``tool_choice`` "auto") fails
            that attempt with kind ``stream_refused`` (retryable: with ``RetryPolicy``'s
            default attempts the step goes on), and this model object sends every request
            after it whole, for the rest of its life (no more ``on_delta`` pieces), saying so
            once in a warning on the ``polyloop`` logger. Off by default.
        pricing: the model's prices (``polyloop.Pricing``), for ``Limits.max_cost``: the
            kernel prices each attempt's reported usage with it. None: cost counts 0.
        logprobs: ask for the log-probability of every sampled token (``logprobs: true``;
            streamed replies too): the reply's ``logprobs`` holds them (``TokenLogprob``:
            token, logprob, the token id where the server gives one, the top alternatives),
            and ``RunResult.logprobs`` has them per attempt. A value of the wrong shape (NaN,
            not a number, more alternatives than asked) fails the attempt as
            ``bad_response``; a server that sends none gives ``logprobs=None``. Off by
            default: then nothing is sent and nothing read.
        top_logprobs: with ``logprobs=True``, how many most likely alternatives to ask for
            at each position (``top_logprobs``; OpenAI takes 0 to 20); None leaves it out.

    Raises:
        ImportError: the ``openai`` package is not installed (one line naming the extra).
        ConfigError: an empty model name, a bad ``timeout_s``/``max_tokens``/``temperature``/
            ``stream``/``logprobs``/``top_logprobs``, or no API key for a base URL that is
            not on this machine.
        TypeError: ``client`` together with ``base_url`` or ``api_key``.

    Use ``async with OpenAIModel(...) as model:`` or call :meth:`aclose` to close the client
    it built. ``repr()`` never shows the key.
    """

    _PROVIDER = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncOpenAI | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
        extra_body: Mapping[str, Any] | None = None,
        tool_choice: str | Mapping[str, Any] | None = "auto",
        pricing: Pricing | None = None,
        stream: bool = False,
        logprobs: bool = False,
        top_logprobs: int | None = None,
    ) -> None:
        owner = type(self).__name__
        top = check_logprobs(owner, logprobs, top_logprobs)
        self._logprobs: int | None = (top or 0) if logprobs else None
        """None: not asked for; else the alternatives asked for (0: none)."""
        self._top_logprobs = top
        self.pricing = checked_pricing(pricing, owner)
        check_model("OpenAIModel", model, "gpt-4o-mini")
        check_stream("OpenAIModel", stream)
        check_number(f"{owner} timeout_s", timeout_s, above=True, unit=" of seconds")
        check_max_tokens("OpenAIModel", max_tokens)
        check_number(f"{owner} temperature", temperature, none="the server's")
        sdk = _sdk()
        self._sdk = sdk
        self._model = model
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._timeout_s = float(timeout_s)
        self._extra_body = dict(extra_body) if extra_body else None
        self._tool_choice = tool_choice
        self._stream = stream
        self._client: AsyncOpenAI
        self._client, self._owns_client = sdk_client(
            sdk.AsyncOpenAI,
            client,
            base_url=base_url,
            api_key=api_key,
            env=("OPENAI_BASE_URL", "OPENAI_API_KEY"),
            owner=owner,
            timeout_s=self._timeout_s,
        )

    @property
    def client(self) -> AsyncOpenAI:
        """The SDK client in use (with ``max_retries=0``)."""
        return self._client

    # -- the seam -----------------------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelReply:
        """One chat completion for ``request``, streamed when the model was built with
        ``stream=True`` (its pieces passed to ``request.on_delta``).

        Returns:
            ``text`` (``message.content``, "" when null), ``reasoning`` (the message's
            ``reasoning_content`` or ``reasoning`` field when the server sends one),
            ``tool_calls`` (arguments kept as the exact string received), ``call_id`` (the
            response's ``id``), ``usage`` (``prompt_tokens``, ``completion_tokens``, and their
            details' ``cached_tokens`` and ``reasoning_tokens``; None when the server reported
            none), ``model`` (the response's ``model``). A streamed reply is the same one.

        Raises:
            ModelCallError: the call failed; ``kind`` and ``retryable`` per the module table.

        Nothing is retried here; a failed call may have been processed (and billed) by the
        provider or not, and there is no way to know which. It has no other side effect.
        The pieces of a streamed attempt already passed to ``on_delta`` before it failed
        belong to no reply.
        """
        client: Any = self._client
        body = self._body(request)
        with translating(self._translate):
            if self._stream:
                chunks = Chunks(self._where(), request.on_delta, self._logprobs)
                stream = await client.chat.completions.create(
                    **body, stream=True, stream_options={"include_usage": True}
                )
                await drain(stream, chunks.add)
                if not chunks.chunks:
                    raise self._stream_refused()
                return chunks.reply()
            response = await client.chat.completions.create(**body)
        return reply(response, self._where(), self._logprobs)

    def _stream_refused(self) -> ModelCallError:
        """The server refused to stream (an event stream with no event): from now on this
        model sends its requests whole; said once, in the log, when it stops streaming."""
        if self._stream:
            self._stream = False
            log.warning(
                "%s refused to stream a reply (an event stream with no event, as "
                "llama-cpp-python's server sends for a tool call under tool_choice 'auto'): "
                "its replies are requested whole from now on; to skip the refused request, "
                "do not stream with this server",
                self._where(),
            )
        return stream_refused(self._where())

    def _translate(self, exc: Exception) -> ModelCallError | None:
        return _translate(exc, self._sdk, self._where(), secret=self._key())

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": _wire_messages(request.messages),
            "timeout": self._timeout_s,
        }
        if request.tool_specs:
            self._add_tools(body, request, list(request.tool_specs), self._tool_choice)
        return self._add_options(body, "max_tokens")

    def _add_tools(
        self, body: dict[str, Any], request: ModelRequest, tools: list[Any], choice: Any
    ) -> None:
        """``tools``, one call at a time, and ``tool_choice``: "none" when the request
        forbids calling them, else ``choice`` (the configured one, as the API spells it;
        None: left out)."""
        body["tools"] = tools
        body["parallel_tool_calls"] = False
        if request.tool_choice == "none":
            body["tool_choice"] = "none"
        elif choice is not None:
            body["tool_choice"] = choice

    def _add_options(self, body: dict[str, Any], max_tokens: str) -> dict[str, Any]:
        """``body`` with the configured temperature, token limit (as the field ``max_tokens``)
        and ``extra_body``."""
        if self._temperature is not None:
            body["temperature"] = self._temperature
        if self._max_tokens is not None:
            body[max_tokens] = self._max_tokens
        if self._extra_body is not None:
            body["extra_body"] = self._extra_body
        if self._logprobs is not None:
            self._ask_logprobs(body)
        return body

    def _ask_logprobs(self, body: dict[str, Any]) -> None:
        """The request fields that ask for log-probabilities (with ``logprobs=True``)."""
        body["logprobs"] = True
        if self._top_logprobs is not None:
            body["top_logprobs"] = self._top_logprobs


def _wire_messages(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as sent: a message whose content is null or absent is replaced by a copy
    with ``"content": ""`` (see the class docstring); all others are the same objects."""
    # One lookup per message: the SDK copies and encodes every message of the request anyway,
    # and the chat context's own messages never need the copy.
    wire = list(messages)
    for i, message in enumerate(wire):
        if message.get("content") is None:
            wire[i] = {**message, "content": ""}
    return wire


# -- errors ------------------------------------------------------------------------------------


def _streamed_kind(body: object) -> tuple[int | None, str, bool] | None:
    """``(status, kind, retryable)`` of an error sent inside a stream (``body`` is its
    ``error`` object), or None when nothing in it says."""
    error = body if isinstance(body, Mapping) else {}
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        return (code, *(KIND_BY_STATUS.get(code) or (("server", True) if code >= 500 else ERROR)))
    for key in (code, kind):
        if isinstance(key, str) and key in _BY_CODE:
            return (None, *_BY_CODE[key])
    return None


def _classify(exc: Exception, sdk: ModuleType) -> Failure | None:
    """What an exception of the SDK means (None: not the SDK's)."""
    if not isinstance(exc, sdk.OpenAIError):
        return None
    kind, retryable = kind_along_mro(exc, sdk, _ERROR_KINDS) or ERROR
    code = getattr(exc, "status_code", None)
    status = code if isinstance(code, int) else None
    streamed = _streamed_kind(getattr(exc, "body", None)) if type(exc) is sdk.APIError else None
    if streamed is not None:
        status, kind, retryable = streamed  # an error sent inside a stream
    if isinstance(exc, sdk.APIStatusError):
        kind, retryable = by_status(kind, retryable, status)
    said = (getattr(exc, "code", None),) if isinstance(exc, sdk.APIError) else None
    cause = isinstance(exc, sdk.APIConnectionError)
    return Failure(kind, retryable, status, said, cause=cause)


_translate: Final = translator(_classify, phrases=_CONTEXT_LENGTH_PHRASES, hints=_HINTS)
