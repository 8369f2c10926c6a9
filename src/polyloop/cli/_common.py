"""What every verb of the ``polyloop`` command shares: one-line failures, running a library
call, and the --journal options."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from polyloop import PolyLoopError, RunDetached

from ._exit import ExitCode
from ._options import in_cli_words
from ._setup import DEFAULT_JOURNAL, JOURNAL_ENV, BadInput

T = TypeVar("T")

EXIT_INTERRUPTED = ExitCode.INTERRUPTED
EXIT_BAD_INPUT = ExitCode.BAD_INPUT
EXIT_NOT_ALL_ENDED = ExitCode.NOT_ALL_ENDED

# The commands that can also work on a PostgreSQL journal (they take RequestJournalOpt or
# ReadJournalOpt); the others refuse a postgresql:// --journal in one line naming these.
POSTGRES_COMMANDS = (
    "runs, show, stats, export, stop, cancel, pending, approve, deny, batch and recover"
)


def sqlite_journal(value: str) -> Path:
    """A SQLite-only command's ``--journal``: the path, or, for a PostgreSQL URI, one line
    naming the commands that take one (exit 1), before the URI can become a path."""
    from polyloop.batch._journals import is_postgres_spec

    if is_postgres_spec(value):
        raise fail(
            "this command works on SQLite journal files only; a postgresql:// --journal is "
            f"taken by {POSTGRES_COMMANDS} (pass a SQLite file)"
        )
    return Path(value)


JournalOpt = Annotated[
    Path | None,
    typer.Option(
        "--journal",
        parser=sqlite_journal,
        metavar="PATH",
        help=f"SQLite journal file (default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]
RequestJournalOpt = Annotated[
    str | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file, or a postgresql:// URI (needs pip install "
        f"'polyloop[postgres]'; default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]
ReadJournalOpt = RequestJournalOpt  # runs, show, stats, export: read-only on a SQLite file
ByOpt = Annotated[
    str | None,
    typer.Option("--by", help="Who asks, stored as requested_by (default: user@host pid N)."),
]


def fail(message: str) -> typer.Exit:
    """One line on stderr, in the command line's words (:func:`._options.in_cli_words`), and
    the exit of bad input (raise what it returns). A message of several lines (a database
    driver's) is joined into one."""
    line = "; ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"polyloop: {in_cli_words(line)}", file=sys.stderr)
    return typer.Exit(EXIT_BAD_INPUT)


def call(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a library call; library errors become one line on stderr and exit code 1."""
    try:
        return asyncio.run(fn())
    except RunDetached:
        raise  # not an error: the run command prints the resume command and exits 130
    except (BadInput, PolyLoopError, OSError) as exc:
        raise fail(str(exc)) from None


def journal_spec(journal: str | None, *, must_exist: bool) -> str:
    """The journal a writing command that also takes PostgreSQL uses: a postgresql:// URI as
    given, else the SQLite file's path (checked first: :func:`._check.refuse_damaged`)."""
    from polyloop.batch._journals import is_postgres_spec

    from ._check import refuse_damaged
    from ._setup import journal_path, no_journal

    if journal is not None and is_postgres_spec(journal):
        return journal
    path = journal_path(None if journal is None else Path(journal))
    if must_exist and not path.is_file():
        raise fail(no_journal(path))
    refuse_damaged(path)  # the commands that use this one write
    return str(path)


def when(epoch: float) -> str:
    """A moment as local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
