"""Instructions per step of PolyLoop with the memory journal, counted by valgrind's callgrind.

Wall and CPU time on a shared machine move by tens of percent from minute to minute; an
instruction count does not (the same program, inputs and environment give the same count, what
else the machine does notwithstanding). This measures the kernel's work per step two ways, each
as the difference between two child processes that differ only in the number of steps (start-up,
imports and warm-up cancel out):

- short runs: 101 runs of 20 steps minus 1 run of 20 steps, ÷ 2,000 steps;
- a long run: steps 1,000 to 3,000 of one run (a 3,000-step run minus a 1,000-step run),
  ÷ 2,000 steps — the work per step around step 2,000, with the whole history behind it.

Their ratio is the flatness of the work per step (1 = nothing is redone over the history).

And the durable journal's work against the memory journal's at 100 concurrent runs of 20 steps
(two batches minus one, ÷ 2,000 steps), per thread: the event loop's thread, and every other
thread (the SQLite writer; the memory journal has none). Where the time ratio of issue 4 moves by
half from one run to the next, this one does not, and it splits the work between the event loop
and the writer (which, under the interpreter lock, cannot run at the same time).

Only with ``valgrind`` on PATH; each child runs ≈ 50× slower under it. The children run two at a
time (a count does not depend on the load): about five minutes in all on two cores.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from ._measure import Spec

_THREAD = re.compile(r"^thread:\s*(\d+)", re.M)
_TOTALS = re.compile(r"^totals:\s*(\d+)", re.M)
_RUNS = 100  # concurrent runs, as in issue 4's target


def unavailable() -> str | None:
    """Why the count cannot be made here, or None."""
    return None if shutil.which("valgrind") else "valgrind is not installed"


def _instructions(spec: Spec, timeout_s: float) -> tuple[int, int]:
    """Instructions of one child: its main thread (the event loop's) and all its other threads."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    with tempfile.TemporaryDirectory(prefix="polyloop-callgrind-") as tmp:
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={os.path.join(tmp, 'out')}",
                sys.executable,
                "-m",
                "bench._child",
                json.dumps(dataclasses.asdict(spec)),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=root,
            env=env,
        )
        threads = {}  # callgrind's thread number -> its instructions
        for name in os.listdir(tmp):
            with open(os.path.join(tmp, name)) as f:
                text = f.read()
            number, total = _THREAD.search(text), _TOTALS.search(text)
            if number and total:
                threads[int(number.group(1))] = int(total.group(1))
    results = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or 1 not in threads or not results or not results[-1].get("ok"):
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
        raise RuntimeError(
            f"callgrind run of {spec.system} {spec.runs}×{spec.steps}×{spec.batches} failed: {tail}"
        )
    main = threads.pop(1)
    return main, sum(threads.values())


def measure(timeout_s: float = 1800.0) -> dict[str, Any]:
    """The counts and their ratios (see the module docstring)."""

    def spec(system: str, steps: int, batches: int, runs: int = 1) -> Spec:
        return Spec(system, "instructions", steps, runs=runs, batches=batches)

    specs = {
        "short_1": spec("polyloop", 20, 1),
        "short_101": spec("polyloop", 20, 101),
        "long_1000": spec("polyloop", 1000, 1),
        "long_3000": spec("polyloop", 3000, 1),
    }
    for system in ("polyloop", "polyloop_sqlite"):
        for batches in (1, 2):
            specs[f"{system}_{batches}"] = spec(system, 20, batches, runs=_RUNS)
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        futures = {k: pool.submit(_instructions, s, timeout_s) for k, s in specs.items()}
        counts = {k: f.result() for k, f in futures.items()}

    def per_step(a: str, b: str, steps: int) -> tuple[float, float]:
        return ((counts[a][0] - counts[b][0]) / steps, (counts[a][1] - counts[b][1]) / steps)

    short = sum(per_step("short_101", "short_1", 2000))
    long = sum(per_step("long_3000", "long_1000", 2000))
    memory = sum(per_step("polyloop_2", "polyloop_1", _RUNS * 20))
    loop, writer = per_step("polyloop_sqlite_2", "polyloop_sqlite_1", _RUNS * 20)
    return {
        "instructions_per_step_20": round(short),
        "instructions_per_step_2000": round(long),
        "flatness": round(long / short, 3),
        "durable": {
            "runs": _RUNS,
            "memory": round(memory),
            "sqlite_loop": round(loop),
            "sqlite_other": round(writer),
        },
    }
