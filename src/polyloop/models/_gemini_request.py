"""Gemini's ``generateContent`` request, from PolyLoop's OpenAI-format conversation and tool
specs, for :mod:`polyloop.models.gemini` (the conversion its class docstring states). No SDK
is imported: the contents are plain dicts the SDK converts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..types import Message
from ._common import arguments_object
from ._gemini_replies import OWN_ID_PREFIX

__all__ = ["wire_contents", "wire_declarations"]

# Gemini's documented stand-in for a thought signature it did not issue to this process
# (a call from before a resume, or from another model): it skips the signature check.
_NO_SIGNATURE: Final = b"skip_thought_signature_validator"


def wire_contents(
    messages: Sequence[Message], signatures: Mapping[str, bytes]
) -> tuple[str, list[dict[str, Any]]]:
    """``(system, contents)`` as Gemini takes them (see ``GeminiModel``'s docstring), each
    function call with the ``thoughtSignature`` ``signatures`` holds for its id."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if not parts:
            return
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})

    for message in messages:
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(message.get("content")))
        elif role == "assistant":
            parts: list[dict[str, Any]] = []
            text = _text_of(message.get("content"))
            if text:
                parts.append({"text": text})
            for call in message.get("tool_calls") or ():
                fn = call.get("function") or {}
                call_id, name = call.get("id"), fn.get("name", "")
                part: dict[str, Any] = {
                    "name": name,
                    "args": arguments_object(fn.get("arguments")),
                }
                if isinstance(call_id, str):
                    names[call_id] = name
                    if not call_id.startswith(OWN_ID_PREFIX):
                        part["id"] = call_id
                signature = signatures.get(call_id) if call_id else None
                parts.append(
                    {"function_call": part, "thought_signature": signature or _NO_SIGNATURE}
                )
            add("model", parts)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            response: dict[str, Any] = {
                "name": names.get(call_id, "") if isinstance(call_id, str) else "",
                "response": {"result": _text_of(message.get("content"))},
            }
            if isinstance(call_id, str) and not call_id.startswith(OWN_ID_PREFIX):
                response["id"] = call_id
            add("user", [{"function_response": response}])
        elif text := _text_of(message.get("content")):  # Gemini refuses an empty text part
            add("user", [{"text": text}])
    return "\n\n".join(s for s in system if s), contents


def _text_of(content: Any) -> str:
    """A message's content as text: a string as is, the text parts of a list joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and "text" in p
        )
    return str(content)


def wire_declarations(specs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-format tool specs as Gemini function declarations."""
    out: list[dict[str, Any]] = []
    for spec in specs:
        fn = spec.get("function", spec)
        declaration: dict[str, Any] = {"name": fn["name"]}
        if fn.get("description"):
            declaration["description"] = fn["description"]
        if fn.get("parameters") is not None:
            declaration["parameters_json_schema"] = fn["parameters"]
        out.append(declaration)
    return out
