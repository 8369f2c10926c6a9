"""Importing the package of an optional extra on first use (layout.md rule 6)."""

from __future__ import annotations

import importlib
from collections.abc import Collection
from types import ModuleType


def import_extra(name: str, hint: str, *, missing: Collection[str] = ()) -> ModuleType:
    """Import module ``name`` of an optional extra.

    Raises:
        ImportError: ``hint`` (the install line) alone when the extra is not installed — the
            module that could not be found is ``name`` or one of ``missing``; ``hint`` with
            the error when it is installed but failed to import.
    """
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if exc.name == name or exc.name in missing:
            raise ImportError(hint) from None
        raise ImportError(f"{hint} (importing it failed: {exc})") from exc
