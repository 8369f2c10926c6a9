"""What every system module shares: the fake script, timing, and SQLite file sizes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

TOOL_NAME = "noop"
TOOL_RESULT = "ok"
FINAL_ANSWER = "done"
GOAL = "Call the noop tool until told otherwise, then answer."


def is_final(step_idx: int, steps: int) -> bool:
    """The script every fake model follows: ``steps`` model calls per run, the first
    ``steps - 1`` return one call to the no-op tool, the last a final answer."""
    return step_idx >= steps - 1


@dataclass
class Spec:
    """One configuration, as the parent hands it to a child (JSON)."""

    system: str
    scenario: str  # single | concurrent | durable | resume
    steps: int  # model calls per run
    runs: int = 1  # concurrent runs per batch
    batches: int = 1  # batches run one after the other (to measure short runs precisely)
    latency_ms: float = 0.0
    durability: str = "full"  # SQLite systems
    group_commit: bool = True
    workdir: str = "."

    @property
    def model_calls(self) -> int:
        return self.steps * self.runs * self.batches


@dataclass
class Measured:
    """What a system module reports for its measured section."""

    wall_s: float
    cpu_s: float
    extra: dict[str, Any] = field(default_factory=dict)


async def timed(go: Callable[[], Awaitable[Any]]) -> tuple[float, float, Any]:
    """Wall and CPU seconds (``process_time``: every thread of this process) of ``await go()``."""
    c0, w0 = time.process_time(), time.perf_counter()
    value = await go()
    w1, c1 = time.perf_counter(), time.process_time()
    return w1 - w0, c1 - c0, value


def sqlite_bytes(path: str) -> int:
    """Size of a SQLite database with its WAL (and rollback journal), in bytes."""
    total = 0
    for suffix in ("", "-wal", "-journal"):
        with contextlib.suppress(OSError):
            total += os.path.getsize(path + suffix)
    return total


def stored_bytes(path: str) -> int:
    """Size of the database after a full checkpoint into the main file (WAL truncated)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return sqlite_bytes(path)
