"""``python -m bench.journal_split`` cannot rot: it runs each configuration in a child process
and prints one table row for each. Never asserts a timing: the numbers depend on the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def split(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m bench.journal_split ARGS`` with this checkout's code."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "bench.journal_split", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_every_configuration_prints_a_row_and_the_probe_skips_the_appends_sql() -> None:
    proc = split("--runs", "5", "--latency-ms", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {
        cells[0]: cells[1:]
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| configuration")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {"memory", "memory-suspend", "memory-prepare", "sqlite", "sqlite-no-sql"}
    commits = {name: float(cells[3]) for name, cells in rows.items()}
    assert commits["memory"] == 0
    # The real journal commits every step's appends; the probe only the runs' create and
    # release (5 runs x 20 steps: at most 2 commits per run).
    assert commits["sqlite"] > commits["sqlite-no-sql"]
    assert commits["sqlite-no-sql"] <= 2 * 5 / (5 * 20)


def test_an_unknown_configuration_is_refused_in_one_line() -> None:
    proc = split("--configs", "memory,nope")
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        "unknown configuration(s) ['nope']; choose from ['memory', 'memory-suspend', "
        "'memory-prepare', 'sqlite', 'sqlite-no-sql']"
    ]
