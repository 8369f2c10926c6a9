"""The ``polyloop`` command: each command parses, makes one library call, and renders.

The verbs live by group: running (``run``, ``resume``, ``demo``, ``tools``: :mod:`._running`),
control (``stop``, ``cancel``, ``limits``, ``pending``, ``approve``, ``deny``:
:mod:`._control`), reading (``runs``, ``show``, ``stats``, ``export``, ``view``, ``report``,
``check``: :mod:`._reading`) and many runs (``batch``, ``recover``: :mod:`._batch`); ``run``
and ``batch`` share one definition of the run options (:mod:`._options`). This module makes the
root command and registers them, in the order ``--help`` lists them.

Exit codes: the table in :mod:`._exit` (``polyloop --help`` and the README list it). Help
texts are plain text, never Rich markup, so ``pip install 'polyloop[ray]'`` shows as written.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from . import _batch, _control, _reading, _running
from ._errors import end
from ._exit import epilog, exit_code

__all__ = ["app", "exit_code"]


class _Group(TyperGroup):
    """The root command. Every error ends as one line on stderr and an exit code
    (:func:`._errors.end`); ``polyloop`` alone prints the help."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        code = end(
            lambda: super(_Group, self).main(
                args, prog_name, complete_var, standalone_mode=False, **extra
            )
        )
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="polyloop",
    help="Run, resume and inspect agent runs. New here? Run: polyloop demo",
    epilog=epilog(),
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[ray]" is text, not a Rich style
)


def _show_version(value: bool) -> None:
    if value:
        from polyloop import __version__

        print(f"polyloop {__version__}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Run, resume and inspect agent runs. ``polyloop`` alone prints the help (exit 0)."""
    if ctx.invoked_subcommand is None:
        print(ctx.get_help())
        raise typer.Exit(0)


for _command in (
    _running.demo,
    _running.run,
    _running.resume,
    _running.tools,
    _control.stop,
    _control.cancel,
    _control.limits,
    _control.pending,
    _control.approve,
    _control.deny,
    _reading.runs,
    _reading.show,
    _reading.stats,
    _reading.export,
    _reading.view,
    _reading.report,
    _batch.batch,
    _batch.recover,
    _reading.check,
):
    app.command()(_command)
