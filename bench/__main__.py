"""``python -m bench [--quick] [--reps N] [--only SCENARIO,...] [--systems NAME,...] [--out DIR]
[--pg-dsn DSN]``

Runs every configuration in its own child process, ``--reps`` times (interleaved: repetition
r of every configuration before repetition r+1 of any), and writes ``latest.json`` (every raw
measurement plus the aggregates) and ``latest.md`` (the ratio tables) to ``--out``
(default ``bench/results``). Installs nothing: peers that cannot be imported are skipped and
listed as skipped. The PostgreSQL journal runs on ``--pg-dsn`` (or ``POLYLOOP_BENCH_PG_DSN``),
else on a throwaway cluster started here and stopped at the end (not with ``--quick``); when
there is none it is skipped too. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from typing import Any

from . import SYSTEMS, instructions, pg
from ._measure import Spec
from .report import aggregate, markdown

PEERS = ("smolagents", "mini_swe_agent", "langgraph", "pydantic_ai", "openai_agents")
SCENARIOS = ("single", "concurrent", "durable", "resume", "instructions")


@dataclasses.dataclass(frozen=True)
class Plan:
    single_steps: tuple[int, ...] = (20, 200, 2000)
    peer_max_steps: int = 200
    min_calls: int = 2000  # per measurement, in-memory systems (short runs are repeated)
    min_calls_durable: int = 200
    min_calls_peer: int = 200
    concurrent_runs: tuple[int, ...] = (200, 1000)
    peer_max_concurrency: int = 200
    concurrent_steps: int = 20
    latency_ms: float = 50.0
    durable_runs: tuple[int, ...] = (1, 10, 100)
    durable_steps: int = 20
    durable_variants: tuple[tuple[str, bool], ...] = (
        ("full", True),
        ("full", False),
        ("normal", True),
        ("normal", False),
    )
    single_durabilities: tuple[str, ...] = ("full", "normal")
    resume_steps: int = 2000


QUICK = Plan(
    single_steps=(5, 20),
    peer_max_steps=20,
    min_calls=40,
    min_calls_durable=10,
    min_calls_peer=20,
    concurrent_runs=(10,),
    peer_max_concurrency=10,
    concurrent_steps=5,
    latency_ms=5.0,
    durable_runs=(4,),
    durable_steps=5,
    durable_variants=(("full", True), ("full", False)),
    single_durabilities=("full",),
    resume_steps=20,
)


def _batches(min_calls: int, steps: int, runs: int) -> int:
    return max(1, -(-min_calls // (steps * runs)))


def configurations(plan: Plan, systems: list[str], scenarios: list[str]) -> list[Spec]:
    """Every configuration to run, in a stable order."""
    specs: list[Spec] = []
    peers = [s for s in systems if s in PEERS]
    has = set(systems).__contains__

    def add(system: str, scenario: str, steps: int, runs: int, min_calls: int, **kw: Any) -> None:
        if has(system):
            b = _batches(min_calls, steps, runs)
            specs.append(Spec(system, scenario, steps, runs=runs, batches=b, **kw))

    if "single" in scenarios:
        for n in plan.single_steps:
            add("floor", "single", n, 1, plan.min_calls)
            add("polyloop", "single", n, 1, plan.min_calls)
            for d in plan.single_durabilities:
                add("polyloop_sqlite", "single", n, 1, plan.min_calls_durable, durability=d)
                add("floor_sqlite", "single", n, 1, plan.min_calls_durable, durability=d)
            add("polyloop_postgres", "single", n, 1, plan.min_calls_durable)
            if n <= plan.peer_max_steps:
                for p in [*peers, "langgraph_sqlite"]:
                    add(p, "single", n, 1, plan.min_calls_peer)
    if "concurrent" in scenarios:
        n, lat = plan.concurrent_steps, plan.latency_ms
        for c in plan.concurrent_runs:
            add("floor", "concurrent", n, c, 0, latency_ms=lat)
            add("polyloop", "concurrent", n, c, 0, latency_ms=lat)
            add("polyloop_sqlite", "concurrent", n, c, 0, latency_ms=lat, durability="full")
            add("polyloop_sqlite_process", "concurrent", n, c, 0, latency_ms=lat)
            if c <= plan.peer_max_concurrency:
                for p in [*peers, "langgraph_sqlite"]:
                    add(p, "concurrent", n, c, 0, latency_ms=lat)
    if "durable" in scenarios:
        n = plan.durable_steps
        for c in plan.durable_runs:
            add("polyloop", "durable", n, c, plan.min_calls)
            for d, gc in plan.durable_variants:
                add(
                    "polyloop_sqlite",
                    "durable",
                    n,
                    c,
                    plan.min_calls_durable,
                    durability=d,
                    group_commit=gc,
                )
            add("polyloop_postgres", "durable", n, c, plan.min_calls_durable)
            add("floor_sqlite", "durable", n, c, plan.min_calls_durable, durability="full")
            add("langgraph_sqlite", "durable", n, c, plan.min_calls_peer)
    if "resume" in scenarios:
        add("polyloop_sqlite", "resume", plan.resume_steps, 1, 0)
    return specs


def available(system: str) -> str | None:
    """None if the system can run here, else why not."""
    for name in SYSTEMS[system][1].split(","):
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"not installed here (import {name!r} failed)"
    return None


def run_child(spec: Spec, timeout_s: float) -> dict[str, Any]:
    payload = json.dumps(dataclasses.asdict(spec))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench._child", payload],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=root,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {
            "spec": dataclasses.asdict(spec),
            "ok": False,
            "error": f"timeout after {timeout_s:.0f} s",
        }
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        return {
            "spec": dataclasses.asdict(spec),
            "ok": False,
            "error": f"child exited {proc.returncode} without a result: {' | '.join(tail)}",
        }
    return json.loads(lines[-1])


def machine() -> dict[str, Any]:
    from importlib import metadata

    versions = {}
    for dist in (
        "polyloop",
        "smolagents",
        "mini-swe-agent",
        "langgraph",
        "langgraph-prebuilt",
        "langgraph-checkpoint-sqlite",
        "langchain-core",
        "pydantic-ai-slim",
        "openai-agents",
        "pydantic",
        "psycopg",
        "psycopg-pool",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    import sqlite3

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": versions,
    }


def _shown(argv: list[str]) -> list[str]:
    """The command line as recorded: a DSN (which may hold a password) is left out."""
    out = []
    for i, arg in enumerate(argv):
        hidden = arg.startswith("--pg-dsn=") or (i > 0 and argv[i - 1] == "--pg-dsn")
        out.append("--pg-dsn=…" if arg.startswith("--pg-dsn=") else "…" if hidden else arg)
    return out


def run_all(specs: list[Spec], reps: int, timeout_s: float) -> list[dict[str, Any]]:
    """Every spec ``reps`` times, interleaved: the raw results, each with its ``rep``."""
    raw: list[dict[str, Any]] = []
    total = len(specs) * reps
    for rep in range(reps):
        for i, spec in enumerate(specs):
            n = rep * len(specs) + i + 1
            label = f"{spec.scenario} {spec.system} steps={spec.steps} runs={spec.runs}"
            if spec.system.endswith("sqlite"):
                label += f" {spec.durability}{'' if spec.group_commit else ' no-group-commit'}"
            print(f"[{n}/{total}] {label}", file=sys.stderr, flush=True)
            result = run_child(spec, timeout_s)
            result["rep"] = rep
            if not result.get("ok"):
                print(f"    failed: {result.get('error')}", file=sys.stderr)
            raw.append(result)
    return raw


def _count_instructions(
    scenarios: list[str], systems: list[str], quick: bool, timeout_s: float
) -> dict[str, Any] | None:
    """The callgrind count of bench/instructions.py, or why it was not made (None: not asked)."""
    if "instructions" not in scenarios or "polyloop" not in systems:
        return None
    why = "not with --quick (about five minutes)" if quick else instructions.unavailable()
    if why is None:
        print("[instructions] counting with callgrind (about five minutes)", file=sys.stderr)
        try:
            return instructions.measure(max(timeout_s, 1800.0))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            why = str(exc)
    print(f"skip instructions: {why}", file=sys.stderr)
    return {"skipped": why}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny configuration (seconds), for CI")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 3; --quick 1)")
    ap.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="systems, comma-separated")
    ap.add_argument(
        "--peer-steps",
        type=int,
        default=None,
        help="longest single run measured for peers (default 200)",
    )
    ap.add_argument(
        "--peer-concurrency",
        type=int,
        default=None,
        help="most concurrent runs measured for peers (default 200)",
    )
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per child process")
    ap.add_argument(
        "--pg-dsn",
        default=os.environ.get(pg.ENV),
        help=f"PostgreSQL server for polyloop_postgres (default ${pg.ENV}; without one, a "
        "throwaway cluster is started, except with --quick)",
    )
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = ap.parse_args(argv)

    plan = QUICK if args.quick else Plan()
    if args.peer_steps is not None:
        plan = dataclasses.replace(plan, peer_max_steps=args.peer_steps)
    if args.peer_concurrency is not None:
        plan = dataclasses.replace(plan, peer_max_concurrency=args.peer_concurrency)
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    wanted = [s for s in args.systems.split(",") if s]
    unknown = [s for s in wanted if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    scenarios = [s for s in args.only.split(",") if s]
    if any(s not in SCENARIOS for s in scenarios):
        ap.error(f"--only takes {', '.join(SCENARIOS)}")

    skipped = {s: why for s in wanted if (why := available(s)) is not None}
    systems = [s for s in wanted if s not in skipped]
    for s, why in skipped.items():
        print(f"skip {s}: {why}", file=sys.stderr)
    specs = configurations(plan, systems, scenarios)
    started = time.time()
    load_before = os.getloadavg()
    postgres: dict[str, Any] | None = None
    with contextlib.ExitStack() as stack:
        if any(spec.system == "polyloop_postgres" for spec in specs):
            try:
                postgres = stack.enter_context(pg.server(args.pg_dsn, start=not args.quick))
            except pg.Unavailable as exc:
                skipped["polyloop_postgres"] = str(exc)
                print(f"skip polyloop_postgres: {exc}", file=sys.stderr)
                specs = [spec for spec in specs if spec.system != "polyloop_postgres"]
            else:
                os.environ[pg.ENV] = postgres.pop("dsn")  # for the children; never written out
        raw = run_all(specs, reps, args.timeout)
    counted = _count_instructions(scenarios, systems, args.quick, args.timeout)
    doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "command": "python -m bench "
        + " ".join(_shown(argv if argv is not None else sys.argv[1:])),
        "quick": args.quick,
        "reps": reps,
        "plan": dataclasses.asdict(plan),
        "machine": machine(),
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "skipped": skipped,
        "postgres": postgres,
        "instructions": counted,
        "results": aggregate(raw),
        "raw": raw,
    }
    text = markdown(doc)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "latest.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.out, "latest.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
