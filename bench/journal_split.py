"""Where a durable step's time goes under concurrency: the event loop's thread against the
SQLite writer thread. Standalone; not run in CI.

    python -m bench.journal_split                       # 200 runs x 20 steps, 50 ms model
    python -m bench.journal_split --runs 1000 --reps 3

Each configuration runs in a process of its own (a 5-step warm-up first, on a throwaway
journal), as ``python -m bench`` does, with the ``polyloop_sqlite`` system's loop, model and
tool (bench/sys_polyloop.py). Printed per configuration: wall time ÷ ideal (20 × the model's
latency), the event loop thread's CPU per step (``thread_time``), the other threads' CPU per
step (``process_time`` minus it: SQLite's writer thread), commits per step, and the load
average at the end (a shared machine: read CPU next to wall time).

The configurations:

- ``memory``: ``MemoryJournal``, the reference.
- ``sqlite``: ``SQLiteJournal(durability="full")``.
- ``memory-suspend``: ``MemoryJournal`` whose ``append`` waits one turn of the event loop
  (``call_soon``), as a durable ``append`` does: the cost of suspending the run three times
  per step.
- ``memory-prepare``: that, plus the SQLite journal's preparation of every append's rows
  (canonical JSON of the records, the ``steps`` row, the accounts) on the event loop, then
  dropped: the cost of preparing.
- ``sqlite-no-sql``: the same journal with a writer thread that answers every ``append`` at
  once, running no SQL for it (``create``, ``release`` and the other writes still run): a
  probe, not a journal. What it leaves is the event loop's own share of a durable step
  (preparing the rows, handing them over, waiting for the answers), i.e. the least any writer
  that works off the interpreter lock (another process, another core) could cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from polyloop import Limits, Loop
from polyloop.journal import MemoryJournal, SQLiteJournal
from polyloop.journal import _sqlite_writer as writer_module
from polyloop.journal.sqlite import _prepare
from polyloop.types import Lease, Record

from .sys_polyloop import _model, _tools

CONFIGS = ("memory", "memory-suspend", "memory-prepare", "sqlite", "sqlite-no-sql")
STEPS = 20


def _answer_appends_at_once() -> None:
    """Patch this process's writer thread: ``append`` jobs are answered without running SQL."""
    real = writer_module._Writer._run_batch

    def run_batch(self: Any, jobs: list[Any]) -> None:
        appends = [j for j in jobs if j.fn.__qualname__.startswith("_append_fn")]
        others = [j for j in jobs if j not in appends]
        self._resolve([(job, True, None) for job in appends])
        if others:
            real(self, others)

    writer_module._Writer._run_batch = run_batch  # type: ignore[method-assign]


class _Suspending(MemoryJournal):
    """``MemoryJournal`` whose ``append`` returns one turn of the event loop later."""

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        await super().append(lease, records)
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        loop.call_soon(turn.set_result, None)
        await turn


class _Preparing(_Suspending):
    """``_Suspending`` that also prepares the SQLite journal's rows of every append."""

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        _prepare(lease, records)
        await super().append(lease, records)


async def _batch(loop: Loop, runs: int, steps: int) -> None:
    limits = Limits(max_steps=steps)
    await asyncio.gather(*(loop.run("bench", limits=limits) for _ in range(runs)))


async def _one(config: str, runs: int, latency_s: float) -> dict[str, Any]:
    if config == "sqlite-no-sql":
        _answer_appends_at_once()
    tools = _tools()
    with tempfile.TemporaryDirectory(prefix="polyloop-split-") as tmp:

        def journal(name: str) -> MemoryJournal | SQLiteJournal:
            if config.startswith("memory"):
                kinds = {"memory-suspend": _Suspending, "memory-prepare": _Preparing}
                return kinds.get(config, MemoryJournal)()
            return SQLiteJournal(os.path.join(tmp, name), durability="full")

        warm = journal("warm.db")
        await _batch(Loop(_model(5, 0.0), tools=tools, journal=warm), 1, 5)
        if isinstance(warm, SQLiteJournal):
            await warm.aclose()
        measured = journal("journal.db")
        loop = Loop(_model(STEPS, latency_s), tools=tools, journal=measured)
        w0, t0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        await _batch(loop, runs, STEPS)
        w1, t1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
        commits = measured.commits if isinstance(measured, SQLiteJournal) else 0
        if isinstance(measured, SQLiteJournal):
            await measured.aclose()
    steps = runs * STEPS
    return {
        "config": config,
        "wall_over_ideal": (w1 - w0) / (STEPS * latency_s),
        "loop_us": 1e6 * (t1 - t0) / steps,
        "others_us": max(0.0, 1e6 * ((p1 - p0) - (t1 - t0)) / steps),
        "commits_per_step": commits / steps,
        "load": os.getloadavg()[0],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: one configuration
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(asyncio.run(_one(args.one, args.runs, args.latency_ms / 1000))))
        return 0
    configs = args.configs.split(",")
    unknown = sorted(set(configs) - set(CONFIGS))
    if unknown:
        print(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
        return 2
    print(
        f"{args.runs} concurrent runs x {STEPS} steps, model latency {args.latency_ms:g} ms\n\n"
        "| configuration | wall ÷ ideal | event loop CPU µs/step | other threads CPU µs/step "
        "| commits/step | load |\n|---|---|---|---|---|---|"
    )
    for _ in range(args.reps):
        for config in configs:  # interleaved: a burst of load spreads over all of them
            out = subprocess.run(
                [
                    *(sys.executable, "-m", "bench.journal_split", "--one", config),
                    *("--runs", str(args.runs), "--latency-ms", str(args.latency_ms)),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(
                f"| {r['config']} | {r['wall_over_ideal']:.2f} | {r['loop_us']:.0f} "
                f"| {r['others_us']:.0f} | {r['commits_per_step']:.3f} | {r['load']:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
