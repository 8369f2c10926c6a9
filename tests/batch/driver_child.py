"""A batch driver in its own process, for the killed-driver test: ``python -m
tests.batch.driver_child JOURNAL_SPEC EFFECTS N LATENCY CONCURRENCY STALL_FROM`` (runs ``task K``
and later hang in their step-1 model call, so the kill finds them mid-run)."""

from __future__ import annotations

import asyncio
import functools
import sys

from polyloop.batch import open_journal, run_batch
from tests.batch import world


def goals(n: int) -> list[str]:
    return [f"task {i}" for i in range(n)]


async def main(
    journal: str, effects: str, n: int, latency: float, concurrency: int, stall_from: int
) -> None:
    j = open_journal(journal)  # a SQLite path or a PostgreSQL spec
    try:
        make_loop = functools.partial(
            world.make_loop, effects=effects, latency_s=latency, stall_from=stall_from
        )
        result = await run_batch(
            j, goals(n), make_loop, concurrency=concurrency, limits=world.LIMITS
        )
        print(result.summary(), flush=True)
    finally:
        await j.aclose()


if __name__ == "__main__":
    j, fx, n, lat, conc, stall = sys.argv[1:7]
    asyncio.run(main(j, fx, int(n), float(lat), int(conc), int(stall)))
