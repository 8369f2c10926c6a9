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
Only with ``valgrind`` on PATH; each child runs ≈ 50× slower under it (about two minutes in all).
"""

from __future__ import annotations

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

_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def unavailable() -> str | None:
    """Why the count cannot be made here, or None."""
    return None if shutil.which("valgrind") else "valgrind is not installed"


def _instructions(spec: Spec, timeout_s: float) -> int:
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
    found = _COLLECTED.findall(proc.stderr)
    results = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not found or not results or not results[-1].get("ok"):
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
        raise RuntimeError(f"callgrind run of {spec.steps}×{spec.batches} failed: {tail}")
    return int(found[-1])


def measure(timeout_s: float = 1800.0) -> dict[str, Any]:
    """The two counts and their ratio (see the module docstring)."""

    def spec(steps: int, batches: int) -> Spec:
        return Spec("polyloop", "instructions", steps, batches=batches)

    short = (_instructions(spec(20, 101), timeout_s) - _instructions(spec(20, 1), timeout_s)) / 2000
    long = (
        _instructions(spec(3000, 1), timeout_s) - _instructions(spec(1000, 1), timeout_s)
    ) / 2000
    return {
        "instructions_per_step_20": round(short),
        "instructions_per_step_2000": round(long),
        "flatness": round(long / short, 3),
    }
