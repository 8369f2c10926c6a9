"""Reading a tool's docstring: the description (first paragraph) and a Google-style
``Args:`` section."""

from __future__ import annotations

import re

__all__ = ["arg_descriptions", "summary"]

_ARGS_HEADERS = ("Args:", "Arguments:", "Parameters:")
_SECTION_RE = re.compile(
    r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Returns?|Yields?|"
    r"Raises|Examples?|Notes?|Attributes|See Also|Warnings?|Todo|References)\s*:\s*$"
)
_ARG_ENTRY_RE = re.compile(r"^\*{0,2}([A-Za-z_]\w*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def summary(doc: str) -> str:
    """The first paragraph, its lines joined by spaces; it ends at a blank line or a section
    header ("" when the docstring starts with a section)."""
    lines: list[str] = []
    for line in doc.strip().splitlines():
        stripped = line.strip()
        if not stripped or _SECTION_RE.match(stripped):
            break
        lines.append(stripped)
    return " ".join(lines)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def arg_descriptions(doc: str) -> dict[str, str]:
    """Parameter descriptions from a Google-style ``Args:`` section (continuation lines are
    indented deeper than the entry and joined by spaces)."""
    lines = doc.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.strip() in _ARGS_HEADERS), None)
    if start is None:
        return {}
    header_indent = _indent(lines[start])
    entry_indent: int | None = None
    parts: dict[str, list[str]] = {}
    current: str | None = None
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        indent = _indent(line)
        if indent <= header_indent:
            break
        if entry_indent is None:
            entry_indent = indent
        if indent <= entry_indent:
            match = _ARG_ENTRY_RE.match(line.strip())
            if match:
                current = match.group(1)
                parts[current] = [match.group(2).strip()]
                continue
        if current is not None:
            parts[current].append(line.strip())
    return {name: " ".join(p for p in ps if p) for name, ps in parts.items()}
