"""Chat completions read into a ``ModelReply``, for :mod:`polyloop.models.openai`: a
completion sent whole (:func:`reply`) and one streamed, chunk by chunk (:class:`Chunks`). No SDK
is imported: the SDK builds its response objects without checks, so every field is read with
``getattr`` and checked here; a body of the wrong shape is ``bad_response``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ..types import ModelReply, TokenLogprob, ToolCall, Usage
from ._common import (
    Relay,
    UsageFields,
    bad_response,
    clipped,
    content_filtered,
    cut_off,
    name_of,
    usage_from,
)
from ._logprobs import MAX_TOKENS, field, tokens_of

__all__ = ["CHAT_USAGE", "RESPONSES_USAGE", "Chunks", "reply"]


def _reasoning_of(delta: Any) -> tuple[str, str] | None:
    """``(field, text)`` of a message's (or a chunk's delta's) reasoning: the
    ``reasoning_content`` or ``reasoning`` field servers add (DeepSeek, vLLM, Ollama)."""
    extra = getattr(delta, "model_extra", None) or {}
    for key in ("reasoning_content", "reasoning"):
        value = extra.get(key) if key in extra else getattr(delta, key, None)
        if isinstance(value, str) and value:
            return key, value
    return None


def _tool_call(raw: Any, where: str) -> ToolCall:
    fn = getattr(raw, "function", None)
    if fn is not None:
        name, arguments = getattr(fn, "name", None), getattr(fn, "arguments", None)
    else:  # a "custom" tool call (free-form input) from newer servers
        custom = getattr(raw, "custom", None)
        name, arguments = getattr(custom, "name", None), getattr(custom, "input", None)
    if not isinstance(name, str):
        raise bad_response(where, f"a tool call without a function name: {raw!r}")
    if arguments is None:
        arguments = ""
    elif not isinstance(arguments, str | Mapping):
        raise bad_response(where, f"tool call {name!r} has arguments of type {type(arguments)}")
    call_id = getattr(raw, "id", None)
    return ToolCall(name, arguments, call_id if isinstance(call_id, str) and call_id else None)


CHAT_USAGE: Final = UsageFields(
    ("prompt_tokens",),
    ("completion_tokens",),
    ("prompt_tokens_details", "cached_tokens"),
    ("completion_tokens_details", "reasoning_tokens"),
)
"""The chat API's usage: ``prompt_tokens`` with its details' ``cached_tokens``,
``completion_tokens`` with its details' ``reasoning_tokens``."""

RESPONSES_USAGE: Final = UsageFields(
    ("input_tokens",),
    ("output_tokens",),
    ("input_tokens_details", "cached_tokens"),
    ("output_tokens_details", "reasoning_tokens"),
)
"""The Responses API's usage: the same counts under ``input_tokens``/``output_tokens``."""


def _filtered(finish_reason: object, where: str) -> None:
    if finish_reason == "content_filter":
        raise content_filtered(where, "finish_reason content_filter")


def _choice_logprobs(choice: Any, where: str, asked: int | None) -> tuple[TokenLogprob, ...] | None:
    """A choice's ``logprobs.content`` (None: the server sent none)."""
    content = field(field(choice, "logprobs"), "content")
    return None if content is None else tokens_of(content, where, asked)


def reply(response: Any, where: str, asked: int | None = None) -> ModelReply:
    """Map a chat completion to a ``ModelReply``. The SDK does not validate response bodies
    (it builds models without checks, and returns a ``str``/``list`` for non-object bodies),
    so every field is checked here; a body of the wrong shape is ``bad_response``.
    ``asked``: None when log-probabilities were not asked for (they are not read), else the
    ``top_logprobs`` asked for (0: none)."""
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise bad_response(where, f"no choices in the response: {clipped(response)}")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise bad_response(where, "the first choice has no message")
    _filtered(getattr(choices[0], "finish_reason", None), where)
    text = getattr(message, "content", None)
    if text is None:
        text = ""
    elif not isinstance(text, str):
        raise bad_response(where, f"message content of type {type(text).__name__}")
    calls = tuple(_tool_call(raw, where) for raw in getattr(message, "tool_calls", None) or ())
    reasoning = _reasoning_of(message)
    return ModelReply(
        text=text,
        reasoning=reasoning[1] if reasoning else None,
        tool_calls=calls,
        call_id=name_of(getattr(response, "id", None)),
        usage=usage_from(getattr(response, "usage", None), CHAT_USAGE),
        model=name_of(getattr(response, "model", None)),
        logprobs=None if asked is None else _choice_logprobs(choices[0], where, asked),
    )


class Chunks:
    """The chunks of one streamed chat completion, put together into the reply the same
    completion sent whole gives: the first choice's text, reasoning (one field, the first the
    server streams) and tool calls (by ``index``: the id and name of its first chunk, the
    arguments of all of them concatenated), the response's id and model, the usage of the
    last chunk that has one, and, when ``asked`` is not None (see :func:`reply`), the
    log-probabilities of every chunk's first choice in order. Each piece is relayed to
    ``on_delta`` as it is added."""

    def __init__(
        self, where: str, on_delta: Callable[[str, str], None] | None, asked: int | None = None
    ) -> None:
        self.where = where
        self.asked = asked
        self.logprobs: list[TokenLogprob] | None = None
        self.relay = Relay(on_delta)
        self.id: str | None = None
        self.model: str | None = None
        self.usage: Usage | None = None
        self.finish: str | None = None
        self.text: list[str] = []
        self.reasoning_field: str | None = None
        self.reasoning: list[str] = []
        self.calls: dict[int, tuple[list[str | None], list[str]]] = {}
        self.chunks = 0
        """How many chunks arrived (0: the server refused to stream, see ``stream_refused``)."""

    def add(self, chunk: Any) -> None:
        self.chunks += 1
        choices = getattr(chunk, "choices", None)
        if not isinstance(choices, list):
            raise bad_response(self.where, f"a stream chunk without choices: {chunk!r:.200}")
        self.id = self.id or name_of(getattr(chunk, "id", None))
        self.model = self.model or name_of(getattr(chunk, "model", None))
        usage = usage_from(getattr(chunk, "usage", None), CHAT_USAGE)
        if usage is not None:
            self.usage = usage
        for choice in choices:
            if getattr(choice, "index", 0) != 0:
                continue  # only the first choice is the reply (n is never sent)
            delta = getattr(choice, "delta", None)
            if delta is not None:
                self._delta(delta)
            if self.asked is not None:
                self._logprobs(choice)
            finish_reason = getattr(choice, "finish_reason", None)
            if isinstance(finish_reason, str) and finish_reason:
                self.finish = finish_reason

    def _delta(self, delta: Any) -> None:
        content = getattr(delta, "content", None)
        if isinstance(content, str) and content:
            self.text.append(content)
            self.relay("text", content)
        reasoning = _reasoning_of(delta)
        if reasoning is not None and self.reasoning_field in (None, reasoning[0]):
            self.reasoning_field = reasoning[0]
            self.reasoning.append(reasoning[1])
            self.relay("reasoning", reasoning[1])
        for raw in getattr(delta, "tool_calls", None) or ():
            index = getattr(raw, "index", None)
            if not isinstance(index, int):
                raise bad_response(self.where, f"a streamed tool call without an index: {raw!r}")
            head, arguments = self.calls.setdefault(index, ([None, None], []))
            fn = getattr(raw, "function", None)
            head[0] = head[0] or name_of(getattr(raw, "id", None))
            head[1] = head[1] or name_of(getattr(fn, "name", None))
            piece = getattr(fn, "arguments", None)
            if isinstance(piece, str) and piece:
                arguments.append(piece)
                self.relay("tool_call", piece)

    def _logprobs(self, choice: Any) -> None:
        tokens = _choice_logprobs(choice, self.where, self.asked)
        if tokens is None:
            return
        if self.logprobs is None:
            self.logprobs = []
        self.logprobs += tokens
        if len(self.logprobs) > MAX_TOKENS:
            raise bad_response(self.where, f"more than {MAX_TOKENS} log-probabilities streamed")

    def reply(self) -> ModelReply:
        """The reply; a stream that never gave a ``finish_reason`` was cut off."""
        if self.finish is None:
            raise cut_off(self.where, "a chunk with a finish_reason")
        _filtered(self.finish, self.where)
        calls = []
        for index in sorted(self.calls):
            (call_id, name), arguments = self.calls[index]
            if name is None:
                raise bad_response(self.where, f"streamed tool call {index} has no name")
            calls.append(ToolCall(name, "".join(arguments), call_id))
        return ModelReply(
            text="".join(self.text),
            reasoning="".join(self.reasoning) or None,
            tool_calls=tuple(calls),
            call_id=self.id,
            usage=self.usage,
            model=self.model,
            logprobs=None if self.logprobs is None else tuple(self.logprobs),
        )
