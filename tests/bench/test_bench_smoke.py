"""The benchmark runner cannot rot: ``python -m bench --quick`` runs end to end (seconds) and
writes its JSON and Markdown. Never asserts a timing: the numbers depend on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.durability import pg

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = "floor,floor_sqlite,polyloop,polyloop_sqlite"
PG_ENV = "POLYLOOP_BENCH_PG_DSN"


def bench(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``python -m bench --quick ARGS --out OUT`` (exit 0), and the JSON it wrote."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop(PG_ENV, None)
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, json.loads((out / "latest.json").read_text())


def test_quick_run_writes_json_and_ratio_tables(tmp_path: Path) -> None:
    proc, doc = bench(tmp_path, "--systems", SYSTEMS)
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
    # The callgrind count takes minutes: --quick says it was not made, and why.
    assert doc["instructions"] == {"skipped": "not with --quick (about five minutes)"}
    assert "Not counted: not with --quick" in md


def _counted(**durable: int) -> dict[str, Any]:
    """A results document with only the plan and a callgrind count (``durable``: its
    per-thread count at 100 concurrent runs)."""
    counted: dict[str, Any] = {
        "instructions_per_step_20": 296335,
        "instructions_per_step_2000": 305426,
        "flatness": 1.031,
    }
    if durable:
        counted["durable"] = {"runs": 100, **durable}
    plan = {
        "single_steps": [20, 200, 2000],
        "concurrent_runs": [200],
        "concurrent_steps": 20,
        "latency_ms": 50.0,
        "durable_runs": [100],
        "resume_steps": 2000,
    }
    return {"plan": plan, "results": [], "instructions": counted}


def test_an_instruction_count_decides_the_flatness_target() -> None:
    from bench.report import _Index, instructions, targets

    doc = _counted()
    section = "\n".join(instructions(doc))
    assert "| 296,335 | 305,426 | 1.031 |" in section
    rows = [r for r in targets(doc, _Index([])) if "at 2000 ≤ 1.5" in r]
    assert rows and "1.03 instructions (callgrind)" in rows[0] and rows[0].endswith("| met |")
    doc["instructions"]["flatness"] = 1.7
    rows = [r for r in targets(doc, _Index([])) if "at 2000 ≤ 1.5" in r]
    assert rows[0].endswith("| **not met** |")
    assert "concurrent runs of 20 steps" not in section  # no durable count: no table


def test_the_durable_count_is_split_by_thread_and_shown_beside_issue_4s_times() -> None:
    from bench.report import _Index, instructions, targets

    doc = _counted(memory=290000, sqlite_loop=580000, sqlite_other=290000)
    section = "\n".join(instructions(doc))
    assert "100 concurrent runs of 20 steps" in section
    assert "| 290,000 | 580,000 | 290,000 | 870,000 | 3.00 | 2.00 |" in section

    def durable(system: str, wall: float, cpu: float) -> dict[str, Any]:
        return {
            "scenario": "durable",
            "system": system,
            "steps": 20,
            "runs": 100,
            "durability": "full",
            "group_commit": True if system == "polyloop_sqlite" else None,
            "reps": [{}],
            "metrics": {
                "wall_us_per_step": {"median": wall},
                "cpu_us_per_step": {"median": cpu},
            },
        }

    times = _Index([durable("polyloop", 100.0, 100.0), durable("polyloop_sqlite", 450.0, 400.0)])
    rows = [r for r in targets(doc, times) if r.startswith("| issue 4:")]
    assert rows == [
        "| issue 4: SQLite `full` with 100 concurrent runs < 2 × memory journal "
        "| 4.50 wall, 4.00 CPU; instructions 3.00 (event loop alone 2.00) | **not met** |"
    ]


def test_quick_run_skips_postgres_without_a_server(tmp_path: Path) -> None:
    """--quick starts no PostgreSQL: without a DSN the system is listed as skipped, with why."""
    _, doc = bench(tmp_path, "--systems", "polyloop,polyloop_postgres", "--only", "single")
    assert "polyloop_postgres" in doc["skipped"]
    assert doc["postgres"] is None
    assert {r["system"] for r in doc["results"]} == {"polyloop"}
    assert "PostgresJournal (" in (tmp_path / "latest.md").read_text()


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    with pg.server() as dsn:
        yield dsn


def test_quick_run_measures_postgres_on_a_given_server(tmp_path: Path, pg_dsn: str) -> None:
    systems = "polyloop,polyloop_sqlite,polyloop_postgres"
    _, doc = bench(tmp_path, "--systems", systems, "--only", "single,durable", "--pg-dsn", pg_dsn)
    failures = [r for r in doc["raw"] if not r["ok"]]
    assert not failures, failures
    assert {("single", "polyloop_postgres"), ("durable", "polyloop_postgres")} <= {
        (r["scenario"], r["system"]) for r in doc["results"]
    }
    for r in doc["results"]:
        if r["system"] == "polyloop_postgres":
            assert {"wall_us_per_step", "cpu_us_per_step", "wal_bytes_per_step"} <= set(
                r["metrics"]
            )
    assert doc["postgres"]["started"] is False and "fsync" in doc["postgres"]["settings"]
    md = (tmp_path / "latest.md").read_text()
    assert "## PostgreSQL journal against SQLite `full` and memory" in md
    assert "PostgreSQL ÷ SQLite `full`" in md
    # The DSN is handed to the children, never written out.
    assert pg_dsn not in md and pg_dsn not in (tmp_path / "latest.json").read_text()
    # Every child dropped its schema.
    with pg.connect(pg_dsn) as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench%'")
        assert left.fetchall() == []
