"""Stop latency: how long a run advanced by another process takes to end after ``polyloop stop``
(or ``polyloop cancel``) wrote its request. Standalone; not run in CI.

    python bench/stop_latency.py                                  # SQLite, 30 s lease, 5 runs
    python bench/stop_latency.py --lease-ttl 3 --step-ms 50 --reps 10
    python bench/stop_latency.py --pg-dsn postgresql://user@host/db --kind cancel

For each repetition an owner process starts a run whose every step takes ``--step-ms`` (a tool
that sleeps) and renews its lease every ``--lease-ttl / 3`` seconds; once it has made a few
steps and a random part of one heartbeat interval more, ``python -m polyloop.cli stop RUN
--reason ...`` runs as a separate process, and this script polls the journal until the run's
end record is there. Printed per run: the latency,
``ended_at - requested_at`` of the run's row (both this machine's clock), and the command's
own time (a Python start included). The owner learns of a request with its next heartbeat, so
the latency is at most the heartbeat interval plus, for ``stop``, the rest of the step in
flight (and the end record's commit, a few ms); on average half the interval.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polyloop import Limits, Loop, ModelReply, ToolCall, ToolRegistry
from polyloop.testing import FunctionModel

ROOT = Path(__file__).resolve().parents[1]

_OWNER = """
import asyncio, sys
sys.path[:0] = [sys.argv[1]]
from bench.stop_latency import owner_loop
from polyloop.batch import open_journal

async def main(spec, run_id, step_ms, ttl):
    journal = open_journal(spec)
    loop = owner_loop(journal, float(step_ms) / 1000, float(ttl))
    r = await loop.run("tick until stopped", run_id=run_id)
    print(r.stop_reason, r.steps_used, flush=True)
    await journal.aclose()

asyncio.run(main(*sys.argv[2:]))
"""


def owner_loop(journal: Any, step_s: float, ttl_s: float) -> Loop:
    """The owner's Loop: every step is a tool call that sleeps ``step_s`` (module-level: the
    owner process imports it)."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def tick() -> str:
        """One step of work."""
        await asyncio.sleep(step_s)
        return "ticked"

    model = FunctionModel(lambda r: ModelReply(tool_calls=(ToolCall("tick", {}, None),)))
    limits = Limits(max_steps=10**9)
    return Loop(model, tools=tools, journal=journal, limits=limits, lease_ttl_s=ttl_s)


async def _until(journal: Any, run_id: str, done: Any) -> dict[str, Any]:
    """The run's row once ``done(row)`` holds (polled every 2 ms)."""
    while True:
        rows = await journal.list_runs(run_id=run_id)
        if rows and done(rows[0]):
            return dict(rows[0])
        await asyncio.sleep(0.002)


async def one(spec: str, run_id: str, kind: str, step_ms: float, ttl: float) -> tuple[float, float]:
    """(seconds from the request (``requested_at``) to the end record (``ended_at``), the
    command's own seconds)."""
    from polyloop.batch import open_journal

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OWNER, str(ROOT), spec, run_id, str(step_ms), str(ttl),
        env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    journal = open_journal(spec)
    try:
        await _until(journal, run_id, lambda row: row["steps_used"] >= 3)
        # The request comes at a random point of the owner's heartbeat cycle, as it would.
        await asyncio.sleep(random.uniform(0, ttl / 3))
        argv = [sys.executable, "-m", "polyloop.cli", kind, run_id, "--journal", spec]
        if kind == "stop":
            argv += ["--reason", "latency benchmark"]
        t0 = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run, argv, env=env, capture_output=True, text=True, check=True
        )
        command = time.monotonic() - t0
        assert "request written" in done.stdout, done.stdout
        row = await _until(journal, run_id, lambda row: row["status"] == "ended")
        out, _ = await asyncio.wait_for(owner.communicate(), 60)
        assert out.split()[0] == (b"stopped" if kind == "stop" else b"cancelled"), out
        # Both clocks are this machine's time.time(): the requester's and the owner's.
        return row["ended_at"] - row["requested_at"], command
    finally:
        if owner.returncode is None:
            owner.kill()
            await owner.wait()
        await journal.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--lease-ttl", type=float, default=30.0, help="owner's lease_ttl_s")
    parser.add_argument("--step-ms", type=float, default=20.0, help="each step's tool time")
    parser.add_argument("--kind", choices=["stop", "cancel"], default="stop")
    parser.add_argument("--pg-dsn", default=None, help="a PostgreSQL journal instead of SQLite")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = args.pg_dsn or str(Path(tmp) / "latency.db")
        print(
            f"{'PostgreSQL' if args.pg_dsn else 'SQLite'} journal, {args.kind}, lease_ttl_s "
            f"{args.lease_ttl} (heartbeat every {args.lease_ttl / 3:.2f} s), steps of "
            f"{args.step_ms:.0f} ms"
        )
        waits = []
        for i in range(args.reps):
            run_id = f"latency-{os.getpid()}-{time.time_ns()}-{i}"
            wait, command = await one(spec, run_id, args.kind, args.step_ms, args.lease_ttl)
            waits.append(wait)
            print(f"  run {i}: ended {wait * 1000:7.0f} ms after the request was written "
                  f"(the command took {command * 1000:.0f} ms)")  # fmt: skip
        print(
            f"median {statistics.median(waits) * 1000:.0f} ms, max {max(waits) * 1000:.0f} ms; "
            f"bound: heartbeat {args.lease_ttl / 3 * 1000:.0f} ms + one step"
        )


if __name__ == "__main__":
    asyncio.run(main())
