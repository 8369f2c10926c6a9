"""The checks of a SQLite journal file, on a read-only connection: the full one of ``polyloop
check`` (``PRAGMA integrity_check``, then every run decoded as the readers decode it) and
SQLite's ``quick_check`` alone, which the writing commands of ``polyloop`` run on small files
before they write (never ``SQLiteJournal`` itself: its open stays cheap)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import dataclass

from ..types import JournalError
from ._sqlite_damage import _is_damage
from ._sqlite_read import _read_run, _read_steps
from ._sqlite_schema import _open_read_only


@dataclass(frozen=True, slots=True)
class IntegrityReport:
    """What :func:`check_integrity` found.

    Attributes:
        path: the file checked.
        sound: SQLite's ``integrity_check`` answered ``ok`` (every page, b-tree, index entry
            and constraint is as the file format requires) and every run reads: its ``runs``
            row, its journal records (each body JSON of its row's kind, numbered 1, 2, ...)
            and its steps decode as ``SQLiteJournal.read`` and ``steps`` decode them (what
            ``polyloop show`` and ``resume`` read).
        problems: when not sound, what SQLite reported, or for each run that does not read
            the error its readers raise (at most ``max_problems`` lines, the first first);
            empty when sound.
        runs: the number of runs in the journal when SQLite's check passed, else None.
        immutable: the file was read ``immutable=1`` (a read-only folder; see
            ``SQLiteJournal(read_only=True)``).
        unreadable_runs: the runs that do not read (all of them, in the order of ``polyloop
            runs``) when SQLite's check passed; empty otherwise.
    """

    path: str
    sound: bool
    problems: tuple[str, ...]
    runs: int | None
    immutable: bool = False
    unreadable_runs: tuple[str, ...] = ()


def check_integrity(path: str | os.PathLike[str], *, max_problems: int = 20) -> IntegrityReport:
    """Run SQLite's full ``PRAGMA integrity_check`` on the PolyLoop journal at ``path``, then
    decode every run as the readers do (a body that is not JSON or not of its row's kind, a
    gap in the numbering, a damaged ``runs`` or ``steps`` row: the journal error ``read`` or
    ``steps`` would raise for that run). Read-only: the journal is not created, written or
    repaired (a ``mode=ro`` connection, which in a writable folder leaves SQLite's empty
    ``-wal`` and ``-shm`` files as every reader does, or ``immutable=1`` in a read-only
    folder). It reads the whole file and blocks (``integrity_check`` ≈ 13 s per GB, the
    decoding ≈ 65 ms of CPU per MB: see the README); from async code, call it with
    ``asyncio.to_thread``.

    A file SQLite cannot even open as a database (its header or schema damaged, or not SQLite
    at all) is reported not sound, with SQLite's message as the problem.

    Raises:
        JournalError: no file at ``path``; a sound SQLite database that is not a PolyLoop
            journal; a file that cannot be opened at all (permissions).
    """
    spath = os.fspath(path)
    opened = _open(spath)
    if isinstance(opened, IntegrityReport):
        return opened
    conn, immutable = opened
    with contextlib.closing(conn):
        problems = _pragma(conn, spath, "integrity_check", max_problems)
        if problems:
            return IntegrityReport(spath, False, problems, None, immutable)
        ids = [
            row[0] for row in conn.execute("SELECT run_id FROM runs ORDER BY created_at, run_id")
        ]
        unreadable: list[str] = []
        errors: list[str] = []
        for run_id in ids:
            try:
                _read_run(conn, run_id)
                _read_steps(conn, run_id)
            except JournalError as exc:
                unreadable.append(run_id)
                errors.append(str(exc))
    found = tuple(errors[: max(1, int(max_problems))])
    return IntegrityReport(spath, not unreadable, found, len(ids), immutable, tuple(unreadable))


def quick_check(path: str | os.PathLike[str], *, max_problems: int = 3) -> tuple[str, ...]:
    """SQLite's ``PRAGMA quick_check`` on the journal at ``path``, read-only as
    :func:`check_integrity`: what SQLite reported (at most ``max_problems`` lines), empty when
    it answered ``ok``. It checks every page and b-tree but neither the indexes against their
    tables nor the records' contents, and reads the whole file: ≈ 1.7 ms per MB measured
    (``bench/journal_check.py``).

    Raises:
        JournalError: the file cannot be opened as a PolyLoop journal (no file, not SQLite,
            its header or schema damaged, permissions), with the message ``SQLiteJournal``'s
            open gives.
    """
    spath = os.fspath(path)
    conn, _, _ = _open_read_only(spath, busy_timeout_s=30.0)
    with contextlib.closing(conn):
        return _pragma(conn, spath, "quick_check", max_problems)


def _open(path: str) -> tuple[sqlite3.Connection, bool] | IntegrityReport:
    """A read-only connection to the journal and whether it is ``immutable``; the report of a
    file too damaged to open."""
    try:
        conn, _, immutable = _open_read_only(path, busy_timeout_s=30.0)
    except JournalError as exc:
        cause = exc.__cause__
        if cause is not None and _is_damage(cause):
            return IntegrityReport(path, False, (str(cause),), None)
        raise
    return conn, immutable


def _pragma(conn: sqlite3.Connection, path: str, pragma: str, max_problems: int) -> tuple[str, ...]:
    """What SQLite's ``pragma`` check reported; empty for ``ok``."""
    try:
        rows = conn.execute(f"PRAGMA {pragma}({int(max_problems)})").fetchall()
    except sqlite3.DatabaseError as exc:  # SQLite may give up on the check itself
        if not _is_damage(exc):
            raise JournalError(f"cannot check the SQLite journal {path}: {exc}") from exc
        return (str(exc),)
    problems = tuple(str(row[0]) for row in rows)
    return () if problems == ("ok",) else problems
