"""What the pytest and unittest readers of :mod:`._test_reports` share: an entry read from a
report (:class:`Found`, with its :class:`Frame` s) and the reading of Python tracebacks and
exception lines. Pure, like the readers: no I/O, and odd input is skipped, never raised on."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "FRAMEWORK",
    "PY_FRAME",
    "TRACEBACK",
    "Found",
    "Frame",
    "Read",
    "after_last_chain",
    "is_assertion",
    "python_traceback",
    "split_exception",
]

TRACEBACK = re.compile(r"^\s*Traceback \(most recent call last\):\s*$")
PY_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d{1,9})(?:, in .*)?$')
_CHAINED = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)

# "KeyError: 'x'", "shop.orders.OrderError: boom", "AssertionError", "Failed: DID NOT RAISE"
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.<>]*)(?::(?: (?P<msg>.*))?)?$")
# Files of the test framework, the standard library and installed packages: never a top frame.
FRAMEWORK = re.compile(
    r"(?:^|/)(?:site-packages|dist-packages|_pytest|pluggy|lib-python)/"
    r"|(?:^|/)lib(?:64)?/python\d[^/]*/"
    r"|^<"  # <frozen importlib._bootstrap>, <string>
)


@dataclass(slots=True)
class Frame:
    """One frame of a traceback: its file as printed and its line number."""

    path: str
    line: str


@dataclass(slots=True)
class Found:
    """What one report entry says, before it becomes a Failure."""

    check: str
    failed: bool  # a failed test, as opposed to an error
    frames: list[Frame] = field(default_factory=list)
    error_type: str | None = None
    message: str | None = None
    test_file: str | None = None  # the test's own file, as far as the check tells
    paths: list[str] = field(default_factory=list)  # other absolute paths of that file


def split_exception(line: str, *, strict: bool) -> tuple[str | None, str]:
    """``(class name, message)`` of an exception line, or ``(None, line)``.

    ``strict``: only a capitalised class name counts (for lines that may be something else)."""
    line = line.strip()
    match = _EXCEPTION.match(line)
    if match is None:
        return None, line
    name = match["type"].rsplit(".", 1)[-1]
    if not name or (strict and not name[0].isupper()):
        return None, line
    return name, match["msg"] or ""


def is_assertion(line: str) -> bool:
    return line == "assert" or line.startswith("assert ")


def after_last_chain(lines: Sequence[str]) -> Sequence[str]:
    """The lines of the last exception of a chain (all of them when there is no chain)."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip() in _CHAINED:
            return lines[i + 1 :]
    return lines


def python_traceback(lines: Sequence[str]) -> tuple[list[Frame], str | None]:
    """The frames and the exception line of the last traceback in ``lines``."""
    lines = after_last_chain(lines)
    start = -1
    for i in range(len(lines) - 1, -1, -1):
        if TRACEBACK.match(lines[i]):
            start = i
            break
    frames: list[Frame] = []
    last = start
    for i in range(start + 1, len(lines)):
        match = PY_FRAME.match(lines[i])
        if match is not None:
            frames.append(Frame(match["path"], match["line"]))
            last = i
    if start < 0 and not frames:
        return frames, None
    for line in lines[last + 1 :]:
        if line.strip() and not line[0].isspace():
            return frames, line
    return frames, None


@dataclass(slots=True)
class Read:
    """What a reader found in a report of its framework, before the entries become failures."""

    found: list[Found]
    summary: str  # the closing line, "" if the output had none
    roots: list[str] = field(default_factory=list)  # project roots the report declares
