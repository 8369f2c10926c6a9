"""The benchmark runner cannot rot: ``python -m bench --quick`` runs end to end (seconds) and
writes its JSON and Markdown. Never asserts a timing: the numbers depend on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = "floor,floor_sqlite,polyloop,polyloop_sqlite"


def test_quick_run_writes_json_and_ratio_tables(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--systems", SYSTEMS, "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]

    doc = json.loads((tmp_path / "latest.json").read_text())
    assert doc["quick"] is True
    assert {"generated_at", "machine", "plan", "reps", "results", "raw", "skipped"} <= set(doc)
    assert doc["machine"]["python"] and doc["machine"]["sqlite"]
    failures = [r for r in doc["raw"] if not r["ok"]]
    assert not failures, failures
    scenarios = {(r["scenario"], r["system"]) for r in doc["results"]}
    assert {
        ("single", "floor"),
        ("single", "polyloop"),
        ("single", "polyloop_sqlite"),
        ("single", "floor_sqlite"),
        ("concurrent", "polyloop"),
        ("durable", "polyloop_sqlite"),
        ("resume", "polyloop_sqlite"),
    } <= scenarios
    for r in doc["results"]:
        assert r["reps"] == 1 and not r["errors"]
        metrics = r["metrics"]
        for name in ("wall_us_per_step", "cpu_us_per_step", "peak_rss_mb"):
            assert set(metrics[name]) == {"median", "min", "max"}
        if r["system"] in ("polyloop_sqlite", "floor_sqlite") and r["scenario"] != "resume":
            assert {"commits_per_step", "fsyncs_per_step_est", "wal_bytes_per_step"} <= set(metrics)
        if r["scenario"] == "concurrent":
            assert "wall_vs_ideal" in metrics

    md = (tmp_path / "latest.md").read_text()
    assert md == proc.stdout.rstrip("\n") + "\n" or md in proc.stdout
    for heading in (
        "## Single run",
        "## Concurrent runs",
        "## Durable journal",
        "## Resume",
        "## Targets",
    ):
        assert heading in md
    # The ratio columns: PolyLoop against each other system, and durable against memory.
    assert "PolyLoop ÷ this" in md
    assert "÷ memory @" in md
    assert "(reference)" in md
