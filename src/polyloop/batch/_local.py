"""The local backend: runs executed on this event loop by one ``Loop``, ``concurrency`` at a
time."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._drive import Tracker, drive_run
from ._journals import LoopFactory, resolve_factory

__all__ = ["run_local"]


async def run_local(
    journal: Any,
    run_ids: Sequence[str],
    make_loop: LoopFactory,
    *,
    concurrency: int,
    tracker: Tracker,
) -> None:
    """Drive ``run_ids`` to their ends, at most ``concurrency`` at once.

    Cancelled: a graceful shutdown — no new run starts, every active run is detached (it
    stops at its next step boundary, writes no end record, releases its lease: resumable),
    and once they have all stopped ``CancelledError`` propagates. Cancelled again while
    waiting for them: the active runs are cancelled (they end ``cancelled``)."""
    if not run_ids:
        return
    loop = resolve_factory(make_loop)(journal)
    pending = iter(run_ids)
    active: set[str] = set()
    stopping = False

    async def worker() -> None:
        # One iterator shared by the workers: each id is taken once. The next id is taken
        # before the outcome is counted, so that both are told in one snapshot.
        run_id = None if stopping else next(pending, None)
        if run_id is not None:
            tracker.started(run_id)
        while run_id is not None:
            active.add(run_id)
            try:
                outcome = await drive_run(loop, run_id)
            finally:
                active.discard(run_id)
            run_id = None if stopping else next(pending, None)
            tracker.finished(outcome, then=run_id)

    tasks = [asyncio.ensure_future(worker()) for _ in range(min(concurrency, len(run_ids)))]
    try:
        try:
            await asyncio.wait(tasks)  # unlike gather, being cancelled leaves the tasks alone
        except asyncio.CancelledError:
            stopping = True
            while not all(task.done() for task in tasks):
                # Again and again: a run still acquiring its lease registers only later.
                for run_id in list(active):
                    loop.detach(run_id)
                await asyncio.wait(tasks, timeout=0.1)
            raise
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        task.result()  # a bug in the worker itself (drive_run catches run failures)
