"""``AnthropicModel``: the Model seam over Anthropic's Messages API.

Built on the official ``anthropic`` SDK (extra ``polyloop[anthropic]``), imported lazily: this
module imports without it, and constructing an :class:`AnthropicModel` without it raises a
one-line ``ImportError`` naming the extra.

Every SDK failure is translated here, once, into :class:`~polyloop.ModelCallError` with a
``kind`` (``raise ... from`` keeps the original as ``__cause__``). Retryable:

* ``rate_limit``: ``RateLimitError`` (429) and ``RampLimitExceededError``, with
  ``retry_after`` from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date);
* ``timeout``: ``APITimeoutError``, ``RequestTimeoutError`` (408);
* ``connection``: ``APIConnectionError`` (refused, reset, dropped mid-response) and
  ``ClientClosedRequestError`` (499);
* ``server``: ``InternalServerError`` and its subclasses (``OverloadedError`` 529,
  ``ServiceUnavailableError`` 503, ``GatewayTimeoutError`` 504, ...), any other 5xx,
  honouring ``Retry-After``;
* ``conflict``: ``ConflictError`` (409);
* ``bad_response``: a 200 whose body is not a message (invalid JSON, a wrong shape,
  ``APIResponseValidationError``);
* ``error``: ``RetryableError``, which SDK middleware raises to ask for another attempt.

Not retryable:

* ``auth``: ``AuthenticationError`` (401), and the SDK's credential loading failures
  (``CredentialsError``, ``IdentityTokenFileError``, ``WorkloadIdentityError``);
* ``permission``: ``PermissionDeniedError`` (403), and what billing refuses: 402
  (``PaymentRequiredError`` and its subclasses) and the spend-limit 429s
  (``ContractSpendLimitReachedError``, ``EnforcedSpendLimitReachedError``): waiting does not
  lift a spend limit, so they are not rate limits;
* ``not_found``: ``NotFoundError`` (404: an unknown model or a wrong base URL);
* ``context_length``: a 4xx that says the prompt does not fit the model's context window
  (Anthropic's ``prompt is too long`` / ``exceed context limit``);
* ``bad_request``: any other ``BadRequestError`` (400) and its subclasses,
  ``UnprocessableEntityError`` (422), ``ContentTooLargeError`` (413),
  ``RequestHeaderFieldsTooLargeError`` (431), ``PreconditionFailedError`` (412), and a
  history message this adapter cannot convert;
* ``content_filter``: a reply that ended with ``stop_reason`` ``refusal`` (Anthropic's
  safety classifiers stopped it);
* ``error``: any other ``anthropic.AnthropicError``, other 4xx statuses and 501 included.

With ``stream=True``, the transport's own failures while a stream is read, which the SDK does
not wrap (httpx's ``RemoteProtocolError`` for a connection dropped mid-stream, a
``ReadTimeout``), are ``connection`` and ``timeout``; a stream that ends without its
``message_stop`` event is ``connection`` (retryable: the attempt failed, and what arrived of it
is no reply); an ``error`` event inside the stream is kind by its error type, as the same
error sent as a response would be (``overloaded_error`` and ``api_error`` ``server``,
``rate_limit_error`` ``rate_limit``, ``invalid_request_error`` ``bad_request`` or
``context_length``, ...).

A provider's context-length error is kind ``context_length``; the run ends ``llm_error`` (never
``context_overflow``, which is PolyLoop's own ``max_prompt_chars`` check before the call).
Exceptions that are not the SDK's propagate unchanged (the kernel counts them non-retryable);
``asyncio.CancelledError`` always propagates.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType, SimpleNamespace, TracebackType
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
    check_number,
    import_extra,
    text_nested_deeper,
)
from ._common import (
    Relay,
    add_counts,
    arguments_object,
    bad_response,
    by_status,
    content_filtered,
    cut_off,
    describe,
    drain,
    finish,
    kind_along_mro,
    name_of,
    too_long,
    translating,
    unconvertible,
)
from ._http import (
    NO_KEY_PLACEHOLDER,
    api_key_or_placeholder,
    checked_pricing,
    redact_url,
    retry_after,
    transport_kind,
)

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

__all__ = ["NO_KEY_PLACEHOLDER", "AnthropicModel"]

"""The API key sent to a ``base_url`` on this machine when no key is configured."""

_INSTALL_HINT: Final = (
    "the Anthropic adapter needs the anthropic package: pip install 'polyloop[anthropic]'"
)

# kind and retryability of every exception class the SDK exports, by class name (so an SDK
# version without some of them still works). Resolved along the exception's MRO: the most
# specific class listed wins. A test fails when the SDK exports a class missing from here.
_ERROR_KINDS: Final[Mapping[str, tuple[str, bool]]] = {
    "RateLimitError": ("rate_limit", True),
    "RampLimitExceededError": ("rate_limit", True),
    "ContractSpendLimitReachedError": ("permission", False),
    "EnforcedSpendLimitReachedError": ("permission", False),
    "APITimeoutError": ("timeout", True),
    "RequestTimeoutError": ("timeout", True),
    "APIConnectionError": ("connection", True),
    "ClientClosedRequestError": ("connection", True),
    "InternalServerError": ("server", True),
    "OverloadedError": ("server", True),
    "ServiceUnavailableError": ("server", True),
    "CMEKContextUnavailableError": ("server", True),
    "CMEKKeyUnreachableError": ("server", True),
    "StorageNotReadyError": ("server", True),  # 503: the workspace's storage is connecting
    "GatewayTimeoutError": ("server", True),
    "DeadlineExceededError": ("server", True),  # an alias of GatewayTimeoutError
    "HTTPNotImplementedError": ("error", False),
    "ConflictError": ("conflict", True),
    "APIResponseValidationError": ("bad_response", True),
    "RetryableError": ("error", True),
    "AuthenticationError": ("auth", False),
    "CredentialsError": ("auth", False),
    "IdentityTokenFileError": ("auth", False),
    "WorkloadIdentityError": ("auth", False),
    "PermissionDeniedError": ("permission", False),
    "SandboxEgressRestrictedError": ("permission", False),
    "PaymentRequiredError": ("permission", False),
    "LinkedOrganizationBillingUnavailableError": ("permission", False),
    "LinkedOrganizationSpendLimitReachedError": ("permission", False),
    "OrganizationOnHoldError": ("permission", False),
    "OrganizationTypeNotSupportedError": ("permission", False),
    "ParentOrganizationRequiredError": ("permission", False),
    "WorkspaceHumanReviewDisabledError": ("permission", False),
    "ClaudeCodeKeyCreatorNotMemberError": ("permission", False),
    "CMEKKeyDisabledError": ("permission", False),
    "CMEKKeyNetworkBlockedError": ("permission", False),
    "NotFoundError": ("not_found", False),
    "BadRequestError": ("bad_request", False),  # or context_length, see _translate
    "ClaudeCodeVersionTooOldError": ("bad_request", False),
    "RequestBodyEncodingInvalidError": ("bad_request", False),
    "RequestBodyEncodingUnsupportedError": ("bad_request", False),
    "UnprocessableEntityError": ("bad_request", False),
    "ContentTooLargeError": ("bad_request", False),
    "RequestTooLargeError": ("bad_request", False),  # an alias of ContentTooLargeError
    "RequestBodyTooLargeAfterDecodingError": ("bad_request", False),
    "RequestHeaderFieldsTooLargeError": ("bad_request", False),
    "PreconditionFailedError": ("bad_request", False),
    "APIStatusError": ("error", False),  # other statuses: 5xx -> server, 408 -> timeout
    # Raised only by the SDK's webhook helpers, which this adapter does not use.
    "APIWebhookValidationError": ("error", False),
    "APIError": ("error", False),
    "AnthropicError": ("error", False),
}

# The kind of an error event inside a stream (the response's status is 200), by its error type:
# what the same error sent as a response would be (tests/fakes ERROR_TYPES, by status).
_STREAMED_KINDS: Final[Mapping[str, tuple[str, bool]]] = {
    "overloaded_error": ("server", True),
    "api_error": ("server", True),
    "rate_limit_error": ("rate_limit", True),
    "timeout_error": ("timeout", True),
    "invalid_request_error": ("bad_request", False),
    "request_too_large": ("bad_request", False),
    "authentication_error": ("auth", False),
    "permission_error": ("permission", False),
    "billing_error": ("permission", False),
    "not_found_error": ("not_found", False),
}

# How Anthropic (and compatible proxies) word "the prompt does not fit" (lowercase).
_CONTEXT_LENGTH_PHRASES: Final = (
    "prompt is too long",
    "exceed context limit",
    "context window",
    "context length",
    "context_length_exceeded",
)

_HINTS: Final[Mapping[str, str]] = {
    "auth": "check the API key (api_key= or ANTHROPIC_API_KEY)",
    "permission": "the API key or its organization may not use this model or endpoint, "
    "or may not spend more (billing, spend limits)",
    "not_found": "check the model name and the base URL",
    "connection": "is the server running and the base URL right?",
    "context_length": "the prompt is longer than the model's context window "
    "(Limits.max_prompt_chars stops a run before this)",
}

_TOOL_CHOICES: Final[Mapping[str, str]] = {
    "auto": "auto",
    "any": "any",
    "required": "any",
    "none": "none",
}

# Thinking blocks kept to send back with their tool calls (see the class docstring): per run,
# those of its latest replies (only the latest matters to the API); and the runs most recently
# called, so that a batch of concurrent runs on one model does not evict its members' blocks.
_THINKING_KEPT: Final = 32
_RUNS_KEPT: Final = 1024


def _sdk() -> ModuleType:
    """The ``anthropic`` module, imported on first use (layout.md rule 6)."""
    return import_extra("anthropic", _INSTALL_HINT)


class AnthropicModel:
    """The Model seam over Anthropic's Messages API (``POST /v1/messages``).

    The request: PolyLoop's context is OpenAI chat format; it is converted here.
    ``system`` (and ``developer``) messages become the top-level ``system`` text (joined with
    a blank line, in order); user text and image parts become content blocks (an
    ``image_url`` part becomes an ``image`` block, a ``data:`` URL as base64); an assistant
    message's ``tool_calls`` become ``tool_use`` blocks (JSON-string arguments decoded; an
    argument string that is not a JSON object, or too deep, is sent as ``{}``: the model cannot
    have meant anything else to run); a ``tool`` message becomes a ``tool_result`` block
    referencing its ``tool_call_id``. Consecutive messages of one role are merged into one
    message (the API wants user and assistant to alternate, and every ``tool_result`` of a
    turn in the user message that follows it); empty text is left out (the API refuses empty
    text blocks). The request's message dicts are never modified. With tools, each is sent
    as ``{"name", "description", "input_schema"}`` and ``tool_choice`` carries
    ``disable_parallel_tool_use: true`` (the kernel executes one action per step).

    The reply: text blocks joined into ``text``; ``thinking`` blocks joined (blank line
    between) into ``reasoning`` (``redacted_thinking`` is not readable and left out);
    ``tool_use`` blocks into ``tool_calls`` with their ids and ``input`` objects;
    ``call_id`` is the message's ``id``; ``model`` the message's ``model``; ``usage`` is
    ``input_tokens`` plus the cache's ``cache_read_input_tokens`` and
    ``cache_creation_input_tokens`` (Anthropic counts those apart; PolyLoop's input is
    everything the prompt cost), ``cached_tokens`` the cache reads among them,
    ``output_tokens`` (thinking included) and ``reasoning_tokens`` the
    ``output_tokens_details.thinking_tokens`` among them when the API gives them (else None).
    A reply cut by ``max_tokens`` is returned as it came (the interpreter judges it); one
    with ``stop_reason`` ``refusal`` is a ``content_filter`` failure.

    Streaming (``stream=True``): one ``complete`` is one ``POST /v1/messages`` with
    ``stream: true``; the text, thinking and tool-input JSON deltas go to
    ``request.on_delta`` as they arrive (the kernel makes each a ``ModelDelta`` event), and
    the reply is put together from the events: the same reply as without streaming (a tool
    call's ``input`` is its streamed JSON, parsed, or its text if too deep). A stream cut off
    before ``message_stop`` is a failed attempt (kind ``connection``), never a partial reply.
    Off by default.

    Extended thinking (``thinking_budget``) with tools: the API requires the signed thinking
    blocks of a tool-calling reply to come back with it in the next request. PolyLoop's
    context does not carry them, so this model keeps them, by tool_use id, for its recent
    replies and puts them back in front of the matching ``tool_use`` blocks. They are kept
    per run (``request.run_id``): the last 32 tool-calling replies of each of the 1024 runs
    most recently called, so runs sharing one model neither see nor evict each other's. They
    live in memory only: a run resumed in a new process, or one idle while 1024 others were
    called, sends its last tool call without them, and the API may refuse that request
    (``bad_request``).

    The SDK's own retries are off (``max_retries=0``): PolyLoop's
    :class:`~polyloop.RetryPolicy` owns retrying, so every attempt is journaled, counted and
    backed off on PolyLoop's clock. The environment is read here, at construction, never on
    import.

    Args:
        model: the model name, e.g. ``"claude-sonnet-4-5"``.
        base_url: the API root without ``/v1``. Default: ``ANTHROPIC_BASE_URL``, else
            Anthropic's.
        api_key: default ``ANTHROPIC_API_KEY``. When neither is set and the base URL is on
            this machine, :data:`NO_KEY_PLACEHOLDER` is sent. Other credentials the SDK
            knows (auth tokens, profiles, workload identity) go through ``client=``.
        client: an ``anthropic.AsyncAnthropic`` to use instead of building one (then
            ``base_url`` and ``api_key`` must not be given). It is used through a copy with
            ``max_retries=0`` that shares its connection pool and keeps its strict response
            validation (which the SDK's own copy drops); :meth:`aclose` leaves it open.
        max_tokens: the reply's token limit, which the API requires; default 4096. With
            ``thinking_budget`` it must be larger than the budget.
        timeout_s: seconds one call may take.
        thinking_budget: when not None, extended thinking is enabled with this many
            ``budget_tokens`` (the API's minimum is 1024).
        tool_choice: ``"auto"`` (default), ``"any"`` (or ``"required"``), ``"none"``, or a
            mapping such as ``{"type": "tool", "name": "add"}``; sent with the tools.
        extra_body: extra JSON fields merged into every request body (sampling settings such
            as ``temperature`` or ``top_k`` go here: the SDK's ``create`` no longer takes them
            as arguments).
        stream: stream each reply (see above).
        pricing: the model's prices (``polyloop.Pricing``), for ``Limits.max_cost``: the
            kernel prices each attempt's reported usage with it. None: cost counts 0.

    Raises:
        ImportError: the ``anthropic`` package is not installed (one line naming the extra).
        ConfigError: an empty model name, a bad ``timeout_s``/``max_tokens``/
            ``thinking_budget``/``tool_choice``/``stream``, or no API key for a base URL that
            is not on this machine.
        TypeError: ``client`` together with ``base_url`` or ``api_key``.

    Use ``async with AnthropicModel(...) as model:`` or call :meth:`aclose` to close the
    client it built. ``repr()`` never shows the key.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncAnthropic | None = None,
        max_tokens: int = 4096,
        timeout_s: float = 120.0,
        thinking_budget: int | None = None,
        tool_choice: str | Mapping[str, Any] = "auto",
        extra_body: Mapping[str, Any] | None = None,
        pricing: Pricing | None = None,
        stream: bool = False,
    ) -> None:
        name = "AnthropicModel"
        self.pricing = checked_pricing(pricing, name)
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"{name} needs a model name, e.g. 'claude-sonnet-4-5'; got {model!r}")
        if not isinstance(stream, bool):
            raise ConfigError(f"{name} stream must be True or False, got {stream!r}")
        check_number(f"{name} timeout_s", timeout_s, above=True, unit=" of seconds")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigError(f"{name} max_tokens must be an int > 0, got {max_tokens!r}")
        if thinking_budget is not None and (
            isinstance(thinking_budget, bool)
            or not isinstance(thinking_budget, int)
            or not 0 < thinking_budget < max_tokens
        ):
            raise ConfigError(
                f"{name} thinking_budget must be an int > 0 and below max_tokens "
                f"({max_tokens}), got {thinking_budget!r}"
            )
        if isinstance(tool_choice, str):
            if tool_choice not in _TOOL_CHOICES:
                raise ConfigError(
                    f"{name} tool_choice must be 'auto', 'any', 'none' or a mapping, "
                    f"got {tool_choice!r}"
                )
            choice: dict[str, Any] = {"type": _TOOL_CHOICES[tool_choice]}
        elif isinstance(tool_choice, Mapping):
            choice = dict(tool_choice)
        else:
            raise ConfigError(f"{name} tool_choice must be a str or a mapping, got {tool_choice!r}")
        if choice.get("type") != "none":
            choice["disable_parallel_tool_use"] = True
        sdk = _sdk()
        self._sdk = sdk
        self._model = model
        self._max_tokens = max_tokens
        self._timeout_s = float(timeout_s)
        self._thinking_budget = thinking_budget
        self._tool_choice = choice
        self._extra_body = dict(extra_body) if extra_body else None
        self._stream = stream
        # run_id -> (tool_use id -> the thinking blocks of the reply that made it)
        self._thinking: OrderedDict[str, OrderedDict[str, list[dict[str, Any]]]] = OrderedDict()
        self._closed = False
        self._client: AsyncAnthropic
        if client is not None:
            if base_url is not None or api_key is not None:
                raise TypeError(
                    "pass client= or base_url=/api_key=, not both (a client brings its own)"
                )
            self._client = client.with_options(max_retries=0)
            # The SDK's copy drops strict response validation; a strict client stays strict.
            strict = getattr(client, "_strict_response_validation", None)
            if isinstance(strict, bool):
                self._client._strict_response_validation = strict
            self._owns_client = False
        else:
            base = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
            key = api_key or os.environ.get("ANTHROPIC_API_KEY") or None
            key = api_key_or_placeholder(key, base, name, "ANTHROPIC_API_KEY")
            self._client = sdk.AsyncAnthropic(
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
        return redact_url(str(self._client.base_url))

    @property
    def client(self) -> AsyncAnthropic:
        """The SDK client in use (with ``max_retries=0``)."""
        return self._client

    @property
    def stream(self) -> bool:
        """Whether replies are streamed (see the ``stream`` argument)."""
        return self._stream

    @property
    def name(self) -> str:
        """``"anthropic:MODEL"``: the model string of ``polyloop run --model``, journaled with
        every attempt this model makes."""
        return f"anthropic:{self._model}"

    def __repr__(self) -> str:
        return f"AnthropicModel(model={self._model!r}, base_url={self.base_url!r})"

    # -- the seam -----------------------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelReply:
        """One message for ``request`` (see the class docstring for both directions),
        streamed when the model was built with ``stream=True`` (its deltas passed to
        ``request.on_delta``).

        Raises:
            ModelCallError: the call failed; ``kind`` and ``retryable`` per the module table.

        Nothing is retried here; a failed call may have been processed (and billed) by the
        provider or not, and there is no way to know which. The deltas of a streamed attempt
        that then failed belong to no reply.
        """
        client: Any = self._client
        body = self._body(request)
        with translating(self._translate):
            if self._stream:
                events = _Events(self._where(), request.on_delta)
                stream = await client.messages.create(**body, stream=True)
                await drain(stream, events.add)
                response = events.message()
            else:
                response = await client.messages.create(**body)
        reply, thinking = _reply(response, self._where())
        if thinking and reply.tool_calls:
            kept = self._thinking.get(request.run_id)
            if kept is None:
                kept = self._thinking[request.run_id] = OrderedDict()
                if len(self._thinking) > _RUNS_KEPT:
                    self._thinking.popitem(last=False)
            for call in reply.tool_calls:
                if call.id:
                    kept[call.id] = thinking
            while len(kept) > _THINKING_KEPT:
                kept.popitem(last=False)
        return reply

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        where = self._where()
        kept = self._thinking.get(request.run_id)
        if kept is not None:
            self._thinking.move_to_end(request.run_id)
        system, messages = _wire_messages(request.messages, kept or {}, where)
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": self._max_tokens,
            "messages": messages,
            "timeout": self._timeout_s,
        }
        if system:
            body["system"] = system
        if request.tool_specs:
            body["tools"] = [_wire_tool(spec, where) for spec in request.tool_specs]
            if request.tool_choice == "none":
                body["tool_choice"] = {"type": "none"}
            else:
                body["tool_choice"] = self._tool_choice
        if self._thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self._thinking_budget}
        if self._extra_body is not None:
            body["extra_body"] = self._extra_body
        return body

    def _where(self) -> str:
        return f"{self.base_url} (model {self._model!r})"

    def _translate(self, exc: Exception) -> ModelCallError | None:
        key = getattr(self._client, "api_key", None)
        return _translate(
            exc, self._sdk, self._where(), secret=key if isinstance(key, str) else None
        )

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


# -- requests ----------------------------------------------------------------------------------


def _wire_tool(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An OpenAI-format function spec as an Anthropic tool; a spec already in Anthropic's
    shape (with ``input_schema``) is sent as given."""
    if "input_schema" in spec:
        return dict(spec)
    fn = spec.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise unconvertible(where, f"a tool spec without a function name: {spec!r}")
    tool: dict[str, Any] = {
        "name": fn["name"],
        "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
    }
    if fn.get("description"):
        tool["description"] = fn["description"]
    return tool


def _image(url: str) -> dict[str, Any]:
    if url.startswith("data:") and ";base64," in url:
        media_type, _, data = url[5:].partition(";base64,")
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


def _content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, Sequence):
        raise unconvertible(where, f"message content of type {type(content).__name__}")
    blocks: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, str):
            part = {"type": "text", "text": part}
        if not isinstance(part, Mapping):
            raise unconvertible(where, f"a content part of type {type(part).__name__}")
        kind = part.get("type")
        if kind == "text":
            if part.get("text"):
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise unconvertible(where, f"an image_url part without a url: {part!r}")
            blocks.append(_image(url))
        else:  # already an Anthropic block (image, document, ...): sent as given
            blocks.append(dict(part))
    return blocks


def _text_of(content: Any, where: str) -> str:
    return "\n\n".join(
        b["text"] for b in _content_blocks(content, where) if b.get("type") == "text"
    )


def _wire_messages(
    messages: Sequence[Message], thinking: Mapping[str, list[dict[str, Any]]], where: str
) -> tuple[str, list[dict[str, Any]]]:
    """``(system, messages)`` as the Messages API takes them (see the class docstring)."""
    system: list[str] = []
    wire: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(blocks)  # a list this function built
        else:
            wire.append({"role": role, "content": blocks})

    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            if text := _text_of(message.get("content"), where):
                system.append(text)
        elif role == "user":
            add("user", _content_blocks(message.get("content"), where))
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            calls = message.get("tool_calls") or ()
            for call in calls:
                kept = thinking.get(call.get("id") or "")
                if kept is not None:
                    blocks.extend(kept)
                    break
            blocks.extend(_content_blocks(message.get("content"), where))
            for call in calls:
                fn = call.get("function") or {}
                if not isinstance(fn.get("name"), str) or not call.get("id"):
                    raise unconvertible(where, f"a tool call without a name or id: {call!r}")
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": fn["name"],
                        "input": arguments_object(fn.get("arguments")),
                    }
                )
            add("assistant", blocks)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise unconvertible(where, "a tool message without a tool_call_id")
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
            content = message.get("content")
            if isinstance(content, str):
                result["content"] = content
            elif content is not None:
                result["content"] = _content_blocks(content, where)
            add("user", [result])
        else:
            raise unconvertible(where, f"a message with role {role!r}")
    return "\n\n".join(system), wire


# -- replies -----------------------------------------------------------------------------------


def _usage(reported: Any) -> Usage | None:
    if reported is None:
        return None
    parts = [
        getattr(reported, field, None)
        for field in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    ]
    total = add_counts(*parts)
    output = getattr(reported, "output_tokens", None)
    if total is None and output is None:
        return None
    details = getattr(reported, "output_tokens_details", None)
    return Usage(
        total,
        output,
        cached_tokens=parts[1],
        reasoning_tokens=getattr(details, "thinking_tokens", None),
    )


def _reply(response: Any, where: str) -> tuple[ModelReply, list[dict[str, Any]]]:
    """Map a message to a ``ModelReply``, and the thinking blocks to send back with its tool
    calls. The SDK does not validate response bodies, so every field used is checked here;
    a body of the wrong shape is ``bad_response``."""
    content = getattr(response, "content", None)
    if not isinstance(content, list):
        shown = repr(response)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise bad_response(where, f"no content blocks in the response: {shown}")
    if getattr(response, "stop_reason", None) == "refusal":
        raise content_filtered(where, "stop_reason refusal")
    texts: list[str] = []
    reasoning: list[str] = []
    thinking: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    for block in content:
        kind = getattr(block, "type", None)
        if kind == "text":
            text = getattr(block, "text", None)
            if not isinstance(text, str):
                raise bad_response(where, f"a text block without text: {block!r}")
            texts.append(text)
        elif kind == "thinking":
            thought = getattr(block, "thinking", None)
            if isinstance(thought, str) and thought:
                reasoning.append(thought)
            thinking.append(
                {
                    "type": "thinking",
                    "thinking": thought or "",
                    "signature": getattr(block, "signature", None) or "",
                }
            )
        elif kind == "redacted_thinking":
            thinking.append({"type": "redacted_thinking", "data": getattr(block, "data", "")})
        elif kind == "tool_use":
            name, arguments = getattr(block, "name", None), getattr(block, "input", None)
            if not isinstance(name, str):
                raise bad_response(where, f"a tool_use block without a name: {block!r}")
            if arguments is None:
                arguments = {}
            elif not isinstance(arguments, Mapping | _Undecoded):
                raise bad_response(
                    where, f"tool_use {name!r} has input of type {type(arguments).__name__}"
                )
            call_id = getattr(block, "id", None)
            arguments = str(arguments) if isinstance(arguments, str) else dict(arguments)
            calls.append(ToolCall(name, arguments, call_id if isinstance(call_id, str) else None))
        # other blocks (server tools' calls and results) are not PolyLoop's to act on
    reply = ModelReply(
        text="".join(texts),
        reasoning="\n\n".join(reasoning) if reasoning else None,
        tool_calls=tuple(calls),
        call_id=name_of(getattr(response, "id", None)),
        usage=_usage(getattr(response, "usage", None)),
        model=name_of(getattr(response, "model", None)),
    )
    return reply, thinking


class _Block:
    """One content block of a streamed message, put together from its deltas."""

    __slots__ = ("pieces", "signature", "start")

    def __init__(self, start: Any) -> None:
        self.start = start
        self.pieces: list[str] = []
        self.signature = getattr(start, "signature", None) or ""

    def whole(self, where: str) -> Any:
        """The block as the message sent whole would hold it."""
        kind = getattr(self.start, "type", None)
        joined = "".join(self.pieces)
        if kind == "text":
            return SimpleNamespace(
                type="text", text=(getattr(self.start, "text", "") or "") + joined
            )
        if kind == "thinking":
            thought = (getattr(self.start, "thinking", "") or "") + joined
            return SimpleNamespace(type="thinking", thinking=thought, signature=self.signature)
        if kind == "tool_use" and joined:
            try:  # too deep to decode: kept as the text received, which the interpreter refuses
                arguments = _Undecoded(joined) if text_nested_deeper(joined) else json.loads(joined)
            except ValueError:
                raise bad_response(
                    where,
                    f"tool_use {getattr(self.start, 'name', None)!r} streamed input "
                    f"that is not JSON: {joined[:200]!r}",
                ) from None
            return SimpleNamespace(
                type="tool_use",
                id=getattr(self.start, "id", None),
                name=getattr(self.start, "name", None),
                input=arguments,
            )
        return self.start  # a tool_use with no input deltas, redacted_thinking, others


class _Undecoded(str):
    """Streamed tool input nested too deeply to decode: the call's arguments, as text."""


_STREAM_DELTAS: Final[Mapping[str, tuple[str, str, str]]] = {
    # delta type: (its text field, the on_delta kind, the separator between blocks)
    "text_delta": ("text", "text", ""),
    "thinking_delta": ("thinking", "reasoning", "\n\n"),
    "input_json_delta": ("partial_json", "tool_call", ""),
}


class _Events:
    """The events of one streamed message, put together into the message sent whole: its id,
    model and input usage from ``message_start``, each block from its start and deltas (each
    delta relayed to ``on_delta`` as it arrives), the stop reason and final usage from
    ``message_delta`` (whose counts are totals that replace the start's)."""

    def __init__(self, where: str, on_delta: Callable[[str, str], None] | None) -> None:
        self.where = where
        self.relay = Relay(on_delta)
        self.head: Any = None
        self.usage: dict[str, Any] = {}
        self.blocks: dict[int, _Block] = {}
        self.stop_reason: Any = None
        self.stopped = False

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        if kind == "content_block_delta":
            delta = getattr(event, "delta", None)
            entry = _STREAM_DELTAS.get(getattr(delta, "type", None) or "")
            index = getattr(event, "index", None)
            block = self.blocks.get(index) if isinstance(index, int) else None
            if block is None:
                return
            if entry is not None:
                piece = getattr(delta, entry[0], None)
                if isinstance(piece, str):
                    block.pieces.append(piece)
                    self.relay(entry[1], piece, index, entry[2])
            elif getattr(delta, "type", None) == "signature_delta":
                block.signature = getattr(delta, "signature", None) or ""
        elif kind == "content_block_start":
            self.blocks[event.index] = _Block(event.content_block)
        elif kind == "message_start":
            self.head = event.message
            self._count(getattr(self.head, "usage", None))
        elif kind == "message_delta":
            self.stop_reason = getattr(getattr(event, "delta", None), "stop_reason", None)
            self._count(getattr(event, "usage", None))
        elif kind == "message_stop":
            self.stopped = True

    def _count(self, usage: Any) -> None:
        for field in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
            "output_tokens_details",
        ):
            value = getattr(usage, field, None)
            if value is not None:
                self.usage[field] = value

    def message(self) -> Any:
        """The message; a stream without ``message_stop`` was cut off."""
        if not self.stopped or self.head is None:
            raise cut_off(self.where, "its message_stop event")
        return SimpleNamespace(
            id=getattr(self.head, "id", None),
            model=getattr(self.head, "model", None),
            content=[self.blocks[i].whole(self.where) for i in sorted(self.blocks)],
            stop_reason=self.stop_reason,
            usage=SimpleNamespace(**self.usage) if self.usage else None,
        )


# -- errors ------------------------------------------------------------------------------------


_ERROR: Final = ("error", False)


def _streamed_kind(body: object) -> tuple[str, bool] | None:
    """The kind of an ``error`` event inside a stream, by its error type (None: unknown)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return _STREAMED_KINDS.get(kind) if isinstance(kind, str) else None


def _translate(
    exc: Exception, sdk: ModuleType, where: str, *, secret: str | None = None
) -> ModelCallError | None:
    """The ``ModelCallError`` for an exception the SDK (or, in a stream, its HTTP transport)
    raised; None if it is neither's. ``secret`` (the API key) is masked in the message, which
    is journaled."""
    shown = describe(exc, with_cause=isinstance(exc, sdk.APIConnectionError))
    status: int | None = None
    if isinstance(exc, json.JSONDecodeError | pydantic.ValidationError):
        kind, retryable = "bad_response", True
        message = f"bad response from {where}: {type(exc).__name__}: {shown}"
    elif isinstance(exc, sdk.AnthropicError):
        kind, retryable = kind_along_mro(exc, sdk, _ERROR_KINDS) or _ERROR
        code = getattr(exc, "status_code", None)
        status = code if isinstance(code, int) else None
        if status is not None and status < 400:  # an error event inside a 200 stream
            streamed = _streamed_kind(getattr(exc, "body", None))
            kind, retryable = streamed or (kind, retryable)
            status = None
        message = f"{type(exc).__name__} from {where}: {shown}"
    elif (entry := transport_kind(exc)) is not None:
        kind, retryable = entry
        message = f"{type(exc).__name__} from {where}: {shown}"
    else:
        return None
    if isinstance(exc, sdk.APIStatusError):  # 501 Not Implemented: no server trouble
        kind, retryable = by_status(kind, retryable, status, not_server=frozenset({501}))
    if isinstance(exc, sdk.APIError) and too_long(exc, kind, status, _CONTEXT_LENGTH_PHRASES):
        kind, retryable = "context_length", False
    wait = retry_after(getattr(exc, "response", None)) if retryable else None
    return finish(message, kind, retryable, wait, hints=_HINTS, secret=secret)
