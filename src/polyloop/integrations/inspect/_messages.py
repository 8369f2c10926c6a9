"""Conversations both ways between PolyLoop's chat messages (OpenAI-format dicts, what
:class:`~polyloop.context.ChatContextBuilder` builds) and Inspect's ``ChatMessage`` objects.

Text only: a message's text parts are joined (Inspect's ``ChatMessage.text``); images, audio
and other media are not carried over, nor is Inspect's reasoning content of a history message
(a reply's reasoning is recorded in its PolyLoop step)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from inspect_ai.model import (
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageSystem,
    ChatMessageTool,
    ChatMessageUser,
)
from inspect_ai.tool import ToolCall as InspectToolCall

from ...models._common import arguments_object, unconvertible
from ...types import Message

__all__ = ["Converter", "from_inspect"]


def from_inspect(messages: Sequence[ChatMessage]) -> list[Message]:
    """Inspect messages as PolyLoop chat messages (a sample's input, given to a run as its
    ``history``): role, text and, for the model's turns, its tool calls (arguments as JSON
    text); a tool result keeps its ``tool_call_id``."""
    out: list[Message] = []
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": message.text}
        if isinstance(message, ChatMessageAssistant) and message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function, "arguments": json.dumps(call.arguments)},
                }
                for call in message.tool_calls
            ]
        elif isinstance(message, ChatMessageTool) and message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _text(content: object) -> str:
    """A PolyLoop message's content as text: a str as it is, OpenAI content parts' texts
    joined, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return str(content)


class Converter:
    """Converts one run's conversation to Inspect messages, incrementally: a request whose
    messages extend the ones converted last (the same objects: the chat context only appends)
    converts only the new ones, so each call costs what the step added, not the history. Any
    other request is converted whole. One converter per run (per model object)."""

    __slots__ = ("_converted", "_last", "_names", "_where")

    def __init__(self, where: str) -> None:
        self._where = where
        self._converted: list[ChatMessage] = []
        self._last: object = None
        self._names: dict[str, str] = {}

    def convert(self, messages: Sequence[Message]) -> list[ChatMessage]:
        """The Inspect messages of ``messages`` (a new list; the converted messages are
        shared between calls and never modified).

        Raises:
            ModelCallError: ``bad_request``, a message with a role Inspect has no class for.
        """
        done = len(self._converted)
        if not (done <= len(messages) and (done == 0 or messages[done - 1] is self._last)):
            self._converted, self._names, done = [], {}, 0
        for message in messages[done:]:
            self._converted.append(self._one(message))
        if messages:
            self._last = messages[-1]
        return list(self._converted)

    def _one(self, message: Message) -> ChatMessage:
        role = message.get("role")
        text = _text(message.get("content"))
        if role == "user":
            return ChatMessageUser(content=text)
        if role in ("system", "developer"):
            return ChatMessageSystem(content=text)
        if role == "assistant":
            calls = []
            for call in message.get("tool_calls") or ():
                fn = call.get("function") or {}
                name, call_id = str(fn.get("name", "")), str(call.get("id", ""))
                self._names[call_id] = name
                arguments = arguments_object(fn.get("arguments"))
                calls.append(InspectToolCall(id=call_id, function=name, arguments=arguments))
            return ChatMessageAssistant(content=text, tool_calls=calls or None)
        if role == "tool":
            answered = message.get("tool_call_id")
            answered = answered if isinstance(answered, str) else None
            return ChatMessageTool(
                content=text,
                tool_call_id=answered,
                function=None if answered is None else self._names.get(answered),
            )
        raise unconvertible(self._where, f"a message with role {role!r}")
