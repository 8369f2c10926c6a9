"""The checks of a SQLite journal file: ``polyloop check`` (:func:`check_file`), and SQLite's
``quick_check`` before a command writes to it (:func:`refuse_damaged`).

SQLite notices damage only in the pages a statement reads, so a command could otherwise add a
run to a file whose other pages are damaged. The writing commands (run, resume, batch,
recover, approve, deny, stop, cancel) check the file first when it is small enough for the
check to cost little; ``SQLiteJournal`` itself never does (its open stays cheap). Measured
(``bench/journal_check.py``, results in ``bench/results/journal_check.md``): ≈ 1.7 ms per MB
on a warm page cache, 42 ms at 15 MB, 205 ms at 119 MB.
"""

from __future__ import annotations

import os
from pathlib import Path

from polyloop import JournalError
from polyloop.journal.sqlite import check_integrity, quick_check

from ._exit import ExitCode

__all__ = ["QUICK_CHECK_MAX_BYTES", "DamagedJournal", "check_file", "refuse_damaged"]

QUICK_CHECK_MAX_BYTES = 64 * 2**20
"""The largest journal (the file plus its ``-wal``, in bytes) checked before writing: 64 MiB,
≈ 110 ms. A larger one is not checked (``polyloop check`` checks it, in full)."""


class DamagedJournal(Exception):
    """The journal file a command was about to write is damaged; the message is the one line
    the user sees (exit code ``DAMAGED``)."""


def refuse_damaged(path: Path) -> None:
    """Before a command writes the SQLite journal at ``path``: SQLite's ``quick_check`` when
    the file exists and holds at most :data:`QUICK_CHECK_MAX_BYTES`. Nothing is written.

    Raises:
        DamagedJournal: SQLite reported the file damaged.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return  # a new journal
    with_wal = Path(f"{os.fspath(path)}-wal")
    size += with_wal.stat().st_size if with_wal.exists() else 0
    if size > QUICK_CHECK_MAX_BYTES:
        return
    try:
        problems = quick_check(path)
    except JournalError:
        return  # not a journal, or not even SQLite: opening it says so, in one line
    if problems:
        raise DamagedJournal(
            f"{path} is damaged (SQLite quick_check: {'; '.join(problems)}); nothing was "
            f"written; run `polyloop check --journal {path}` to see what can be read and how to "
            "recover"
        )


def check_file(path: Path) -> int:
    """``polyloop check`` of the SQLite journal at ``path``: prints one line on stdout, sound
    or what is damaged and what to do, and returns the exit code (``OK`` or ``DAMAGED``).

    Raises:
        JournalError: as :func:`polyloop.journal.sqlite.check_integrity`.
    """
    found = check_integrity(path)
    if found.sound:
        how = "; read immutable: its folder is not writable" if found.immutable else ""
        print(f"{path}: sound (integrity_check ok, {found.runs} runs{how})", flush=True)
        return ExitCode.OK
    shown = "; ".join(found.problems[:3])
    more = f" (and {len(found.problems) - 3} more)" if len(found.problems) > 3 else ""
    if found.unreadable_runs:  # SQLite's file is sound: only these runs' rows are not
        bad = len(found.unreadable_runs)
        print(
            f"{path}: DAMAGED: {bad} of {found.runs} runs cannot be read: {shown}{more}. "
            "SQLite finds the file itself sound: the other runs read, resume and can be "
            "written; these cannot be shown or resumed (restore them from a copy of the file)",
            flush=True,
        )
    else:
        print(
            f"{path}: DAMAGED: {shown}{more}. Stop using it (PolyLoop stops writing to it once "
            f"it meets the damage); recover what SQLite can read with `sqlite3 {path} .recover "
            "| sqlite3 recovered.db`, or restore a copy",
            flush=True,
        )
    return ExitCode.DAMAGED
