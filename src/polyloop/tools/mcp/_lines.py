"""Splitting what a stdio server writes into lines, in time linear in their length and holding
at most ``limit`` bytes of one line: a longer line is dropped as it arrives, only its first and
last bytes kept (where a JSON-RPC answer names its request)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyloop.types import ConfigError

DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
"""The longest line (bytes, newline excluded) PolyLoop reads whole from a stdio MCP server.

A line is held whole while the SDK validates it, which costs about five times its size
(measured: +191 MiB peak RSS for a 40 MB line: its bytes, its text and the
``structuredContent`` copy of it SDK servers send). 64 MiB is far above what a capped text
answer needs (``max_output_chars`` keeps 20,000 characters by default; an SDK server sends a
20-million-character answer as a 40 MB line) and above a base64 image of 45 MB, which is
summarised anyway (saved under ``store_dir``, not kept in the observation); it bounds what
one answer can make PolyLoop hold to about 320 MiB."""
MIN_LINE_BYTES = 64 * 1024
"""The smallest ``max_line_bytes`` accepted (one read from the pipe)."""
KEPT_BYTES = 4096
"""Of a line longer than the limit: how many of its first and of its last bytes are kept."""


def check_max_line_bytes(where: str, value: object) -> None:
    """Raise ``ConfigError`` (naming ``where``) unless ``value`` is an int of at least
    :data:`MIN_LINE_BYTES`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_LINE_BYTES:
        raise ConfigError(
            f"{where}: max_line_bytes must be an int >= {MIN_LINE_BYTES}, got {value!r}"
        )


@dataclass(frozen=True)
class TooLong:
    """A line longer than the limit: its first and last :data:`KEPT_BYTES` bytes, and its
    length in bytes."""

    head: bytes
    tail: bytes
    size: int


class LineSplitter:
    """Turns chunks of a byte stream into its lines (without their newline), each a ``bytes``
    of at most ``limit`` bytes or a :class:`TooLong`. A line that ends within the chunk it
    began in is a slice of it; a longer one is joined once, when it ends (not per chunk: a
    ``bytearray`` would do, but pydantic copies one before parsing it)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._parts: list[bytes] = []
        self._held = 0  # bytes in _parts
        self._dropped: TooLong | None = None  # the line being dropped, while it lasts

    def feed(self, chunk: bytes) -> Sequence[bytes | TooLong]:
        """The lines ``chunk`` ends (the bytes after its last newline are kept for the next)."""
        if len(chunk) <= self._limit:  # each line it holds whole fits: split it at once
            whole = chunk.split(b"\n")
            rest = whole.pop()
            if whole and (self._parts or self._dropped is not None):
                self._add(whole[0])
                first = self._take()
                self._add(rest)
                return [first, *whole[1:]]
            self._add(rest)
            return whole
        lines: list[bytes | TooLong] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        self._add(chunk[start:])
        return lines

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        dropped = self._dropped
        if dropped is None and self._held + len(piece) <= self._limit:
            self._parts.append(piece)
            self._held += len(piece)
            return
        if dropped is None:  # this piece makes the line too long: drop what it held
            held = b"".join(self._parts)
            head = held[:KEPT_BYTES] + piece[: max(0, KEPT_BYTES - len(held))]
            dropped = TooLong(head, held[-KEPT_BYTES:], len(held))
            self._parts, self._held = [], 0
        if len(piece) >= KEPT_BYTES:
            tail = piece[-KEPT_BYTES:]
        else:
            tail = (dropped.tail + piece)[-KEPT_BYTES:]
        self._dropped = TooLong(dropped.head, tail, dropped.size + len(piece))

    def _take(self) -> bytes | TooLong:
        parts, dropped = self._parts, self._dropped
        self._parts, self._held, self._dropped = [], 0, None
        if dropped is not None:
            return dropped
        return parts[0] if len(parts) == 1 else b"".join(parts)
