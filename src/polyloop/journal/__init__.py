"""Journals: the write-ahead log of runs. ``MemoryJournal`` for tests and throwaway runs,
``SQLiteJournal`` for the embedded durable default, ``PostgresJournal`` for a journal shared
by many processes and machines (extra ``polyloop[postgres]``; loaded on first access, so
importing this package never imports psycopg)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._reading import STEP_USAGE_FIELDS
from .memory import MemoryJournal
from .sqlite import SQLiteJournal

if TYPE_CHECKING:
    from .postgres import PostgresJournal

__all__ = ["STEP_USAGE_FIELDS", "MemoryJournal", "PostgresJournal", "SQLiteJournal"]


def __getattr__(name: str) -> Any:
    if name == "PostgresJournal":
        from .postgres import PostgresJournal

        return PostgresJournal
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
