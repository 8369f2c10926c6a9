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

EXIT_UNKNOWN_REASON = ExitCode.UNKNOWN_REASON
EXIT_INTERRUPTED = ExitCode.INTERRUPTED
EXIT_BAD_INPUT = ExitCode.BAD_INPUT
EXIT_NOT_ALL_ENDED = ExitCode.NOT_ALL_ENDED

JournalOpt = Annotated[
    Path | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file (default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]
# The commands that can also work on a PostgreSQL journal.
RequestJournalOpt = Annotated[
    str | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file, or a postgresql:// URI (needs pip install "
        f"'polyloop[postgres]'; default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]
ByOpt = Annotated[
    str | None,
    typer.Option("--by", help="Who asks, stored as requested_by (default: user@host pid N)."),
]


def fail(message: str) -> typer.Exit:
    """One line on stderr, in the command line's words (:func:`._options.in_cli_words`), and
    the exit of bad input (raise what it returns)."""
    print(f"polyloop: {in_cli_words(message)}", file=sys.stderr)
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
    from ._setup import journal_path

    if journal is not None and is_postgres_spec(journal):
        return journal
    path = journal_path(None if journal is None else Path(journal))
    if must_exist and not path.is_file():
        raise fail(f"no journal at {path} (pass --journal PATH or set ${JOURNAL_ENV})")
    refuse_damaged(path)  # the commands that use this one write
    return str(path)


def when(epoch: float) -> str:
    """A moment as local time, to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))
