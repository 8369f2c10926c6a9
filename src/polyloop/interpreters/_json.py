"""JSON reading shared by the interpreters: strict (no ``NaN``/``Infinity``, which cannot be
stored canonically) and with one decoder for every call (``json.loads`` with
``parse_constant`` builds a new one each time)."""

from __future__ import annotations

import json
from typing import Any

from polyloop.types import MAX_NESTING, NestedTooDeeply, text_nested_deeper

__all__ = ["DECODER", "kind", "loads"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads(text: str) -> Any:
    """Parse JSON as ``json.loads(text, parse_constant=...)`` would, refusing text nested more
    than ``MAX_NESTING`` levels before the (recursive) decoder sees it.

    Raises:
        NestedTooDeeply: the text nests more than ``MAX_NESTING`` levels (a ValueError).
        ValueError: it is not valid JSON (the parser's message).
    """
    if text_nested_deeper(text):
        raise NestedTooDeeply(MAX_NESTING)
    try:
        if text.startswith("\ufeff"):  # what json.loads says of a byte-order mark
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None


def kind(value: Any) -> str:
    """What a parsed JSON value is, in words for a message: "an object", "an array", "a
    string", "a boolean", "a number" or "null"."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "null"
