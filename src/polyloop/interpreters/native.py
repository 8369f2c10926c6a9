"""The native tool-call interpreter: one tool call is an action, plain text a final answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from polyloop.types import (
    DEFAULT_TEMPLATES,
    MAX_NESTING,
    Action,
    Decision,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    NestedTooDeeply,
    Templates,
    ToolCall,
    ToolSpec,
    canonical_json,
    nested_deeper,
)

from ._json import kind, loads

__all__ = ["NativeToolCallInterpreter"]


class NativeToolCallInterpreter:
    """Reads the reply's native tool calls (the Interpreter seam). Pure and deterministic.

    * Exactly one tool call -> ``Action(text="name(<canonical JSON args>)", tool_name,
      arguments, call_id)``. Arguments given as a JSON string are parsed; "" or whitespace means
      ``{}``; malformed JSON, ``NaN``/``Infinity`` or a non-object -> ``InvalidDecision``
      (``templates.malformed_arguments``); arguments (a string or a mapping) nested more than
      ``polyloop.types.MAX_NESTING`` levels -> ``InvalidDecision``
      (``templates.arguments_too_deep``), before anything recursive reads them. An empty
      call id becomes None. The tool name is not checked here: an unknown tool is a valid
      decision that the environment answers ``not_executed``.
    * More than one tool call -> ``InvalidDecision`` (``templates.several_tool_calls``); none of
      them is executed.
    * No tool call and non-blank text -> ``FinalAnswer(text)`` (the text unchanged), or
      ``InvalidDecision`` (``templates.text_without_tool_call``) when ``text_is_final=False``.
    * No tool call and blank text -> ``InvalidDecision`` (``templates.empty_reply``).

    Args:
        text_is_final: plain text without a tool call is a final answer (default). Set False
            when the run must end through a tool (e.g. a completion-marker tool).
        templates: the wording of the feedback.
    """

    def __init__(
        self, *, text_is_final: bool = True, templates: Templates = DEFAULT_TEMPLATES
    ) -> None:
        self._text_is_final = text_is_final
        self._templates = templates

    @property
    def text_is_final(self) -> bool:
        """Plain text without a tool call is a final answer."""
        return self._text_is_final

    def interpret(self, reply: ModelReply, tool_specs: Sequence[ToolSpec]) -> Decision:
        """Turn ``reply`` into one decision (see the class docstring). ``tool_specs`` is not
        consulted: unknown tool names are the environment's to answer."""
        calls = reply.tool_calls
        if len(calls) > 1:
            return InvalidDecision(
                self._templates.several_tool_calls.format(
                    count=len(calls), names=", ".join(c.name for c in calls)
                )
            )
        if len(calls) == 1:
            return self._action(calls[0])
        if not reply.text.strip():
            return InvalidDecision(self._templates.empty_reply)
        if not self._text_is_final:
            return InvalidDecision(self._templates.text_without_tool_call)
        return FinalAnswer(reply.text)

    def _action(self, call: ToolCall) -> Decision:
        try:
            arguments = _arguments(call.arguments)
        except NestedTooDeeply as exc:
            return InvalidDecision(
                self._templates.arguments_too_deep.format(name=call.name, limit=exc.limit)
            )
        except ValueError as exc:
            return InvalidDecision(
                self._templates.malformed_arguments.format(name=call.name, error=str(exc))
            )
        return Action(
            text=f"{call.name}({canonical_json(arguments)})",
            tool_name=call.name,
            arguments=arguments,
            call_id=call.id or None,
        )

    def __repr__(self) -> str:
        return f"NativeToolCallInterpreter(text_is_final={self._text_is_final})"


def _arguments(raw: Mapping[str, Any] | str) -> dict[str, Any]:
    """The call's arguments as a dict.

    Raises:
        NestedTooDeeply: the arguments nest more than ``MAX_NESTING`` levels.
        ValueError: malformed JSON, or JSON that is not an object (the message says which).
    """
    if not isinstance(raw, str):
        if not isinstance(raw, Mapping):
            raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
        raw = dict(raw)
        if nested_deeper(raw):
            raise NestedTooDeeply(MAX_NESTING)
        return raw
    if not raw.strip():
        return {}
    value = loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {kind(value)}")
    return value
