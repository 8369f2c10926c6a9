"""How the ``polyloop`` command ends on an error: one line on stderr and an exit code
(:mod:`._exit`), never a traceback. Built on typer's public names only (``typer.Abort``,
``typer.BadParameter``, ``typer.CallbackParam``): typer runs on click, or, since 0.2x, on its
own copy of it, so click's exception classes are found as the ancestors of
``typer.BadParameter`` rather than imported from either.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import typer

from polyloop.types import first_invalid

from ._check import DamagedJournal
from ._exit import ExitCode
from ._options import in_cli_words
from ._setup import BadInput

__all__ = ["end", "valid_text"]


def _ancestor(name: str) -> Any:
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == name:
            return cls
    raise ImportError(f"typer.BadParameter has no ancestor {name}: this typer is not supported")


_USAGE_ERROR: Any = _ancestor("UsageError")  # a usage error: exit 2
_CLICK_EXCEPTION: Any = _ancestor("ClickException")  # any other error click reports itself


def end(invoke: Callable[[], Any]) -> int:
    """The exit code of the command line ``invoke`` runs (the root command's ``main`` with
    ``standalone_mode=False``), each error printed as one ``polyloop: ...`` line on stderr:

    - a usage error (unknown command or option, a missing or unknown value): ``USAGE``;
    - bad input (:class:`BadInput`) and any other error click reports: ``BAD_INPUT`` (or
      click's own code);
    - a damaged journal file (:class:`DamagedJournal`): ``DAMAGED``;
    - the end of input at a prompt (typer's ``Abort``): ``BAD_INPUT``, "aborted";
    - any other exception: ``BAD_INPUT``, naming its type and first line (a bug, in polyloop
      or in code it loaded: a ``--loop`` factory, a model).
    """
    try:
        return int(invoke() or 0)
    except _USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2: a group alone
            exc.show()
            return ExitCode.USAGE
        where = exc.ctx.command_path if exc.ctx is not None else "polyloop"
        # Typer words a value outside an option's choices as pydantic does: drop that.
        message = exc.format_message().replace(": Value error, ", ": ")
        _say(f"{message} (see {where} --help)")
        return ExitCode.USAGE
    except _CLICK_EXCEPTION as exc:
        _say(exc.format_message())
        return int(exc.exit_code)
    except BadInput as exc:
        _say(str(exc))
        return ExitCode.BAD_INPUT
    except DamagedJournal as exc:
        _say(str(exc))
        return ExitCode.DAMAGED
    except typer.Abort:
        _say("aborted: the input ended at a prompt (stdin closed?); nothing more was done")
        return ExitCode.BAD_INPUT
    except Exception as exc:  # a bug: one line, not a traceback (the user cannot act on it)
        first = (str(exc).strip().splitlines() or [""])[0]
        _say(
            f"unexpected error {type(exc).__name__}: {first or '(no message)'} (if it does not "
            "come from code polyloop loaded, such as a --loop factory, please report it)"
        )
        return ExitCode.BAD_INPUT


def _say(line: str) -> None:
    print(f"polyloop: {in_cli_words(line)}", file=sys.stderr, flush=True)


def valid_text(param: typer.CallbackParam, value: str | None) -> str | None:
    """The callback of every argument naming a stored id (RUN_ID, OP_ID): a value that is not
    valid Unicode (bytes that are not UTF-8 on the command line arrive as lone surrogates) is
    :class:`BadInput`, since no journal can hold such an id."""
    if value is None:
        return None
    name = (param.name or "id").upper()
    where = first_invalid(value, name)
    if where is not None:
        raise BadInput(
            f"{where} is not valid Unicode (a byte that is not UTF-8 on the command line), so "
            f"no journal holds such an id: copy it from polyloop runs or polyloop pending"
        )
    return value
