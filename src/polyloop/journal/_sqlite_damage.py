"""A SQLite file that SQLite itself reports damaged, and what a journal object does then.

SQLite answers ``SQLITE_CORRUPT`` (and its extended codes) or ``SQLITE_NOTADB`` when a page it
reads is not what the file format says it must be. It notices only the pages a statement
touches, so a journal can have written many commits into a file before one of them meets the
damage. From that moment the journal object is *damaged*: its writer and its readers refuse
every later call with the same :class:`JournalError` (a write already queued or in flight fails
with it, never retried), so nothing more lands in a file whose structure SQLite no longer
trusts. ``polyloop check`` (``check_integrity``) runs the full check.
"""

from __future__ import annotations

import sqlite3

from ..types import JournalError

_DAMAGE_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def _is_damage(exc: BaseException) -> bool:
    """Does ``exc`` say the file is damaged (``SQLITE_CORRUPT*``, ``SQLITE_NOTADB``)?"""
    code = getattr(exc, "sqlite_errorcode", None)
    return (
        isinstance(exc, sqlite3.DatabaseError)
        and isinstance(code, int)
        and (
            code & 0xFF in _DAMAGE_CODES  # the primary code of an extended one
        )
    )


def _damaged_error(path: str, cause: BaseException) -> JournalError:
    """The error every call on a damaged journal raises: what happened, and what to do."""
    err = JournalError(
        f"{path} is damaged (SQLite: {cause}); nothing more is written to it. Run `polyloop "
        f"check --journal {path}`; to recover, copy out what SQLite can still read (`sqlite3 "
        f"{path} .recover | sqlite3 recovered.db`) or restore a copy"
    )
    err.__cause__ = cause
    return err


class _Health:
    """Whether SQLite reported the file damaged, shared by one journal object's writer and
    readers. Once damaged it stays damaged (for this object; a new one on the same file finds
    the damage again where SQLite meets it). Read without a lock: it is set once, and a call
    that misses it is refused by the writer's own check before its batch."""

    __slots__ = ("_path", "cause")

    def __init__(self, path: str) -> None:
        self._path = path
        self.cause: BaseException | None = None

    def note(self, exc: BaseException) -> JournalError | None:
        """If ``exc`` reports damage: the journal is damaged from now on; the error to raise.
        None for any other failure."""
        if not _is_damage(exc):
            return None
        if self.cause is None:
            self.cause = exc
        return _damaged_error(self._path, exc)

    def error(self) -> JournalError:
        """The error to raise once damaged (a fresh one each time). Callers test ``cause``
        first: that is all a call on a sound journal pays."""
        assert self.cause is not None
        return _damaged_error(self._path, self.cause)
