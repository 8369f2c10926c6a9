"""Journals: the write-ahead log of runs. ``MemoryJournal`` for tests and throwaway runs,
``SQLiteJournal`` for the embedded durable default."""

from .memory import MemoryJournal
from .sqlite import SQLiteJournal

__all__ = ["MemoryJournal", "SQLiteJournal"]
