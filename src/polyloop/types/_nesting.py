"""How deeply a JSON value nests, measured without recursion, and the one limit PolyLoop puts
on what a model (or a tool) sends.

Every recursive consumer of a JSON value spends stack per level: ``json``'s C encoder and
decoder, ``repr``, pydantic's validators, a tool's own code. Python's default recursion limit
is 1000 frames and a run's own stack is already some dozens deep, so a value nested ~990 levels
raises ``RecursionError`` somewhere. PolyLoop therefore measures nesting iteratively where a
value enters, and refuses (or, for a tool's result, writes as text without recursion) anything
nested more than :data:`MAX_NESTING` levels, before anything recursive touches it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ._canonical import canonical_json

__all__ = [
    "MAX_NESTING",
    "NestedTooDeeply",
    "json_text",
    "nested_deeper",
    "text_nested_deeper",
]

MAX_NESTING = 100
"""The deepest nesting of objects and arrays PolyLoop accepts in a model's tool arguments (the
arguments object itself is level 1). Real tool arguments, which a JSON Schema describes, nest a
handful of levels; 100 is far above any of them and far below where a recursive consumer
(several frames per level, on top of the run's own stack) meets Python's recursion limit of
1000. Ruby's JSON parser has the same default (``max_nesting: 100``)."""


class NestedTooDeeply(ValueError):
    """A JSON value nests more than ``limit`` levels of objects and arrays."""

    def __init__(self, limit: int = MAX_NESTING) -> None:
        super().__init__(f"nested too deeply (more than {limit} levels)")
        self.limit = limit


_CONTAINERS = frozenset((dict, list, tuple))
_SCALARS = frozenset((str, int, float, bool, type(None)))


def nested_deeper(value: Any, limit: int = MAX_NESTING) -> bool:
    """``value`` nests more than ``limit`` levels of dicts, lists and tuples (``{}`` is one
    level, ``{"a": [1]}`` two), found without recursion and as soon as the level is passed (a
    value that contains itself is deeper than any limit). Other mappings count as dicts (the
    arguments of a ``ToolCall`` may be any mapping); other sequences count as scalars, as
    ``canonical_json`` cannot write them either."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, level = pop()
        if type(v) is dict or isinstance(v, Mapping):  # a dict checked first: the common case
            children: Any = v.values()
        elif isinstance(v, list | tuple):
            children = v
        else:
            continue
        if level > limit:
            return True
        for child in children:
            t = type(child)
            if t in _CONTAINERS or (
                t not in _SCALARS and isinstance(child, Mapping | list | tuple)
            ):
                push((child, level + 1))
    return False


# A JSON string (its escapes skipped; an unclosed one runs to the end) or one bracket.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)


def text_nested_deeper(text: str, limit: int = MAX_NESTING) -> bool:
    """The JSON ``text`` nests more than ``limit`` levels of objects and arrays, found by one
    scan of its brackets outside strings (no parsing, no recursion; text with at most ``limit``
    opening brackets is not scanned). Text that is not JSON gets an answer too: the decoder
    judges it after this."""
    if text.count("{") + text.count("[") <= limit:
        return False
    depth = 0
    for m in _TOKEN.finditer(text):
        c = m.group()
        if c == "{" or c == "[":
            depth += 1
            if depth > limit:
                return True
        elif c == "}" or c == "]":
            depth = max(0, depth - 1)
    return False


class _Lit:
    """Text :func:`json_text` writes as it is (a separator, a key, a container's end), and for
    an end, the id of the container it closes."""

    __slots__ = ("ident", "text")

    def __init__(self, text: str, ident: int | None = None) -> None:
        self.text = text
        self.ident = ident


_COMMA = _Lit(",")


def json_text(value: Any, default: Callable[[Any], str] | None = None) -> str:
    """``canonical_json(value)``, byte for byte, written without recursion: for a value nested
    too deeply for the C encoder. Containers are dicts, lists and tuples; everything else is
    written by ``canonical_json`` itself, or, where it cannot be, as the JSON string
    ``default(it)`` (as ``json.dumps(default=str)``).

    Raises:
        TypeError: ``value`` holds something JSON cannot represent (and ``default`` is None).
        ValueError: ``value`` contains itself.
    """
    parts: list[str] = []
    open_ids: set[int] = set()
    work: list[Any] = [value]
    while work:
        v = work.pop()
        if type(v) is _Lit:
            parts.append(v.text)
            if v.ident is not None:
                open_ids.discard(v.ident)
        elif isinstance(v, dict | list | tuple) and v:
            if id(v) in open_ids:
                raise ValueError("Circular reference detected")
            open_ids.add(id(v))
            is_dict = isinstance(v, dict)
            parts.append("{" if is_dict else "[")
            work.append(_Lit("}" if is_dict else "]", id(v)))
            items: Any = sorted(v.items(), key=_first) if isinstance(v, dict) else v
            for n in range(len(items) - 1, -1, -1):
                if is_dict:
                    key, child = items[n]
                    work.append(child)
                    work.append(_Lit(canonical_json({key: 0})[1:-3] + ":"))
                else:
                    work.append(items[n])
                if n:
                    work.append(_COMMA)
        elif default is None:
            parts.append(canonical_json(v))  # a scalar, or an empty container
        else:
            try:
                parts.append(canonical_json(v))
            except TypeError:
                parts.append(canonical_json(default(v)))
    return "".join(parts)


def _first(item: tuple[Any, Any]) -> Any:
    return item[0]
