"""The cap on what one tool call shows the model, shared by the workspace tools' shell and the
tools of MCP servers: of text longer than the cap, the first half and the last half are kept
(the end of a build, a test run or a listing says the most) and the characters in between
are counted, for ``Outcome.truncated_chars``."""

from __future__ import annotations

from polyloop.types import ConfigError

__all__ = ["DEFAULT_MAX_OUTPUT_CHARS", "MIN_OUTPUT_CHARS", "HeadTail", "check_max_output_chars"]

DEFAULT_MAX_OUTPUT_CHARS = 20_000
"""The most characters of output one tool call shows, unless its tools are told otherwise."""
MIN_OUTPUT_CHARS = 100
"""The smallest cap a tool set accepts (a smaller one would cut its own notes)."""


def check_max_output_chars(where: str, value: object, *, optional: bool = False) -> None:
    """Raise ``ConfigError`` (naming ``where``) unless ``value`` is an int of at least
    :data:`MIN_OUTPUT_CHARS` (or None, when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_OUTPUT_CHARS:
        none = " or None (no cap)" if optional else ""
        raise ConfigError(
            f"{where}: max_output_chars must be an int >= {MIN_OUTPUT_CHARS}{none}, got {value!r}"
        )


class HeadTail:
    """Keeps the first ``limit // 2`` and the last ``limit - limit // 2`` characters of the
    text added to it, piece by piece; counts them all."""

    def __init__(self, limit: int) -> None:
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap
        self.head = ""
        self.tail = ""
        self.total = 0

    def add(self, text: str) -> None:
        self.total += len(text)
        if len(self.head) < self._head_cap:
            room = self._head_cap - len(self.head)
            self.head += text[:room]
            text = text[room:]
        if len(text) >= self._tail_cap:
            self.tail = text[len(text) - self._tail_cap :]
        elif text:
            self.tail = (self.tail + text)[-self._tail_cap :]

    @property
    def omitted(self) -> int:
        """Characters between ``head`` and ``tail`` that were not kept."""
        return self.total - len(self.head) - len(self.tail)
