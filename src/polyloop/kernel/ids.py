"""Ids the kernel makes."""

from __future__ import annotations

import os

__all__ = ["new_id"]


def new_id() -> str:
    """A fresh globally unique id (run ids, intent ids, op ids): 128 random bits, as hex."""
    return os.urandom(16).hex()
