"""``GeminiModel``: the Model seam over Google's Gemini API (``generateContent``).

Built on the official ``google-genai`` SDK (extra ``polyloop[gemini]``), imported lazily: this
module imports without it, and constructing a :class:`GeminiModel` without it raises a one-line
``ImportError`` naming the extra.

Every failure of a call is translated here, once, into :class:`~polyloop.ModelCallError` with
a ``kind`` (``raise ... from`` keeps the original as ``__cause__``). The SDK raises
``google.genai.errors.ClientError`` (4xx) and ``ServerError`` (5xx), both ``APIError`` with the
HTTP ``code``; the kind follows the code. Retryable:

* ``rate_limit``: 429 (``RESOURCE_EXHAUSTED``), with ``retry_after`` from ``Retry-After`` or,
  as Gemini sends it, the body's ``google.rpc.RetryInfo`` ``retryDelay`` (e.g. ``"20s"``);
* ``timeout``: the transport's timeout, and HTTP 408;
* ``connection``: any other transport failure (refused, reset, dropped mid-response), and a
  stream (``stream=True``) that ended before a chunk with a ``finishReason``.

  The SDK runs on one of two HTTP clients and lets their exceptions through: httpx (or its
  fork httpx2, as installed with it: ``TimeoutException``, any other ``TransportError``) and,
  when the ``aiohttp`` package is installed, aiohttp, which it then prefers
  (``ServerTimeoutError`` and a total timeout's ``TimeoutError``; ``ClientConnectionError``,
  ``ClientPayloadError``); both are mapped;
* ``server``: 5xx (``ServerError``), honouring ``Retry-After``;
* ``conflict``: 409 (``ABORTED``);
* ``bad_response``: a 200 whose body is not a ``GenerateContentResponse`` (invalid JSON, a wrong
  shape, ``UnknownApiResponseError``), or a candidate that ended ``MALFORMED_FUNCTION_CALL``.

Not retryable:

* ``auth``: 401, and Gemini's 400 ``API_KEY_INVALID``; ``permission``: 403;
  ``not_found``: 404 (an unknown model or a wrong base URL);
* ``context_length``: a 4xx saying the input has more tokens than the model allows;
* ``bad_request``: any other 400 (``INVALID_ARGUMENT``, ``FAILED_PRECONDITION``) or 422;
* ``content_filter``: a prompt Gemini blocked (``promptFeedback.blockReason``), or a candidate
  that ended for its content policy (``finishReason`` ``SAFETY``, ``RECITATION``,
  ``BLOCKLIST``, ``PROHIBITED_CONTENT``, ``SPII``, ``IMAGE_SAFETY``, ...): not an empty
  reply;
* ``error``: any other ``APIError`` (other 4xx statuses included) and the SDK's errors of
  features this adapter does not use (automatic function calling, interactions).

An error Gemini sends inside a stream (a ``google.rpc.Status`` chunk) is raised by the SDK as
``APIError`` with its code, and mapped by the code as above.

What a context-length error ends a run with, and which exceptions propagate: as for every
adapter (:mod:`polyloop.models`).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, Final

from ..types import (
    ConfigError,
    ModelCallError,
    ModelReply,
    ModelRequest,
    Pricing,
    check_number,
    import_extra,
)
from ._base import Adapter, check_max_tokens, check_model, check_stream
from ._common import drain
from ._errors import (
    KIND_BY_STATUS,
    Failure,
    hints,
    kind_along_mro,
    mentions,
    translating,
    translator,
)
from ._gemini_replies import Chunks, reply
from ._gemini_request import wire_contents, wire_declarations
from ._http import checked_pricing, redact_url, seconds, transport_kind
from ._logprobs import check_logprobs

__all__ = ["GeminiModel"]

_INSTALL_HINT: Final = (
    "the Gemini adapter needs the google-genai package: pip install 'polyloop[gemini]'"
)

# kind and retryability of every exception class google.genai.errors exports, by class name
# (resolved along the MRO, the most specific listed class first). APIError and its subclasses
# are refined by their HTTP code in _translate. A test fails when the SDK exports a class
# missing from here.
_ERROR_KINDS: Final[Mapping[str, tuple[str, bool]]] = {
    "ClientError": ("bad_request", False),  # 4xx: refined by code
    "ServerError": ("server", True),  # 5xx
    "APIError": ("error", False),
    "UnknownApiResponseError": ("bad_response", True),
    # Raised only by automatic function calling and the interactions API, which this
    # adapter does not use; listed so that the decision is explicit.
    "UnknownFunctionCallArgumentError": ("error", False),
    "UnsupportedFunctionError": ("error", False),
    "FunctionInvocationError": ("error", False),
    "ContinuationInterruptedError": ("error", False),
}

# How Gemini (and Vertex AI) word "the input does not fit" (lowercase).
_CONTEXT_LENGTH_PHRASES: Final = (
    "exceeds the maximum number of tokens",
    "input token count",
    "context window",
    "context length",
    "too many tokens",
)

_HINTS: Final = hints("check the API key (api_key=, GOOGLE_API_KEY or GEMINI_API_KEY)")

_SIGNATURES_KEPT: Final = 4096


def _sdk() -> ModuleType:
    """The ``google.genai`` module, imported on first use (layout.md rule 6)."""
    return import_extra("google.genai", _INSTALL_HINT, missing=("google",))


class GeminiModel(Adapter):
    """The Model seam over the Gemini API.

    One ``complete`` is one ``POST {base_url}/v1beta/models/{model}:generateContent``. The
    kernel's OpenAI-format conversation is converted: system messages become
    ``systemInstruction``; user messages ``user`` contents with ``text`` parts; an assistant
    message a ``model`` content with its text and one ``functionCall`` part per tool call
    (``args`` the parsed arguments; arguments not a JSON object, or too deep, are sent as ``{}``);
    tool messages ``functionResponse`` parts (``name`` found from the call they answer,
    ``response`` ``{"result": content}``) in one ``user`` content, consecutive contents of the
    same role merged, as Gemini requires; a user message with no text is left out (Gemini
    refuses an empty text part). The request's messages are never modified.

    Tools are sent as ``functionDeclarations`` with ``parametersJsonSchema`` (the JSON Schema
    as given) and ``toolConfig.functionCallingConfig.mode`` (``function_calling_mode``).
    Gemini has no switch for one function call per turn: a reply with several is passed on
    and the native interpreter refuses it (each call answered, the model asked again).

    ``thinkingConfig.includeThoughts`` is sent (``include_thoughts``), and thought parts become
    the reply's ``reasoning`` (recorded in the step, never sent back). The ``thoughtSignature``
    Gemini attaches to a function call is kept in this object (the last 4096) and sent back
    with that call, as Gemini 3 requires; for a call it did not see (a resumed run in a new
    process) the documented stand-in ``skip_thought_signature_validator`` is sent.

    Function call ids: Gemini's when it gives one (then echoed in the ``functionCall`` and
    ``functionResponse``), else one made here (``gemini_<hex>``, never sent to Gemini).

    The SDK's own retries are off (``HttpRetryOptions(attempts=1)`` on the client and on every
    request, which also stops its implicit transport retries): PolyLoop's
    :class:`~polyloop.RetryPolicy` owns retrying, so every attempt is journaled, counted and
    backed off on PolyLoop's clock.

    Usage: ``input_tokens`` is ``promptTokenCount`` with ``cached_tokens``
    ``cachedContentTokenCount`` a part of it; ``output_tokens`` ``candidatesTokenCount`` plus
    ``thoughtsTokenCount`` (Gemini counts the thoughts beside the candidates; thinking is
    billed as output), with ``reasoning_tokens`` the ``thoughtsTokenCount``. The reply's
    ``model`` is the ``modelVersion`` that answered.

    Streaming (``stream=True``): one ``complete`` is one
    ``POST .../models/{model}:streamGenerateContent?alt=sse`` (``generate_content_stream``);
    text and thought pieces go to ``request.on_delta`` as they arrive, and each function call
    as one ``tool_call`` piece (the JSON of its arguments: Gemini sends a call whole). The
    reply is put together from the chunks: the same reply as without streaming (the usage
    and ``modelVersion`` of the last chunk that has them). A stream that ends before a chunk
    with a ``finishReason`` is a failed attempt (kind ``connection``), never a partial reply.

    The environment is read here, at construction, never on import.

    Args:
        model: the model name, e.g. ``"gemini-2.5-flash"``.
        api_key: default ``GOOGLE_API_KEY``, else ``GEMINI_API_KEY`` (the SDK's order).
        base_url: the API root, default Gemini's (``https://generativelanguage.googleapis.com``).
        temperature: sent when not None.
        max_tokens: sent as ``maxOutputTokens`` when not None.
        timeout_s: seconds one call may take.
        include_thoughts: ask for thought summaries (False for a model without thinking).
        function_calling_mode: ``"AUTO"``, ``"ANY"`` or ``"NONE"``, sent with the tools; None
            leaves ``toolConfig`` out.
        stream: stream each reply (see above). Off by default.
        pricing: the model's prices (``polyloop.Pricing``), for ``Limits.max_cost``: the
            kernel prices each attempt's reported usage with it. None: cost counts 0.
        logprobs: ask for the log-probability of every sampled token
            (``responseLogprobs``); the reply's ``logprobs`` holds them (token, token id,
            logprob, the top candidates), as for ``OpenAIModel(logprobs=True)``. Off by default.
        top_logprobs: with ``logprobs=True``, how many top candidates per position to ask
            for (``logprobs``); None leaves it out.

    Raises:
        ImportError: ``google-genai`` is not installed (one line naming the extra).
        ConfigError: an empty model name, a bad ``timeout_s``/``max_tokens``/``temperature``/
            ``stream``/``logprobs``/``top_logprobs``, or no API key.

    Use ``async with GeminiModel(...) as model:`` or call :meth:`aclose`. ``repr()`` never
    shows the key.
    """

    _PROVIDER = "gemini"
    _OWNER = "GeminiModel"

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float = 120.0,
        include_thoughts: bool = True,
        function_calling_mode: str | None = "AUTO",
        pricing: Pricing | None = None,
        stream: bool = False,
        logprobs: bool = False,
        top_logprobs: int | None = None,
    ) -> None:
        name = "GeminiModel"
        top = check_logprobs(name, logprobs, top_logprobs)
        self._logprobs: int | None = (top or 0) if logprobs else None
        self.pricing = checked_pricing(pricing, name)
        check_model(name, model, "gemini-2.5-flash")
        check_stream(name, stream)
        check_number(f"{name} timeout_s", timeout_s, above=True, unit=" of seconds")
        check_max_tokens(name, max_tokens)
        check_number("GeminiModel temperature", temperature, none="the model's")
        sdk = _sdk()
        self._sdk = sdk
        self._errors: ModuleType = sdk.errors
        self._model = model
        key = (
            api_key or os.environ.get("GOOGLE_API_KEY") or os.environ.get("GEMINI_API_KEY") or None
        )
        if key is None:
            raise ConfigError(
                "GeminiModel has no API key: pass api_key= or set GEMINI_API_KEY "
                "(or GOOGLE_API_KEY)"
            )
        self._api_key = key
        types = sdk.types
        options: dict[str, Any] = {
            "base_url": base_url,
            "timeout": max(1, round(float(timeout_s) * 1000)),
            "retry_options": types.HttpRetryOptions(attempts=1),
        }
        self._http_options = types.HttpOptions(**options)
        self._config: dict[str, Any] = {"http_options": self._http_options}
        if temperature is not None:
            self._config["temperature"] = temperature
        if max_tokens is not None:
            self._config["max_output_tokens"] = max_tokens
        if logprobs:
            self._config["response_logprobs"] = True
            if top is not None:
                self._config["logprobs"] = top
        if include_thoughts:
            self._config["thinking_config"] = types.ThinkingConfig(include_thoughts=True)
        self._mode = function_calling_mode
        self._stream = stream
        self._types: ModuleType = types
        self._last_tools: tuple[Sequence[Mapping[str, Any]], dict[str, Any]] | None = None
        # The HTTP responses each streaming call opened (by task), closed when it ends: the SDK
        # leaves a stream's response open when the stream carries an error chunk. Seen through
        # an httpx response hook; the aiohttp transport has none (it frees them when collected).
        self._opened: dict[asyncio.Task[Any], list[Any]] = {}
        hooks = {"event_hooks": {"response": [self._on_response]}}
        self._client: Any = sdk.Client(
            api_key=key,
            vertexai=False,
            http_options=types.HttpOptions(**options, async_client_args=hooks),
        )
        self._signatures: OrderedDict[str, bytes] = OrderedDict()
        self._owns_client = True

    @property
    def base_url(self) -> str:
        """The API root requests go to (credentials in the URL, if any, shown as ``***``)."""
        url = self._client._api_client._http_options.base_url
        return redact_url(str(url))

    # -- the seam -----------------------------------------------------------------------------
    async def complete(self, request: ModelRequest) -> ModelReply:
        """One ``generateContent`` call for ``request`` (``streamGenerateContent`` when the
        model was built with ``stream=True``, its pieces passed to ``request.on_delta``).

        Returns:
            ``text`` (the non-thought text parts joined), ``reasoning`` (the thought parts
            joined, None when there are none), ``tool_calls`` (``args`` as the mapping
            received), ``call_id`` (the response's ``responseId``), ``usage`` (None when the
            server reported none), ``model`` (the ``modelVersion``).

        Raises:
            ModelCallError: the call failed; ``kind`` and ``retryable`` per the module table.

        Nothing is retried here; a failed call may have been processed (and billed) or not.
        """
        system, wire = wire_contents(request.messages, self._signatures)
        config = dict(self._config)
        if system:
            config["system_instruction"] = system
        if request.tool_specs:
            config.update(self._tools(request.tool_specs))
            if request.tool_choice == "none":
                config["tool_config"] = self._types.ToolConfig(
                    function_calling_config=self._types.FunctionCallingConfig(mode="NONE")
                )
        models = self._client.aio.models
        with translating(self._translate):
            if self._stream:
                chunks = Chunks(self._where(), request.on_delta)
                task = asyncio.current_task()
                opened: list[Any] = []
                if task is not None:
                    self._opened[task] = opened
                try:
                    stream = await models.generate_content_stream(
                        model=self._model, contents=wire, config=config
                    )
                    await drain(stream, chunks.add)
                finally:
                    if task is not None:
                        del self._opened[task]
                    for http_response in opened:
                        await http_response.aclose()
                response = chunks.response()
            else:
                response = await models.generate_content(
                    model=self._model, contents=wire, config=config
                )
            return reply(response, self._where(), self._remember, self._logprobs)

    def _translate(self, exc: Exception) -> ModelCallError | None:
        return _translate(exc, self._errors, self._where(), secret=self._api_key)

    async def _on_response(self, response: Any) -> None:
        """httpx's response hook: note the response for the streaming call that opened it."""
        task = asyncio.current_task()
        opened = self._opened.get(task) if task is not None else None
        if opened is not None:
            opened.append(response)

    def _tools(self, specs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``tools`` and ``tool_config`` for ``specs``, converted once per tool set (a run
        passes the same specs every step)."""
        if self._last_tools is not None and self._last_tools[0] is specs:
            return self._last_tools[1]
        types = self._types
        declarations = [types.FunctionDeclaration(**d) for d in wire_declarations(specs)]
        out: dict[str, Any] = {"tools": [types.Tool(function_declarations=declarations)]}
        if self._mode is not None:
            out["tool_config"] = types.ToolConfig(
                function_calling_config=types.FunctionCallingConfig(mode=self._mode)
            )
        self._last_tools = (specs, out)
        return out

    def _remember(self, call_id: str, signature: bytes) -> None:
        self._signatures[call_id] = signature
        if len(self._signatures) > _SIGNATURES_KEPT:
            self._signatures.popitem(last=False)

    async def _close_client(self) -> None:
        await self._client.aio.aclose()


# -- errors ------------------------------------------------------------------------------------

_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")


def _retry_info(details: Any) -> float | None:
    """``retryDelay`` of a ``google.rpc.RetryInfo`` in an error body, in seconds."""
    error = details.get("error", details) if isinstance(details, Mapping) else None
    items = error.get("details") if isinstance(error, Mapping) else None
    for item in items if isinstance(items, list) else ():
        if isinstance(item, Mapping) and str(item.get("@type", "")).endswith("RetryInfo"):
            match = _DELAY.match(str(item.get("retryDelay", "")))
            if match is not None:
                return seconds(match.group(1))
    return None


def _classify(exc: Exception, errors: ModuleType) -> Failure | None:
    """What an exception of the SDK (``errors``, its ``google.genai.errors``) or of its HTTP
    transport means (None: neither's): an ``APIError`` by its HTTP ``code``."""
    entry = kind_along_mro(exc, errors, _ERROR_KINDS) or transport_kind(exc)
    if entry is None:
        return None
    kind, retryable = entry
    status: int | None = None
    said: tuple[object, ...] | None = None
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if isinstance(exc, errors.APIError) and isinstance(code, int):
        if code in KIND_BY_STATUS:
            kind, retryable = KIND_BY_STATUS[code]
        elif code >= 500:
            kind, retryable = "server", True
        elif 400 <= code < 500:
            kind, retryable = "error", False
        if kind == "bad_request" and mentions(exc, ("api_key_invalid",), details):
            kind = "auth"
        else:
            status, said = code, (details,)
    cause, body = transport_kind(exc) is not None, entry[0] == "bad_response"
    return Failure(kind, retryable, status, said, cause, body, _retry_info(details))


_translate: Final = translator(_classify, phrases=_CONTEXT_LENGTH_PHRASES, hints=_HINTS)
