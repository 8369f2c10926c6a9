"""Batch throughput: runs/s of ``polyloop.batch`` on the local and Ray backends against the
ideal, with a simulated model latency. Standalone; not run in CI.

    python bench/batch_throughput.py                       # local + ray (if installed)
    python bench/batch_throughput.py --runs 400 --concurrency 64 --latency 0.05
    python bench/batch_throughput.py --backends local --journal memory

Each run makes ``--steps`` model calls (each sleeping ``--latency`` seconds; all but the last
call a no-op tool, the last gives the final answer). The ideal is what the model latency alone
allows: ``concurrency`` runs at a time, each taking ``steps × latency``, so a batch of R runs
cannot finish before ``ceil(R / concurrency) × steps × latency``. The ratio says how much of it
the backend delivers (journal writes, scheduling, Ray's RPCs are the rest). For Ray, "steady"
excludes starting the actors: it counts from the first run that ended to the last.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polyloop import Limits, Loop, ModelReply, ToolCall, ToolRegistry
from polyloop.batch import BatchProgress, run_batch
from polyloop.journal import MemoryJournal, SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest


def make_loop(journal: Any, *, latency_s: float, steps: int) -> Loop:
    """The benchmarked agent (module-level: Ray pickles it)."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def noop() -> str:
        """Do nothing."""
        return "ok"

    async def answer(request: ModelRequest) -> ModelReply:
        await asyncio.sleep(latency_s)
        if request.step_idx + 1 >= steps:
            return ModelReply(text="done")
        return ModelReply(tool_calls=(ToolCall("noop", {}, f"c{request.step_idx}"),))

    return Loop(FunctionModel(answer), tools=tools, journal=journal, limits=Limits(max_steps=steps))


async def measure(
    backend: str, journal_kind: str, runs: int, concurrency: int, latency: float, steps: int
) -> dict[str, float]:
    tag = f"{backend}-{time.monotonic_ns()}"
    goals = [f"{tag} goal {i}" for i in range(runs)]
    ends: list[float] = []
    done = 0

    def progress(p: BatchProgress) -> None:
        nonlocal done
        if p.done > done:
            done = p.done
            ends.append(time.perf_counter())

    factory = functools.partial(make_loop, latency_s=latency, steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        journal: Any = (
            MemoryJournal() if journal_kind == "memory" else SQLiteJournal(Path(tmp) / "j.db")
        )
        start = time.perf_counter()
        result = await run_batch(
            journal,
            goals,
            factory,
            concurrency=concurrency,
            backend="ray" if backend == "ray" else "local",
            limits=Limits(max_steps=steps),
            on_progress=progress,
        )
        wall = time.perf_counter() - start
        if isinstance(journal, SQLiteJournal):
            await journal.aclose()
    assert result.complete, result.summary()
    ideal_s = math.ceil(runs / concurrency) * steps * latency
    steady = (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 2 else float("nan")
    return {"wall_s": wall, "runs_s": runs / wall, "ideal_runs_s": runs / ideal_s, "steady": steady}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    ap.add_argument("--steps", type=int, default=3, help="model calls per run")
    ap.add_argument("--backends", default="local,ray")
    ap.add_argument("--journal", choices=("sqlite", "memory"), default="sqlite")
    args = ap.parse_args()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "ray" in backends:
        try:
            import ray
        except ImportError:
            print("ray is not installed (pip install 'polyloop[ray]'): skipping it")
            backends.remove("ray")
        else:
            if args.journal == "memory":
                sys.exit("the Ray backend needs a journal its workers can open: --journal sqlite")
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            ray.init(include_dashboard=False, log_to_driver=False)
    print(
        f"{args.runs} runs × {args.steps} model calls of {args.latency * 1000:.0f} ms, "
        f"concurrency {args.concurrency}, {args.journal} journal, {os.cpu_count()} CPUs"
    )
    print(f"{'backend':<8} {'wall s':>8} {'runs/s':>8} {'steady':>8} {'ideal':>8} {'ratio':>6}")
    for backend in backends:
        r = asyncio.run(
            measure(backend, args.journal, args.runs, args.concurrency, args.latency, args.steps)
        )
        print(
            f"{backend:<8} {r['wall_s']:>8.2f} {r['runs_s']:>8.1f} {r['steady']:>8.1f} "
            f"{r['ideal_runs_s']:>8.1f} {r['runs_s'] / r['ideal_runs_s']:>6.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
