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

Not retryable:

* ``auth``: ``AuthenticationError`` (401); ``permission``: ``PermissionDeniedError`` (403);
  ``not_found``: ``NotFoundError`` (404: an unknown model or a wrong base URL);
* ``context_length``: a 4xx whose code or message says the prompt does not fit the model's
  context window (OpenAI's ``context_length_exceeded``, vLLM's, llama.cpp's, Ollama's wording);
* ``bad_request``: any other ``BadRequestError`` (400) or ``UnprocessableEntityError`` (422);
* ``error``: any other ``openai.OpenAIError``, other 4xx statuses included.

A provider's context-length error is kind ``context_length``; the run ends ``llm_error`` (never
``context_overflow``, which is PolyLoop's own ``max_prompt_chars`` check before the call).
Exceptions that are not the SDK's propagate unchanged (the kernel counts them non-retryable);
``asyncio.CancelledError`` always propagates.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

import pydantic

from ..types import (
    ConfigError,
    Message,
    ModelCallError,
    ModelReply,
    ModelRequest,
    Pricing,
    ToolCall,
    Usage,
    import_extra,
)
from ._http import NO_KEY_PLACEHOLDER, api_key_or_placeholder, checked_pricing
from ._http import redact_url as _redact_url
from ._http import retry_after as _retry_after

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["NO_KEY_PLACEHOLDER", "OpenAIModel"]

"""The API key sent to a ``base_url`` on this machine when no key is configured (local servers
such as Ollama or llama.cpp ignore it, but the SDK insists on sending one)."""

_INSTALL_HINT: Final = "the OpenAI adapter needs the openai package: pip install 'polyloop[openai]'"

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
    "BadRequestError": ("bad_request", False),  # or context_length, see _is_context_length
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

_HINTS: Final[Mapping[str, str]] = {
    "auth": "check the API key (api_key= or OPENAI_API_KEY)",
    "permission": "the API key may not use this model or endpoint",
    "not_found": "check the model name and the base URL",
    "connection": "is the server running and the base URL right?",
    "context_length": "the prompt is longer than the model's context window "
    "(Limits.max_prompt_chars stops a run before this)",
}


def _sdk() -> ModuleType:
    """The ``openai`` module, imported on first use (layout.md rule 6)."""
    return import_extra("openai", _INSTALL_HINT)


class OpenAIModel:
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

        pricing: the model's prices (``polyloop.Pricing``), for ``Limits.max_cost``: the
            kernel prices each attempt's reported usage with it. None: cost counts 0.
    Raises:
        ImportError: the ``openai`` package is not installed (one line naming the extra).
        ConfigError: an empty model name, a bad ``timeout_s``/``max_tokens``/``temperature``,
            or no API key for a base URL that is not on this machine.
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
    ) -> None:
        self.pricing = checked_pricing(pricing, type(self).__name__)
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"OpenAIModel needs a model name, e.g. 'gpt-4o-mini'; got {model!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise ConfigError(f"OpenAIModel timeout_s must be a number > 0, got {timeout_s!r}")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0
        ):
            raise ConfigError(f"OpenAIModel max_tokens must be an int > 0, got {max_tokens!r}")
        if temperature is not None and (isinstance(temperature, bool) or temperature < 0):
            raise ConfigError(f"OpenAIModel temperature must be >= 0, got {temperature!r}")
        sdk = _sdk()
        self._sdk = sdk
        self._model = model
        self._temperature = temperature
        self._max_tokens = max_tokens
        self._timeout_s = float(timeout_s)
        self._extra_body = dict(extra_body) if extra_body else None
        self._tool_choice = tool_choice
        self._closed = False
        self._client: AsyncOpenAI
        if client is not None:
            if base_url is not None or api_key is not None:
                raise TypeError(
                    "pass client= or base_url=/api_key=, not both (a client brings its own)"
                )
            self._client = client.with_options(max_retries=0)
            self._owns_client = False
        else:
            base = base_url or os.environ.get("OPENAI_BASE_URL") or None
            key = api_key or os.environ.get("OPENAI_API_KEY") or None
            key = api_key_or_placeholder(key, base, type(self).__name__, "OPENAI_API_KEY")
            self._client = sdk.AsyncOpenAI(
                api_key=key, base_url=base, max_retries=0, timeout=self._timeout_s
            )
            self._owns_client = True

    # -- read-only facts ----------------------------------------------------------------------
    @property
    def model(self) -> str:
        """The model name sent with every request."""
        return self._model

    @property
    def base_url(self) -> str:
        """The API root requests go to (credentials in the URL, if any, shown as ``***``)."""
        return _redact_url(str(self._client.base_url))

    @property
    def client(self) -> AsyncOpenAI:
        """The SDK client in use (with ``max_retries=0``)."""
        return self._client

    @property
    def name(self) -> str:
        """``"openai:MODEL"`` (``"openai-responses:MODEL"`` for the Responses API): the model
        string of ``polyloop run --model``, journaled with every attempt this model makes."""
        return f"{self._PROVIDER}:{self._model}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self._model!r}, base_url={self.base_url!r})"

    # -- the seam -----------------------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelReply:
        """One chat completion for ``request``.

        Returns:
            ``text`` (``message.content``, "" when null), ``reasoning`` (the message's
            ``reasoning_content`` or ``reasoning`` field when the server sends one),
            ``tool_calls`` (arguments kept as the exact string received), ``call_id`` (the
            response's ``id``), ``usage`` (None when the server reported none).

        Raises:
            ModelCallError: the call failed; ``kind`` and ``retryable`` per the module table.

        Nothing is retried here; a failed call may have been processed (and billed) by the
        provider or not, and there is no way to know which. It has no other side effect.
        """
        client: Any = self._client
        try:
            response = await client.chat.completions.create(**self._body(request))
        except Exception as exc:
            key = getattr(self._client, "api_key", None)
            translated = _translate(
                exc, self._sdk, self._where(), secret=key if isinstance(key, str) else None
            )
            if translated is None:
                raise
            raise translated from exc
        return _reply(response, self._where())

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": _wire_messages(request.messages),
            "timeout": self._timeout_s,
        }
        if request.tool_specs:
            body["tools"] = list(request.tool_specs)
            body["parallel_tool_calls"] = False
            if self._tool_choice is not None:
                body["tool_choice"] = self._tool_choice
        if self._temperature is not None:
            body["temperature"] = self._temperature
        if self._max_tokens is not None:
            body["max_tokens"] = self._max_tokens
        if self._extra_body is not None:
            body["extra_body"] = self._extra_body
        return body

    def _where(self) -> str:
        return f"{self.base_url} (model {self._model!r})"

    # -- lifetime -----------------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close the client this model built (idempotent); a ``client=`` passed in stays open."""
        if self._owns_client and not self._closed:
            self._closed = True
            await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


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


# -- replies -----------------------------------------------------------------------------------


def _bad_response(where: str, what: str) -> ModelCallError:
    return ModelCallError(f"bad response from {where}: {what}", retryable=True, kind="bad_response")


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _reasoning(message: Any) -> str | None:
    extra = getattr(message, "model_extra", None) or {}
    for key in ("reasoning_content", "reasoning"):
        value = extra.get(key) if key in extra else getattr(message, key, None)
        if isinstance(value, str) and value:
            return value
    return None


def _tool_call(raw: Any, where: str) -> ToolCall:
    fn = getattr(raw, "function", None)
    if fn is not None:
        name, arguments = getattr(fn, "name", None), getattr(fn, "arguments", None)
    else:  # a "custom" tool call (free-form input) from newer servers
        custom = getattr(raw, "custom", None)
        name, arguments = getattr(custom, "name", None), getattr(custom, "input", None)
    if not isinstance(name, str):
        raise _bad_response(where, f"a tool call without a function name: {raw!r}")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str | Mapping):
        raise _bad_response(where, f"tool call {name!r} has arguments of type {type(arguments)}")
    call_id = getattr(raw, "id", None)
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) and call_id else None)


def _reply(response: Any, where: str) -> ModelReply:
    """Map a chat completion to a ``ModelReply``. The SDK does not validate response bodies
    (it builds models without checks, and returns a ``str``/``list`` for non-object bodies),
    so every field is checked here; a body of the wrong shape is ``bad_response``."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        shown = repr(response)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise _bad_response(where, f"no choices in the response: {shown}")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise _bad_response(where, "the first choice has no message")
    text = getattr(message, "content", None)
    if text is None:
        text = ""
    elif not isinstance(text, str):
        raise _bad_response(where, f"message content of type {type(text).__name__}")
    calls = tuple(_tool_call(raw, where) for raw in getattr(message, "tool_calls", None) or ())
    response_id = getattr(response, "id", None)
    usage = None
    reported = getattr(response, "usage", None)
    if reported is not None:
        prompt = _count(getattr(reported, "prompt_tokens", None))
        completion = _count(getattr(reported, "completion_tokens", None))
        if prompt is not None or completion is not None:
            usage = Usage(prompt, completion)
    return ModelReply(
        text=text,
        reasoning=_reasoning(message),
        tool_calls=calls,
        call_id=response_id if isinstance(response_id, str) and response_id else None,
        usage=usage,
    )


# -- errors ------------------------------------------------------------------------------------


def _kind_of(exc: BaseException, sdk: ModuleType) -> tuple[str, bool]:
    for cls in type(exc).__mro__:
        entry = _ERROR_KINDS.get(cls.__name__)
        if entry is not None and getattr(sdk, cls.__name__, None) is cls:
            return entry
    return ("error", False)


def _is_context_length(exc: BaseException) -> bool:
    body = getattr(exc, "body", None)
    parts = [str(getattr(exc, "code", None)), getattr(exc, "message", None) or str(exc)]
    if isinstance(body, str):
        parts.append(body)
    elif body is not None:
        try:
            parts.append(json.dumps(body, default=str))
        except (TypeError, ValueError):
            parts.append(str(body))
    text = " ".join(parts).lower()
    return any(phrase in text for phrase in _CONTEXT_LENGTH_PHRASES)


def _describe(exc: BaseException, sdk: ModuleType) -> str:
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__
    if isinstance(exc, sdk.APIConnectionError) and cause is not None and str(cause):
        text += f" ({type(cause).__name__}: {cause})"
    return " ".join(text.split())  # one line


def _translate(
    exc: Exception, sdk: ModuleType, where: str, *, secret: str | None = None
) -> ModelCallError | None:
    """The ``ModelCallError`` for an exception the SDK raised; None if it is not the SDK's.
    ``secret`` (the API key) is masked in the message: some proxies echo the key they refused,
    and the message is journaled."""
    if isinstance(exc, json.JSONDecodeError | pydantic.ValidationError):
        # The SDK decodes a 200 body outside its own error handling: a truncated or invalid
        # JSON body arrives as a bare JSONDecodeError.
        kind, retryable, status = "bad_response", True, None
        message = f"bad response from {where}: {type(exc).__name__}: {_describe(exc, sdk)}"
    elif isinstance(exc, sdk.OpenAIError):
        kind, retryable = _kind_of(exc, sdk)
        status = getattr(exc, "status_code", None)
        status = status if isinstance(status, int) else None
        message = f"{type(exc).__name__} from {where}: {_describe(exc, sdk)}"
    else:
        return None
    if kind == "error" and status is not None and isinstance(exc, sdk.APIStatusError):
        if status >= 500:
            kind, retryable = "server", True
        elif status == 408:
            kind, retryable = "timeout", True
    if (
        kind in ("bad_request", "error")
        and status is not None
        and 400 <= status < 500
        and _is_context_length(exc)
    ):
        kind, retryable = "context_length", False
    retry_after = _retry_after(getattr(exc, "response", None)) if retryable else None
    if kind in _HINTS:
        message += f" ({_HINTS[kind]})"
    if secret and len(secret) >= 8:
        message = message.replace(secret, "***")
    return ModelCallError(message, retryable=retryable, retry_after=retry_after, kind=kind)
