"""The one exception the commands' checks raise (kept apart so that every module of the
command can raise it without importing the modules that build runs)."""

from __future__ import annotations

__all__ = ["BadInput"]


class BadInput(Exception):
    """Input the command cannot act on; its message is the one line the user sees."""
