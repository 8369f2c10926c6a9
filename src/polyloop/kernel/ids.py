"""Ids the kernel makes."""

from __future__ import annotations

import os
import random

__all__ = ["new_id"]

# 128 bits per id from a generator seeded with 256 bits of the operating system's randomness,
# seeded again in every forked child (a child must not repeat its parent's ids). Ids are
# unique, not secret: nothing in PolyLoop treats an id as a credential. One call into C per id
# (safe across threads: the interpreter lock is held through it), where ``os.urandom`` is a
# system call per id, and a slow one when many threads make ids at once.
_random = random.Random(os.urandom(32))
_bits = _random.getrandbits


def _reseed() -> None:
    _random.seed(os.urandom(32))


os.register_at_fork(after_in_child=_reseed)


def new_id() -> str:
    """A fresh globally unique id (run ids, intent ids, op ids): 128 random bits, as 32 hex
    digits."""
    return f"{_bits(128):032x}"
