"""Anthropic's Messages API reply read into a ``ModelReply``, for
:mod:`polyloop.models.anthropic`: a message sent whole (:func:`reply`, with the thinking blocks
to send back with its tool calls) and one streamed, event by event (:class:`Events`, which
puts the message sent whole together). No SDK is imported: the SDK builds its response objects
without checks, so every field used is checked here; a body of the wrong shape is
``bad_response``."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, Final

from ..types import ModelReply, ToolCall, text_nested_deeper
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

__all__ = ["Events", "reply"]

USAGE: Final = UsageFields(
    ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"),
    ("output_tokens",),
    ("cache_read_input_tokens",),
    ("output_tokens_details", "thinking_tokens"),
)
"""Where Anthropic's usage holds each count (``AnthropicModel``'s docstring says why)."""


def reply(response: Any, where: str) -> tuple[ModelReply, list[dict[str, Any]]]:
    """Map a message to a ``ModelReply``, and the thinking blocks to send back with its tool
    calls (checked as the module docstring says)."""
    content = getattr(response, "content", None)
    if not isinstance(content, list):
        raise bad_response(where, f"no content blocks in the response: {clipped(response)}")
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
        usage=usage_from(getattr(response, "usage", None), USAGE),
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


class Events:
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
