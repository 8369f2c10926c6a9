"""The ``polyloop`` command (extra ``polyloop[cli]``): a caller of the public API."""

from __future__ import annotations

import sys

__all__ = ["main"]


def main() -> None:
    """Entry point of the ``polyloop`` command."""
    try:
        from .app import app
    except ModuleNotFoundError as exc:  # typer/rich are an extra
        if exc.name in ("typer", "rich", "click"):
            print(
                "the polyloop command needs the cli extra: pip install 'polyloop[cli]'",
                file=sys.stderr,
            )
            raise SystemExit(1) from None
        raise
    from ._warnings import show_warnings

    show_warnings()
    app(prog_name="polyloop")
