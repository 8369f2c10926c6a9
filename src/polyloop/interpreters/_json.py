"""JSON reading shared by the interpreters: strict (no ``NaN``/``Infinity``, which cannot be
stored canonically) and with one decoder for every call (``json.loads`` with
``parse_constant`` builds a new one each time)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DECODER", "loads"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads(text: str) -> Any:
    """Parse JSON as ``json.loads(text, parse_constant=...)`` would; raises ValueError (with
    the parser's message) when it is not valid or nested too deeply to parse."""
    try:
        if text.startswith("\ufeff"):  # what json.loads says of a byte-order mark
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise ValueError(str(exc)) from None
    except RecursionError:  # hostile nesting must not crash the interpreter
        raise ValueError("the JSON is nested too deeply") from None
