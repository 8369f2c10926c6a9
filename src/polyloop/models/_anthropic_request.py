"""Anthropic's Messages API request, from PolyLoop's OpenAI-format conversation and tool
specs, for :mod:`polyloop.models.anthropic` (the conversion its class docstring states). No
SDK is imported; what cannot be converted is ``bad_request`` before any request is sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Message
from ._common import arguments_object, unconvertible

__all__ = ["wire_messages", "wire_tool"]


def wire_tool(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
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


def wire_messages(
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
