"""Text that is not valid Unicode, made valid where it enters a run.

A Python ``str`` can hold code points that no Unicode encoding can write: surrogates
(U+D800..U+DFFF), which a JSON ``\\ud800`` escape, ``os.fsdecode`` of a non-UTF-8 file name
(``surrogateescape``) or a careless decoder produce. They are the only ``str`` values that
``str.encode("utf-8")`` refuses, so a journal write of one fails. PolyLoop's one representation
for them: each such code point becomes U+FFFD (the replacement character), and the step that
received it counts it in ``StepRecord.replaced_chars``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REPLACEMENT", "clean_json", "clean_text", "first_invalid"]

REPLACEMENT = "\ufffd"
"""What a code point that is not valid Unicode becomes."""

_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> tuple[str, int]:
    """``text`` with every surrogate code point replaced by U+FFFD, and how many there were.

    A surrogate pair held as two code points is not a character either: each half is replaced.
    Returns ``text`` itself (the same object) when it is valid, which is checked with no copy
    for ASCII text and one encoding pass otherwise.
    """
    if text.isascii():
        return text, 0
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.subn(REPLACEMENT, text)
    return text, 0


def clean_json(value: Any) -> tuple[Any, int]:
    """A JSON-like value (str, dict keys and values, lists, tuples; anything else is kept)
    with :func:`clean_text` applied to every string in it, and the count of replacements.

    Returns ``value`` itself when nothing was replaced; otherwise a copy, with each changed
    mapping as a ``dict``, each changed list or tuple as its own type, and each changed str
    subclass as a plain ``str``. Two keys of one mapping that differ only in replaced code
    points become one key (the later value wins). ``value`` must not contain itself. Walked
    without recursion: any depth is fine.
    """
    top = _Container.of(value)
    if top is None:
        return _clean_leaf(value)
    if _all_valid(value):  # the common case: one pass, nothing built
        return value, 0
    stack = [top]
    while True:
        frame = stack[-1]
        child = next(frame.children, _END)
        if child is _END:
            stack.pop()
            done, n = frame.result()
            if not stack:
                return done, n
            stack[-1].add(done, n)
            continue
        if frame.is_map:
            key: Any
            key, child = child
            if isinstance(key, str):
                key, n = clean_text(key)
                frame.total += n
            frame.key = key
        inner = _Container.of(child)
        if inner is None:
            frame.add(*_clean_leaf(child))
        else:
            stack.append(inner)


_END: Any = object()


def _all_valid(value: Any) -> bool:
    """Every str in ``value`` that :func:`clean_json` would clean (keys too) is valid."""
    stack = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        v = pop()
        t = type(v)
        if t is str:
            if not v.isascii() and clean_text(v)[1]:
                return False
        elif t is list or t is tuple:
            extend(v)
        elif t is dict or isinstance(v, Mapping):
            for k, child in v.items():
                if isinstance(k, str) and not k.isascii() and clean_text(k)[1]:
                    return False
                push(child)
        elif isinstance(v, str) and not v.isascii() and clean_text(v)[1]:
            return False
    return True


def _clean_leaf(value: Any) -> tuple[Any, int]:
    if isinstance(value, str):  # a str subclass too (an enum member, say)
        return clean_text(value)
    return value, 0


class _Container:
    """A mapping, list or tuple being cleaned by :func:`clean_json`: its children still to do,
    those done, and the count replaced in it so far."""

    __slots__ = ("children", "done", "is_map", "key", "total", "value")

    def __init__(self, value: Any, is_map: bool) -> None:
        self.value = value
        self.is_map = is_map
        self.children: Any = iter(value.items() if is_map else value)
        self.done: list[Any] = []
        self.total = 0
        self.key: Any = None

    @classmethod
    def of(cls, value: Any) -> _Container | None:
        t = type(value)
        if t is str:
            return None
        if t is list or t is tuple:
            return cls(value, False)
        if t is dict or isinstance(value, Mapping):
            return cls(value, True)
        return None

    def add(self, value: Any, n: int) -> None:
        self.done.append((self.key, value) if self.is_map else value)
        self.total += n

    def result(self) -> tuple[Any, int]:
        if not self.total:
            return self.value, 0
        if self.is_map:
            return dict(self.done), self.total
        return type(self.value)(self.done), self.total


def first_invalid(value: Any, where: str) -> str | None:
    """Where the first text in a JSON-like ``value`` that is not valid Unicode is: a path from
    ``where`` (``history[2]['content']``) and the first bad code point with its index; None
    when all of it is valid. For refusing a caller's own input, which PolyLoop never alters."""
    if isinstance(value, str):
        if not clean_text(value)[1]:
            return None
        found = _SURROGATE.search(value)
        assert found is not None
        return f"{where} (code point U+{ord(found.group()):04X} at index {found.start()})"
    if isinstance(value, Mapping):
        for k, v in value.items():
            if isinstance(k, str) and clean_text(k)[1]:
                return first_invalid(k, f"a key of {where}")
            inner = first_invalid(v, f"{where}[{k!r}]")
            if inner is not None:
                return inner
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            inner = first_invalid(v, f"{where}[{i}]")
            if inner is not None:
                return inner
    return None
