"""A child process for the crash-injection harness: runs the contract scenario of
tests/contract/test_resume.py on a SQLite journal and kills itself with SIGKILL just before
or just after its n-th journal write. Tool side effects go to a file, which survives.

    python -m tests.durability.crash_child JOURNAL N before|after EFFECTS

JOURNAL is a SQLite file, or ``postgres:DSN`` for a PostgresJournal on that DSN.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from polyloop.journal import SQLiteJournal
from tests.contract.test_resume import World, new_loop


class Logged(list[str]):
    """A side-effect log that is on disk before the tool returns."""

    def __init__(self, tag: str, path: str) -> None:
        super().__init__()
        self.tag, self.path = tag, path

    def append(self, item: str) -> None:
        super().append(item)
        with open(self.path, "a") as f:
            f.write(f"{self.tag} {item}\n")
            f.flush()
            os.fsync(f.fileno())


class Dying:
    """Delegates to the journal; SIGKILLs the process around its n-th append."""

    def __init__(self, inner: Any, n: int, after: bool) -> None:
        self.inner, self.n, self.after, self.count = inner, n, after, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, lease: Any, records: Sequence[Any]) -> None:
        self.count += 1
        if self.count == self.n and not self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        await self.inner.append(lease, records)
        if self.count == self.n and self.after:
            os.kill(os.getpid(), signal.SIGKILL)


def open_journal(path: str) -> Any:
    if path.startswith("postgres:"):
        from polyloop.journal import PostgresJournal

        return PostgresJournal(path.removeprefix("postgres:"))
    return SQLiteJournal(path)


async def main(path: str, n: int, after: bool, effects: str, run_id: str = "r") -> None:
    world = World()
    world.charged = Logged("charged", effects)
    world.stored = Logged("stored", effects)
    await new_loop(world, Dying(open_journal(path), n, after)).run("pay", run_id=run_id)
    sys.exit(3)  # not reached while n is within the run's writes


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "after", sys.argv[4]))
