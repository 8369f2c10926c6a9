"""``OpenAIResponsesModel``: the Model seam over OpenAI's Responses API (``POST /responses``).

The API OpenAI recommends for its reasoning models: it returns reasoning summaries, which the
chat completions API does not. Built on the same ``openai`` SDK as
:class:`~polyloop.models.openai.OpenAIModel` (extra ``polyloop[openai]``, imported lazily),
and configured the same way: ``base_url``/``OPENAI_BASE_URL``, ``api_key``/``OPENAI_API_KEY``,
``client=``, ``timeout_s``, the SDK's own retries off so that every attempt is journaled.

Errors are translated by the chat adapter's mapping (the SDK raises the same exception
classes for both APIs): the same ``kind`` per status, ``retry_after`` from ``retry-after-ms`` /
``Retry-After``. In addition, a 200 response whose ``status`` is ``failed`` is
``ModelCallError(kind="server", retryable=True)``, one ``incomplete`` for its content filter
(``incomplete_details.reason`` ``content_filter``) is ``kind="content_filter"`` (not
retryable), and a conversation that cannot be converted to Responses input items is
``kind="bad_request"`` (not retryable) before any request is sent.

With ``stream=True`` the response is streamed (its text, reasoning summary and function-call
argument deltas passed to ``request.on_delta``) and the reply is read from the stream's last
event (``response.completed``, ``response.incomplete`` or ``response.failed``), which holds the
whole response: the same reply as without streaming. A stream that ends without one is a
failed attempt (``connection``, retryable); an ``error`` event is kind by its ``code``, as
the chat adapter maps an error sent inside a stream.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from ..types import (
    ConfigError,
    Message,
    ModelCallError,
    ModelReply,
    ModelRequest,
    TokenLogprob,
    ToolCall,
)
from ._common import (
    Relay,
    bad_response,
    clipped,
    content_filtered,
    cut_off,
    drain,
    name_of,
    unconvertible,
    usage_from,
)
from ._errors import one_line, translating
from ._logprobs import field, tokens_of
from ._openai_replies import RESPONSES_USAGE
from .openai import OpenAIModel

__all__ = ["OpenAIResponsesModel"]

ReasoningSummary = Literal["auto", "concise", "detailed"]


class OpenAIResponsesModel(OpenAIModel):
    """The Model seam over the OpenAI Responses API, for OpenAI's reasoning models.

    One ``complete`` is one ``POST /responses`` with ``store=false`` (stateless: PolyLoop's
    context is the history and is sent whole every call; nothing is kept at OpenAI and no
    ``previous_response_id`` is used), the request's chat-format messages converted to
    Responses ``input`` items, and, when there are tools, ``tools`` (function tools, converted
    from the chat format), ``tool_choice`` and ``parallel_tool_calls=false``.

    The conversion of PolyLoop's OpenAI chat-format messages:

    * ``system`` and ``developer`` messages → message items with that role, in place (not
      ``instructions``, which hold one text: a history may have several, anywhere);
    * ``user``/``assistant`` text → message items (chat content parts ``text`` and
      ``image_url`` become ``input_text``/``input_image``);
    * an assistant's ``tool_calls`` → one ``function_call`` item each (``call_id``, ``name``,
      ``arguments`` as the exact string; a mapping is sent as JSON), after its text;
    * ``tool`` messages → ``function_call_output`` items with their ``tool_call_id`` as
      ``call_id``.

    The reasoning of earlier replies is recorded in the steps, never sent back (with
    ``store=false`` the API could only take it as encrypted content); a reasoning model
    reasons afresh each call. A function spec's ``strict`` is sent as given, ``false`` when
    the spec has none (the Responses API would otherwise apply strict schemas, which
    PolyLoop's tool schemas need not satisfy).

    Args:
        model: e.g. ``"o4-mini"`` or ``"gpt-5"``.
        reasoning_effort: sent as ``reasoning.effort`` when not None (``"minimal"``,
            ``"low"``, ``"medium"``, ``"high"``); None: the model's default.
        reasoning_summary: sent as ``reasoning.summary`` (default ``"auto"``, so that the
            reply's reasoning is recorded); None leaves it out. With both None no
            ``reasoning`` field is sent (for models that are not reasoning models).
        max_tokens: sent as ``max_output_tokens`` (it counts reasoning tokens too).
        store: sent as ``store``; default False (see above).
        The other arguments are :class:`~polyloop.models.openai.OpenAIModel`'s; ``extra_body``
        is merged into every request body, ``stream=True`` streams the response (see the
        module docstring).
    """

    _PROVIDER = "openai-responses"

    def __init__(
        self,
        model: str,
        *,
        reasoning_effort: str | None = None,
        reasoning_summary: ReasoningSummary | None = "auto",
        store: bool = False,
        **options: Any,
    ) -> None:
        if reasoning_effort is not None and not isinstance(reasoning_effort, str):
            raise ConfigError(
                f"OpenAIResponsesModel reasoning_effort must be a str such as 'low', "
                f"got {reasoning_effort!r}"
            )
        if reasoning_summary not in (None, "auto", "concise", "detailed"):
            raise ConfigError(
                "OpenAIResponsesModel reasoning_summary must be 'auto', 'concise', 'detailed' "
                f"or None, got {reasoning_summary!r}"
            )
        if not isinstance(store, bool):
            raise ConfigError(f"OpenAIResponsesModel store must be a bool, got {store!r}")
        super().__init__(model, **options)
        reasoning: dict[str, str] = {}
        if reasoning_effort is not None:
            reasoning["effort"] = reasoning_effort
        if reasoning_summary is not None:
            reasoning["summary"] = reasoning_summary
        self._reasoning = reasoning or None
        self._store = store

    async def complete(self, request: ModelRequest) -> ModelReply:
        """One response for ``request``, streamed when the model was built with
        ``stream=True`` (its deltas passed to ``request.on_delta``).

        Returns:
            ``text`` (the ``output_text`` parts of the ``message`` items, joined with "\\n"
            between items; a ``refusal`` part counts as text), ``reasoning`` (the
            ``summary_text`` parts of the ``reasoning`` items, joined with blank lines; None
            when there are none), ``tool_calls`` (the ``function_call`` items, ``call_id`` as
            the call's id, arguments as the exact string received), ``call_id`` (the
            response's ``id``), ``usage`` (``input_tokens`` with its details'
            ``cached_tokens``, ``output_tokens`` with its details' ``reasoning_tokens``, a
            part of them, as OpenAI bills them; None when not reported), ``model`` (the
            response's ``model``). A response cut short (``status="incomplete"``, e.g. at
            ``max_output_tokens``) returns what it holds, unless its content filter cut it.

        Raises:
            ModelCallError: the call failed; ``kind`` and ``retryable`` as for ``OpenAIModel``,
                plus ``server`` for a response with ``status="failed"``, ``content_filter``
                for one its content filter cut, and ``bad_request`` for a conversation that
                cannot be converted.

        Nothing is retried here; a failed call may have been processed (and billed) or not.
        """
        body = self._responses_body(request)
        client: Any = self._client
        with translating(self._translate):
            if self._stream:
                stream = await client.responses.create(**body, stream=True)
                http_request = getattr(getattr(stream, "response", None), "request", None)
                events = _Events(self._where(), request.on_delta, self._sdk.APIError, http_request)
                await drain(stream, events.add)
                response = events.response()
            else:
                response = await client.responses.create(**body)
        return _reply(response, self._where(), self._logprobs)

    def _ask_logprobs(self, body: dict[str, Any]) -> None:
        """``include`` of ``message.output_text.logprobs``, and ``top_logprobs`` when set."""
        body["include"] = ["message.output_text.logprobs"]
        if self._top_logprobs is not None:
            body["top_logprobs"] = self._top_logprobs

    def _responses_body(self, request: ModelRequest) -> dict[str, Any]:
        where = self._where()
        body: dict[str, Any] = {
            "model": self._model,
            "input": _input_items(request.messages, where),
            "store": self._store,
            "timeout": self._timeout_s,
        }
        if request.tool_specs:
            tools = [_wire_tool(spec, where) for spec in request.tool_specs]
            choice = self._tool_choice
            self._add_tools(body, request, tools, choice and _wire_tool_choice(choice))
        if self._reasoning is not None:
            body["reasoning"] = dict(self._reasoning)
        return self._add_options(body, "max_output_tokens")


# -- requests ----------------------------------------------------------------------------------


def _wire_tool(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A chat-format function spec as a Responses function tool; a spec already in the
    Responses shape (``name`` at the top level) or of another type is sent as given."""
    if spec.get("type") != "function" or "name" in spec:
        return dict(spec)
    fn = spec.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise unconvertible(where, f"a tool spec without a function name: {spec!r}")
    tool: dict[str, Any] = {
        "type": "function",
        "name": fn["name"],
        "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        "strict": bool(fn.get("strict", False)),
    }
    if fn.get("description"):
        tool["description"] = fn["description"]
    return tool


def _wire_tool_choice(choice: str | Mapping[str, Any]) -> str | Mapping[str, Any]:
    """``{"type": "function", "function": {"name": N}}`` (chat) as ``{"type": "function",
    "name": N}``; strings and other shapes as given."""
    if isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        return {"type": "function", "name": choice["function"].get("name")}
    return choice


def _content(content: Any, role: str, where: str) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise unconvertible(where, f"a {role} message with content of type {type(content)}")
    text_type = "output_text" if role == "assistant" else "input_text"
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": text_type, "text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if not isinstance(url, str):
                raise unconvertible(where, f"an image part without a url: {part!r}")
            wire: dict[str, Any] = {"type": "input_image", "image_url": url}
            if isinstance(image, Mapping) and image.get("detail"):
                wire["detail"] = image["detail"]
            parts.append(wire)
        elif (
            isinstance(part, Mapping)
            and isinstance(kind, str)
            and kind.startswith(("input_", "output_"))
        ):
            parts.append(dict(part))  # already a Responses content part
        else:
            raise unconvertible(where, f"a {role} content part it cannot convert: {part!r}")
    return parts


def _input_items(messages: Sequence[Message], where: str) -> list[dict[str, Any]]:
    """The chat-format ``messages`` as Responses ``input`` items (see the class docstring)."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise unconvertible(where, "a tool message without a tool_call_id")
            output = message.get("content")
            if not isinstance(output, str):
                output = "" if output is None else json.dumps(output, default=str)
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        elif role in ("system", "developer", "user"):
            content = _content(message.get("content"), role, where)
            items.append({"type": "message", "role": role, "content": content})
        elif role == "assistant":
            content = _content(message.get("content"), role, where)
            calls = message.get("tool_calls") or ()
            if content or not calls:
                items.append({"type": "message", "role": "assistant", "content": content})
            for call in calls:
                items.append(_function_call_item(call, where))
        else:
            raise unconvertible(where, f"a message with role {role!r}")
    return items


def _function_call_item(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    call_id = call.get("id") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise unconvertible(where, f"an assistant tool call without a function name: {call!r}")
    if not isinstance(call_id, str) or not call_id:
        raise unconvertible(where, f"an assistant tool call without an id: {call!r}")
    arguments = fn.get("arguments")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str):
        arguments = json.dumps(arguments)
    return {"type": "function_call", "call_id": call_id, "name": fn["name"], "arguments": arguments}


# -- replies -----------------------------------------------------------------------------------


def _reply(response: Any, where: str, asked: int | None = None) -> ModelReply:
    """Map a Responses ``response`` object to a ``ModelReply``. The SDK does not validate
    response bodies, so every field used is checked here; a wrong shape is ``bad_response``.
    ``asked`` (None: not asked for): the log-probabilities of the ``output_text`` parts, in
    order, are the reply's (None when no part has any)."""
    output = getattr(response, "output", None)
    if not isinstance(output, list):
        raise bad_response(where, f"no output list in the response: {clipped(response)}")
    status = getattr(response, "status", None)
    reason = getattr(getattr(response, "incomplete_details", None), "reason", None)
    if status == "incomplete" and reason == "content_filter":
        raise content_filtered(where, "status incomplete, reason content_filter")
    if status == "failed":
        error = getattr(response, "error", None)
        code, text = getattr(error, "code", None), getattr(error, "message", None)
        raise ModelCallError(
            f"the response from {where} failed: {code}: {one_line(str(text))}",
            retryable=True,
            kind="server",
        )
    texts: list[str] = []
    summaries: list[str] = []
    calls: list[ToolCall] = []
    logprobs: list[TokenLogprob] | None = None
    for item in output:
        kind = getattr(item, "type", None)
        if kind == "message" and asked is not None:
            for part in getattr(item, "content", None) or ():
                content = field(part, "logprobs")
                if getattr(part, "type", None) == "output_text" and content is not None:
                    logprobs = [*(logprobs or ()), *tokens_of(content, where, asked)]
        if kind == "message":
            parts = [
                part.text if getattr(part, "type", None) == "output_text" else part.refusal
                for part in getattr(item, "content", None) or ()
                if getattr(part, "type", None) in ("output_text", "refusal")
            ]
            if any(not isinstance(p, str) for p in parts):
                raise bad_response(where, f"a message item with non-text content: {item!r}")
            texts.append("".join(parts))
        elif kind == "reasoning":
            for part in getattr(item, "summary", None) or ():
                text = getattr(part, "text", None)
                if isinstance(text, str) and text:
                    summaries.append(text)
        elif kind == "function_call":
            name, arguments = getattr(item, "name", None), getattr(item, "arguments", None)
            if not isinstance(name, str) or not isinstance(arguments, str | None):
                raise bad_response(where, f"a function_call item without a name: {item!r}")
            call_id = getattr(item, "call_id", None)
            calls.append(
                ToolCall(name, arguments or "", call_id if isinstance(call_id, str) else None)
            )
        # other items (web search, file search, ...) come only from tools PolyLoop never sends
    return ModelReply(
        text="\n".join(t for t in texts if t),
        reasoning="\n\n".join(summaries) or None,
        tool_calls=tuple(calls),
        call_id=name_of(getattr(response, "id", None)),
        usage=usage_from(getattr(response, "usage", None), RESPONSES_USAGE),
        model=name_of(getattr(response, "model", None)),
        logprobs=None if logprobs is None else tuple(logprobs),
    )


_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class _Events:
    """The events of one streamed response: deltas relayed to ``on_delta`` as they arrive
    (text per message item, "\\n" between items; reasoning per summary part, a blank line
    between parts; function-call arguments), the whole response kept from the last event. An
    ``error`` event is raised as the SDK's ``APIError`` with the event as its body, for the
    chat adapter's mapping (``error_class`` and ``http_request`` are the SDK's)."""

    def __init__(
        self,
        where: str,
        on_delta: Callable[[str, str], None] | None,
        error_class: Callable[..., Exception],
        http_request: Any,
    ) -> None:
        self.where = where
        self.relay = Relay(on_delta)
        self.error_class = error_class
        self.http_request = http_request
        self.final: Any = None

    def add(self, event: Any) -> None:
        kind = getattr(event, "type", None)
        delta = getattr(event, "delta", None)
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            self.relay("text", delta, getattr(event, "item_id", None), "\n")
        elif kind == "response.reasoning_summary_text.delta":
            part = (getattr(event, "item_id", None), getattr(event, "summary_index", None))
            self.relay("reasoning", delta, part, "\n\n")
        elif kind == "response.function_call_arguments.delta":
            self.relay("tool_call", delta)
        elif kind in _TERMINAL:
            self.final = getattr(event, "response", None)
        elif kind == "error":
            message = getattr(event, "message", None) or "an error event in the stream"
            body = {"type": kind, "code": getattr(event, "code", None), "message": message}
            raise self.error_class(message, self.http_request, body=body)

    def response(self) -> Any:
        """The response of the last event; a stream that had none was cut off."""
        if self.final is None:
            raise cut_off(self.where, "its response.completed event")
        return self.final
