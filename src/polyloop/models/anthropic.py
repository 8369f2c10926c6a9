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

What a context-length error ends a run with, and which exceptions propagate: as for every
adapter (:mod:`polyloop.models`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from ..types import (
    ConfigError,
    ModelCallError,
    ModelReply,
    ModelRequest,
    Pricing,
    check_number,
    import_extra,
)
from ._anthropic_replies import Events, reply
from ._anthropic_request import wire_messages, wire_tool
from ._base import Adapter, check_max_tokens, check_model, check_stream, sdk_client
from ._common import drain
from ._errors import ERROR, Failure, by_status, hints, kind_along_mro, translating, translator
from ._http import NO_KEY_PLACEHOLDER, checked_pricing, transport_kind

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

_HINTS: Final = hints(
    "check the API key (api_key= or ANTHROPIC_API_KEY)",
    "the API key or its organization may not use this model or endpoint, "
    "or may not spend more (billing, spend limits)",
)

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


class AnthropicModel(Adapter):
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
        logprobs: must stay False: the Messages API returns no log-probabilities, so
            ``logprobs=True`` is refused (``ConfigError``) rather than ignored.

    Raises:
        ImportError: the ``anthropic`` package is not installed (one line naming the extra).
        ConfigError: an empty model name, a bad ``timeout_s``/``max_tokens``/
            ``thinking_budget``/``tool_choice``/``stream``, ``logprobs=True``, or no API key
            for a base URL that is not on this machine.
        TypeError: ``client`` together with ``base_url`` or ``api_key``.

    Use ``async with AnthropicModel(...) as model:`` or call :meth:`aclose` to close the
    client it built. ``repr()`` never shows the key.
    """

    _PROVIDER = "anthropic"
    _OWNER = "AnthropicModel"

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
        logprobs: bool = False,
    ) -> None:
        name = "AnthropicModel"
        if logprobs is not False:
            raise ConfigError(
                f"AnthropicModel cannot record log-probabilities (logprobs={logprobs!r}): the "
                "Messages API does not return them; leave logprobs off for Anthropic models"
            )
        self.pricing = checked_pricing(pricing, name)
        check_model(name, model, "claude-sonnet-4-5")
        check_stream(name, stream)
        check_number(f"{name} timeout_s", timeout_s, above=True, unit=" of seconds")
        check_max_tokens(name, max_tokens, optional=False)
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
        self._client: AsyncAnthropic
        self._client, self._owns_client = sdk_client(
            sdk.AsyncAnthropic,
            client,
            base_url=base_url,
            api_key=api_key,
            env=("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
            owner=name,
            timeout_s=self._timeout_s,
        )
        if client is not None:
            # The SDK's copy drops strict response validation; a strict client stays strict.
            strict = getattr(client, "_strict_response_validation", None)
            if isinstance(strict, bool):
                self._client._strict_response_validation = strict

    @property
    def client(self) -> AsyncAnthropic:
        """The SDK client in use (with ``max_retries=0``)."""
        return self._client

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
                events = Events(self._where(), request.on_delta)
                stream = await client.messages.create(**body, stream=True)
                await drain(stream, events.add)
                response = events.message()
            else:
                response = await client.messages.create(**body)
        answer, thinking = reply(response, self._where())
        if thinking and answer.tool_calls:
            kept = self._thinking.get(request.run_id)
            if kept is None:
                kept = self._thinking[request.run_id] = OrderedDict()
                if len(self._thinking) > _RUNS_KEPT:
                    self._thinking.popitem(last=False)
            for call in answer.tool_calls:
                if call.id:
                    kept[call.id] = thinking
            while len(kept) > _THINKING_KEPT:
                kept.popitem(last=False)
        return answer

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        where = self._where()
        kept = self._thinking.get(request.run_id)
        if kept is not None:
            self._thinking.move_to_end(request.run_id)
        system, messages = wire_messages(request.messages, kept or {}, where)
        body: dict[str, Any] = {
            "model": self._model,
            "max_tokens": self._max_tokens,
            "messages": messages,
            "timeout": self._timeout_s,
        }
        if system:
            body["system"] = system
        if request.tool_specs:
            body["tools"] = [wire_tool(spec, where) for spec in request.tool_specs]
            if request.tool_choice == "none":
                body["tool_choice"] = {"type": "none"}
            else:
                body["tool_choice"] = self._tool_choice
        if self._thinking_budget is not None:
            body["thinking"] = {"type": "enabled", "budget_tokens": self._thinking_budget}
        if self._extra_body is not None:
            body["extra_body"] = self._extra_body
        return body

    def _translate(self, exc: Exception) -> ModelCallError | None:
        return _translate(exc, self._sdk, self._where(), secret=self._key())


# -- errors ------------------------------------------------------------------------------------


def _streamed_kind(body: object) -> tuple[str, bool] | None:
    """The kind of an ``error`` event inside a stream, by its error type (None: unknown)."""
    error = body.get("error") if isinstance(body, Mapping) else None
    kind = error.get("type") if isinstance(error, Mapping) else None
    return _STREAMED_KINDS.get(kind) if isinstance(kind, str) else None


def _classify(exc: Exception, sdk: ModuleType) -> Failure | None:
    """What an exception of the SDK, or of its HTTP transport in a stream, means (None:
    neither's)."""
    if isinstance(exc, sdk.AnthropicError):
        kind, retryable = kind_along_mro(exc, sdk, _ERROR_KINDS) or ERROR
        code = getattr(exc, "status_code", None)
        status = code if isinstance(code, int) else None
        if status is not None and status < 400:  # an error event inside a 200 stream
            streamed = _streamed_kind(getattr(exc, "body", None))
            kind, retryable = streamed or (kind, retryable)
            status = None
        if isinstance(exc, sdk.APIStatusError):  # 501 Not Implemented: no server trouble
            kind, retryable = by_status(kind, retryable, status, not_server=frozenset({501}))
        said = () if isinstance(exc, sdk.APIError) else None
        return Failure(kind, retryable, status, said, cause=isinstance(exc, sdk.APIConnectionError))
    entry = transport_kind(exc)
    return None if entry is None else Failure(*entry)


_translate: Final = translator(_classify, phrases=_CONTEXT_LENGTH_PHRASES, hints=_HINTS)
