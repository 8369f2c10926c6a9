"""Journals: the write-ahead log of runs. ``MemoryJournal`` for tests and throwaway runs."""

from .memory import MemoryJournal

__all__ = ["MemoryJournal"]
