"""The JSON-in-text interpreter: one JSON object in the reply text is the decision."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from polyloop.types import (
    DEFAULT_TEMPLATES,
    Action,
    ConfigError,
    Decision,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    Templates,
    ToolSpec,
    canonical_json,
)

from ._json import kind, loads
from .code_block import _fences

__all__ = ["JsonTextInterpreter"]

_TOOL_KEYS = ("tool", "name")
_ARGUMENT_KEYS = ("arguments", "args")
_MAX_KEYS_SHOWN = 10
# A failed candidate that starts like this was meant as JSON: report its parse error (a
# Python-style dict with single quotes included); other braces are just prose.
_LOOKS_LIKE_JSON = re.compile(r"\{\s*[\"']")


@dataclass(frozen=True, slots=True)
class _Found:
    """What the reply text holds: a parsed JSON value, or why there is none."""

    present: bool = False
    """A JSON value was found (``value``; it may be ``null``)."""
    value: Any = None
    error: str | None = None
    """The parse error of the JSON the reply meant to send; None when nothing was meant as
    JSON."""


class JsonTextInterpreter:
    """Reads one JSON object from the reply text (the Interpreter seam). Pure and deterministic.

    Finding the object:

    * The first fenced block tagged ``json`` (any case), or untagged and starting with ``{``,
      is the JSON: its whole content must parse. Other fenced blocks (code in another
      language, output) are ignored, content included; an unclosed fence is not a block.
    * Otherwise, outside fenced blocks, the first balanced top-level ``{...}`` (braces inside
      JSON strings, and escaped quotes, are skipped) that parses. Prose around it is ignored.
    * Nothing parses -> ``InvalidDecision``: ``templates.json_malformed`` with the parser's
      error when something looked like JSON (``{"`` or ``{'``; an unclosed object counts),
      else ``templates.json_no_object`` (also for an empty reply). A fenced block holding JSON
      that is not an object -> ``templates.json_not_object``. ``NaN``/``Infinity`` are
      malformed.

    Reading the object:

    * ``{"tool": "<name>", "arguments": {...}}`` -> ``Action(text="name(<canonical JSON
      args>)", tool_name, arguments)``, ``call_id`` None. ``"name"`` is accepted for
      ``"tool"`` and ``"args"`` for ``"arguments"``; a missing ``"arguments"`` means ``{}``.
      The tool name is not checked here (an unknown tool is the environment's to answer).
    * ``{"<final_key>": "<text>"}`` -> ``FinalAnswer(text)`` (the string unchanged).
    * Other keys are ignored (models like to add ``"thought"``).
    * Wrong shape -> ``InvalidDecision``: a key together with its alias
      (``templates.json_conflicting_keys``); a tool call and a final answer in one object
      (``json_call_and_final``); neither (``json_no_decision``); a tool name that is not a
      non-empty string (``json_bad_tool``); arguments that are not an object
      (``json_bad_arguments``); a final answer that is not a non-empty string
      (``json_bad_final``).

    Native tool calls in the reply -> ``InvalidDecision`` (``templates.json_native_tool_calls``):
    with this interpreter the model writes its calls as text, and none of them is executed.
    Every feedback ends with the expected form (:attr:`instructions`).

    Args:
        templates: the wording of the feedback.
        final_key: the key of the final-answer object.

    Raises:
        ConfigError: ``final_key`` is blank or one of the tool-call keys.
    """

    def __init__(
        self, *, templates: Templates = DEFAULT_TEMPLATES, final_key: str = "final_answer"
    ) -> None:
        if not final_key.strip() or final_key in _TOOL_KEYS + _ARGUMENT_KEYS:
            raise ConfigError(
                f"final_key must be a non-blank key other than {_TOOL_KEYS + _ARGUMENT_KEYS}, "
                f"got {final_key!r}"
            )
        self._templates = templates
        self._final_key = final_key

    @property
    def final_key(self) -> str:
        """The key of the final-answer object."""
        return self._final_key

    @property
    def instructions(self) -> str:
        """The expected form in words (``templates.json_expected``), as every feedback ends
        with it; suitable for a system prompt."""
        return self._templates.json_expected.format(final_key=self._final_key)

    def interpret(self, reply: ModelReply, tool_specs: Sequence[ToolSpec]) -> Decision:
        """Turn ``reply`` into one decision (see the class docstring). ``tool_specs`` is not
        consulted."""
        t = self._templates
        if reply.tool_calls:
            names = ", ".join(repr(c.name) for c in reply.tool_calls)
            return self._invalid(t.json_native_tool_calls, names=names)
        found = _find_json(reply.text)
        if found.error is not None:
            return self._invalid(t.json_malformed, error=found.error)
        if not found.present:
            return self._invalid(t.json_no_object)
        if not isinstance(found.value, dict):
            return self._invalid(t.json_not_object, kind=_kind(found.value))
        return self._decide(found.value)

    def _decide(self, obj: dict[str, Any]) -> Decision:
        t = self._templates
        for aliases in (_TOOL_KEYS, _ARGUMENT_KEYS):
            present = [k for k in aliases if k in obj]
            if len(present) > 1:
                first, second = (json.dumps(k) for k in present)
                return self._invalid(t.json_conflicting_keys, first=first, second=second)
        tool_key = next((k for k in _TOOL_KEYS if k in obj), None)
        args_key = next((k for k in _ARGUMENT_KEYS if k in obj), None)
        is_call = tool_key is not None or args_key is not None
        if is_call and self._final_key in obj:
            return self._invalid(t.json_call_and_final)
        if self._final_key in obj:
            answer = obj[self._final_key]
            if not isinstance(answer, str) or not answer.strip():
                return self._invalid(t.json_bad_final, kind=_kind(answer))
            return FinalAnswer(answer)
        if tool_key is None:
            return self._invalid(t.json_no_decision, keys=_keys(obj))
        name = obj[tool_key]
        if not isinstance(name, str) or not name.strip():
            return self._invalid(t.json_bad_tool, key=tool_key, kind=_kind(name))
        arguments = obj[args_key] if args_key is not None else {}
        if not isinstance(arguments, dict):
            return self._invalid(
                t.json_bad_arguments, key=args_key or "arguments", name=name, kind=_kind(arguments)
            )
        return Action(
            text=f"{name}({canonical_json(arguments)})", tool_name=name, arguments=arguments
        )

    def _invalid(self, template: str, **values: str) -> InvalidDecision:
        return InvalidDecision(
            template.format(expected=self.instructions, final_key=self._final_key, **values)
        )

    def __repr__(self) -> str:
        return f"JsonTextInterpreter(final_key={self._final_key!r})"


def _find_json(text: str) -> _Found:
    """The JSON of the reply: the first JSON fenced block, else the first balanced object in
    the prose outside fenced blocks that parses (see :class:`JsonTextInterpreter`)."""
    fences = _fences(text)
    for block in fences.blocks:
        language = block.language.lower()
        if language == "json" or (language == "" and block.code.lstrip().startswith("{")):
            try:
                return _Found(present=True, value=loads(block.code))
            except ValueError as exc:
                return _Found(error=str(exc))
    first_error: str | None = None
    # The prose: the text between fenced blocks (code in a block is not the decision).
    bounds = [0, *(i for b in fences.blocks for i in (b.start, b.end)), len(text)]
    for start, end in zip(bounds[::2], bounds[1::2], strict=True):
        value, error = _first_object(text[start:end])
        if value is not None:
            return _Found(present=True, value=value)
        first_error = first_error or error
    return _Found(error=first_error)


def _first_object(prose: str) -> tuple[dict[str, Any] | None, str | None]:
    """The first balanced top-level ``{...}`` of ``prose`` that parses, else None and the parse
    error of the first candidate that looked like JSON (None if none did)."""
    error: str | None = None
    pos = 0
    while (start := prose.find("{", pos)) >= 0:
        end = _balanced_end(prose, start)
        candidate = prose[start:end]
        try:
            return loads(candidate), None
        except ValueError as exc:
            if error is None and _LOOKS_LIKE_JSON.match(candidate):
                error = str(exc)
        if end is None:  # everything after an unclosed brace is inside it
            break
        pos = end  # top level only: a broken object's inner braces are not candidates
    return None, error


def _balanced_end(text: str, start: int) -> int | None:
    """The index just past the brace that closes the one at ``text[start]``, or None if it
    never closes. Braces inside JSON strings (with backslash escapes) do not count."""
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _keys(obj: dict[str, Any]) -> str:
    keys = [json.dumps(k, ensure_ascii=False) for k in list(obj)[:_MAX_KEYS_SHOWN]]
    if len(obj) > _MAX_KEYS_SHOWN:
        keys.append("...")
    return ", ".join(keys) if keys else "(none)"


def _kind(value: Any) -> str:
    if isinstance(value, str) and not value.strip():
        return "an empty string"
    return kind(value)
