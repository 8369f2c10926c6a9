"""The full check of a SQLite journal file (``polyloop check``): ``PRAGMA integrity_check`` on
a read-only connection."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass

from ..types import JournalError
from ._sqlite_damage import _is_damage
from ._sqlite_schema import _open_read_only


@dataclass(frozen=True, slots=True)
class IntegrityReport:
    """What :func:`check_integrity` found.

    Attributes:
        path: the file checked.
        sound: SQLite's ``integrity_check`` answered ``ok``: every page, b-tree, index entry
            and constraint is as the file format requires.
        problems: when not sound, what SQLite reported (at most ``max_problems`` lines, the
            first first); empty when sound.
        runs: the number of runs in the journal when it is sound, else None.
        immutable: the file was read ``immutable=1`` (a read-only folder; see
            ``SQLiteJournal(read_only=True)``).
    """

    path: str
    sound: bool
    problems: tuple[str, ...]
    runs: int | None
    immutable: bool = False


def check_integrity(path: str | os.PathLike[str], *, max_problems: int = 20) -> IntegrityReport:
    """Run SQLite's full ``PRAGMA integrity_check`` on the PolyLoop journal at ``path``,
    read-only: the journal is not created, written or repaired (a ``mode=ro`` connection,
    which in a writable folder leaves SQLite's empty ``-wal`` and ``-shm`` files as every
    reader does, or ``immutable=1`` in a read-only folder). It reads the whole file (≈ 13 s
    per GB measured, see the README) and blocks; from async code, call it with
    ``asyncio.to_thread``.

    A file SQLite cannot even open as a database (its header or schema damaged, or not SQLite
    at all) is reported not sound, with SQLite's message as the problem.

    Raises:
        JournalError: no file at ``path``; a sound SQLite database that is not a PolyLoop
            journal; a file that cannot be opened at all (permissions).
    """
    spath = os.fspath(path)
    try:
        conn, _, immutable = _open_read_only(spath, busy_timeout_s=30.0)
    except JournalError as exc:
        cause = exc.__cause__
        if cause is not None and _is_damage(cause):
            return IntegrityReport(spath, False, (str(cause),), None)
        raise
    with contextlib.closing(conn):
        try:
            rows = conn.execute(f"PRAGMA integrity_check({int(max_problems)})").fetchall()
        except sqlite3.DatabaseError as exc:  # SQLite may give up on the check itself
            if not _is_damage(exc):
                raise JournalError(f"cannot check the SQLite journal {spath}: {exc}") from exc
            return IntegrityReport(spath, False, (str(exc),), None, immutable)
        problems = tuple(str(row[0]) for row in rows)
        if problems != ("ok",):
            return IntegrityReport(spath, False, problems, None, immutable)
        runs = int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    return IntegrityReport(spath, True, (), runs, immutable)
