"""Scale soak: N runs through ``polyloop batch --backend ray`` on a PostgreSQL journal, a Ray
worker SIGKILLed and later the driver, then ``polyloop recover`` and the same batch command
again, as a user would; then every run is checked against an undisturbed run of its script.

    python bench/scale_soak.py                         # 10,000 runs, concurrency 128
    python bench/scale_soak.py --runs 500 --pg-dsn postgresql://…

PostgreSQL: ``--pg-dsn``, else ``POLYLOOP_BENCH_PG_DSN``, else a throwaway cluster started with
``.ci/postgres.sh`` (bench/pg.py); the soak works in a fresh schema, dropped at the end. Ray: the
driver (``polyloop batch``) starts a local Ray instance of its own (``RAY_TMPDIR`` is the
soak's folder), which dies with it.

The agent (:func:`make_loop`, loaded by ``--loop bench.scale_soak:make_loop`` in the driver and
in every Ray worker): a scripted model sleeping ``latency`` per call, and one tool of each
replay policy, whose side effects are appended to a file outside the journal (one
``write(2)`` with ``O_APPEND`` per effect: a killed process cannot lose it, only a crash of
the machine could, which the soak does not do):

* ``task NNNNNN``: ``store`` (idempotent) -> ``charge`` (never) -> ``ship`` (reconcile: its hook
  looks for the op id in the effects file) -> ``done`` (completion marker): ``task_completed``;
* ``talk NNNNNN``: ``store``, then a text answer: ``agent_finished``;
* ``loop NNNNNN``: ``store`` until the step budget (5 steps): ``step_budget``.

Checks (each an AssertionError naming the run): every run has exactly one end record and its
row is ``ended``; journal seqs and step indexes have no gap or duplicate; the trajectory equals
the undisturbed one of its kind, except a run whose ``charge`` was in flight at a kill, which
must end ``resume_state_unknown`` right before its ``charge`` step (counted: ``unknown``);
``charge`` ran at most once per run and as often as its steps say (else only in an unknown
run); ``ship`` exactly once per completed task; ``store``'s distinct op ids match its steps.

Throughput: the ideal is ``concurrency`` runs at a time, each ``steps × latency`` (the mean
number of model calls per run of the mix): ``ideal runs/s = concurrency / (mean steps ×
latency)``. Reported for the undisturbed first phase (runs ended before the worker kill, over
the time since the first run ended) and for the whole soak (wall time including the kills,
the recovery and the re-run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polyloop import (
    ActionStatus,
    Limits,
    Loop,
    ModelReply,
    Outcome,
    ToolCall,
    ToolContext,
    ToolRegistry,
)
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest, StepRecord

ROOT = Path(__file__).resolve().parents[1]
EFFECTS_ENV = "POLYLOOP_SOAK_EFFECTS"
LATENCY_ENV = "POLYLOOP_SOAK_LATENCY"
MAX_STEPS = 5
KINDS = {"task": 4, "talk": 2, "loop": MAX_STEPS}  # model calls per run of each kind
REASONS = {"task": "task_completed", "talk": "agent_finished", "loop": "step_budget"}


# -- the agent ------------------------------------------------------------------------------


def _append(path: str, entry: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())  # one write: lines never interleave
    finally:
        os.close(fd)


def effects_of(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line]


def _goal(request: ModelRequest) -> str:
    for message in request.messages:
        if message.get("role") == "user":
            return str(message.get("content"))
    raise AssertionError("no user message")


def _reply(kind: str, step: int) -> ModelReply:
    def call(name: str, args: dict[str, Any]) -> ModelReply:
        return ModelReply(tool_calls=(ToolCall(name, args, f"call-{step}"),))

    if kind == "loop" or step == 0:
        return call("store", {"key": "k"})
    if kind == "talk":
        return ModelReply(text="answered")
    return call(("charge", "ship", "done")[min(step, 3) - 1], {"n": 7})


def make_loop(journal: Any) -> Loop:
    """The soak's Loop on ``journal`` (``--loop bench.scale_soak:make_loop``): effects go to
    ``$POLYLOOP_SOAK_EFFECTS``, each model call sleeps ``$POLYLOOP_SOAK_LATENCY`` seconds."""
    effects = os.environ[EFFECTS_ENV]
    latency = float(os.environ.get(LATENCY_ENV, "0.05"))
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def store(key: str, ctx: ToolContext) -> str:
        """Upsert a record (the op id is the idempotency key)."""
        _append(effects, {"run": ctx.run_id, "tool": "store", "op": ctx.op_id, "pid": os.getpid()})
        return "stored"

    @tools.tool  # replay="never"
    def charge(n: int, ctx: ToolContext) -> str:
        """Charge a card: must never happen twice."""
        _append(effects, {"run": ctx.run_id, "tool": "charge", "op": ctx.op_id, "pid": os.getpid()})
        return "charged"

    def shipped(op_id: str, arguments: Any) -> Outcome | None:
        ops = {e["op"] for e in effects_of(effects) if e["tool"] == "ship"}
        return Outcome(ActionStatus.executed, "shipped") if op_id in ops else None

    @tools.tool(replay="reconcile", reconcile=shipped)
    def ship(n: int, ctx: ToolContext) -> str:
        """Ship a parcel: its hook tells whether it happened."""
        _append(effects, {"run": ctx.run_id, "tool": "ship", "op": ctx.op_id, "pid": os.getpid()})
        return "shipped"

    @tools.tool(completion_marker=True, replay="idempotent")
    def done(n: int) -> str:
        """Submit the answer."""
        return "submitted"

    async def answer(request: ModelRequest) -> ModelReply:
        await asyncio.sleep(latency)
        return _reply(_goal(request)[:4], request.step_idx)

    return Loop(FunctionModel(answer), tools=tools, journal=journal, limits=Limits(max_steps=5))


# -- the soak -------------------------------------------------------------------------------

MIX = ("task",) * 8 + ("talk", "loop")


def goals(n: int) -> list[str]:
    """The mix: 8 of 10 ``task``, 1 ``talk``, 1 ``loop`` (goals of one length: same prompts)."""
    return [f"{MIX[i % len(MIX)]} {i:06d}" for i in range(n)]


def comparable(step: StepRecord) -> StepRecord:
    """Equal across runs of one kind: no timings, no ids drawn per call."""
    return dataclasses.replace(
        step, step_wall_ms=0.0, llm_call_id=None if step.llm_call_id is None else "id"
    )


async def references(effects: Path) -> dict[str, tuple[str, list[StepRecord]]]:
    """Each kind run undisturbed on a memory journal: its stop reason and steps."""
    from polyloop.journal import MemoryJournal

    os.environ[EFFECTS_ENV] = str(effects)
    saved = os.environ.get(LATENCY_ENV)
    os.environ[LATENCY_ENV] = "0"
    try:
        out = {}
        for kind in KINDS:
            result = await make_loop(MemoryJournal()).run(f"{kind} 000000")
            out[kind] = (str(result.stop_reason), [comparable(s) for s in result.steps])
        return out
    finally:
        if saved is None:
            os.environ.pop(LATENCY_ENV, None)
        else:
            os.environ[LATENCY_ENV] = saved


class Db:
    """Plain SQL on the soak's schema."""

    def __init__(self, dsn: str, schema: str) -> None:
        import psycopg

        self.schema = schema
        self._conn = psycopg.connect(dsn, autocommit=True)

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        import psycopg

        try:
            self._conn.execute(f'SET search_path TO "{self.schema}"')
            return self._conn.execute(query, args or None).fetchall()
        except psycopg.errors.UndefinedTable:  # the driver has not made its tables yet
            return []

    def count(self, where: str = "TRUE") -> int:
        rows = self.sql(f"SELECT count(*) FROM runs WHERE {where}")
        return int(rows[0][0]) if rows else 0

    def drop(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
        self._conn.close()


def _wait(predicate: Any, timeout: float, what: str, child: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if child is not None and child.poll() is not None:
            raise AssertionError(f"the driver exited ({child.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _ray_processes(folder: str) -> list[int]:
    """Processes of the soak's Ray instance (their command line names its folder)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if folder.encode() in cmd and int(entry) != os.getpid():
                out.append(int(entry))
    return out


@contextlib.contextmanager
def _folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="plsoak", dir="/tmp"))  # short: Ray's unix sockets
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def soak(
    dsn: str,
    *,
    runs: int,
    concurrency: int,
    latency: float,
    kill_worker_at: float = 0.2,
    kill_driver_at: float = 0.5,
    timeout: float = 1800.0,
    log: Any = print,
) -> dict[str, Any]:
    """The whole soak on the PostgreSQL server ``dsn`` (a fresh schema, dropped at the end).
    Raises AssertionError on any broken guarantee; returns the counts and timings."""
    schema = f"soak_{os.getpid()}_{secrets.token_hex(3)}"
    spec = f"{dsn}#schema={schema}"
    db = Db(dsn, schema)
    with _folder() as tmp:
        effects = tmp / "effects"
        (tmp / "ray").mkdir()
        all_goals = goals(runs)
        (tmp / "goals.jsonl").write_text("".join(json.dumps({"goal": g}) + "\n" for g in all_goals))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
            ),
            EFFECTS_ENV: str(effects),
            LATENCY_ENV: str(latency),
            "RAY_TMPDIR": str(tmp / "ray"),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
        }
        env.pop("RAY_ADDRESS", None)
        cli = [sys.executable, "-m", "polyloop.cli"]
        batch = [*cli, "batch", "goals.jsonl", "--loop", "bench.scale_soak:make_loop",
                 "--backend", "ray", "--journal", spec, "--concurrency", str(concurrency),
                 "--max-steps", str(MAX_STEPS)]  # fmt: skip

        def run(args: list[str]) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                args, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout
            )

        try:
            t0 = time.perf_counter()
            with open(tmp / "driver.out", "w") as out:
                driver = subprocess.Popen(
                    batch, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT
                )
            try:
                _wait(lambda: db.count("status = 'ended'") >= 1, timeout, "the first run", driver)
                t_first = time.perf_counter()
                worker_at = max(1, int(runs * kill_worker_at))
                _wait(
                    lambda: db.count("status = 'ended'") >= worker_at,
                    timeout,
                    "the worker kill",
                    driver,
                )
                t_kill = time.perf_counter()
                ended_at_kill = db.count("status = 'ended'")
                worker = effects_of(effects)[-1]["pid"]  # a BatchWorker that just acted
                os.kill(worker, signal.SIGKILL)
                log(f"killed Ray worker {worker} with {ended_at_kill}/{runs} runs ended")
                driver_at = max(worker_at + 1, int(runs * kill_driver_at))
                _wait(
                    lambda: db.count("status = 'ended'") >= driver_at,
                    timeout,
                    "the driver kill",
                    driver,
                )
                driver.send_signal(signal.SIGKILL)
                ended_at_driver = db.count("status = 'ended'")
                log(f"killed the driver {driver.pid} with {ended_at_driver}/{runs} runs ended")
            finally:
                if driver.poll() is None:
                    driver.kill()
                driver.wait()
            _wait(lambda: not _ray_processes(str(tmp)), 120, "the killed driver's Ray to go")
            stranded = runs - db.count("status = 'ended'")
            t_recover = time.perf_counter()
            rec = run([*cli, "recover", "--journal", spec])
            log(rec.stdout.strip().splitlines()[0] if rec.stdout.strip() else rec.stderr)
            assert rec.returncode == 0, f"recover exited {rec.returncode}: {rec.stdout}{rec.stderr}"
            recovered = db.count("status = 'ended'") - (runs - stranded)
            t_rerun = time.perf_counter()
            again = run(batch)
            t_end = time.perf_counter()
            summary = [line for line in again.stdout.splitlines() if " runs: " in line]
            log(summary[-1] if summary else again.stdout[-500:] + again.stderr[-500:])
            assert again.returncode == 0, (
                f"the re-run exited {again.returncode}: {again.stdout[-2000:]}"
                f"{again.stderr[-2000:]}"
            )
            refs = asyncio.run(references(tmp / "reference-effects"))
            checked = check(spec, db, all_goals, effects, refs)
        finally:
            db.drop()
    mean_steps = sum(KINDS[MIX[i % len(MIX)]] for i in range(runs)) / runs
    ideal = concurrency / (mean_steps * latency)
    steady = (ended_at_kill - 1) / (t_kill - t_first) if t_kill > t_first else float("nan")
    overall = runs / (t_end - t0)
    return {
        "runs": runs,
        "concurrency": concurrency,
        "latency_s": latency,
        "mean_model_calls": mean_steps,
        "ended_at_worker_kill": ended_at_kill,
        "ended_at_driver_kill": ended_at_driver,
        "recovered_by_recover": recovered,
        "finished_by_rerun": runs - ended_at_driver - recovered,
        "wall_s": round(t_end - t0, 2),
        "recover_s": round(t_rerun - t_recover, 2),
        "rerun_s": round(t_end - t_rerun, 2),
        "ideal_runs_s": round(ideal, 1),
        "steady_runs_s": round(steady, 1),
        "steady_ratio": round(steady / ideal, 3),
        "overall_runs_s": round(overall, 1),
        "overall_ratio": round(overall / ideal, 3),
        **checked,
    }


def check(
    spec: str, db: Db, all_goals: list[str], effects: Path, refs: dict[str, Any]
) -> dict[str, Any]:
    """Every guarantee, for every run; the counts."""
    from polyloop.batch import open_journal

    rows = db.sql("SELECT run_id, goal, status, stop_reason FROM runs")
    assert len(rows) == len(all_goals), f"{len(rows)} run rows for {len(all_goals)} goals"
    by_goal = {goal: (run_id, status, reason) for run_id, goal, status, reason in rows}
    assert len(by_goal) == len(rows), "one run row per goal"
    ends = dict(db.sql("SELECT run_id, count(*) FROM journal WHERE kind = 'end' GROUP BY 1"))
    seqs = {r: (n, lo, hi) for r, n, lo, hi in db.sql(
        "SELECT run_id, count(*), min(seq), max(seq) FROM journal GROUP BY 1")}  # fmt: skip
    idx = {r: (n, lo, hi) for r, n, lo, hi in db.sql(
        "SELECT run_id, count(*), min(step_idx), max(step_idx) FROM steps GROUP BY 1")}  # fmt: skip
    fx = effects_of(effects)
    ran: dict[str, Counter[str]] = {}
    store_ops: dict[str, set[str]] = {}
    for e in fx:
        ran.setdefault(e["run"], Counter())[e["tool"]] += 1
        if e["tool"] == "store":
            store_ops.setdefault(e["run"], set()).add(e["op"])

    async def read_steps() -> dict[str, list[StepRecord]]:
        j = open_journal(spec)
        try:
            out: dict[str, list[StepRecord]] = {}
            ids = [r for r, _, _ in by_goal.values()]
            for i in range(0, len(ids), 200):
                chunk = ids[i : i + 200]
                got = await asyncio.gather(*(j.steps(r) for r in chunk))
                out.update(zip(chunk, got, strict=True))
            return out
        finally:
            await j.aclose()

    stored = asyncio.run(read_steps())
    reasons: Counter[str] = Counter()
    unknown = unknown_charged = 0
    for goal in all_goals:
        run_id, status, reason = by_goal[goal]
        kind = goal[:4]
        assert status == "ended", f"{goal}: {status}"
        assert ends.get(run_id) == 1, f"{goal}: {ends.get(run_id)} end records"
        n, lo, hi = seqs[run_id]
        assert (lo, hi) == (1, n), f"{goal}: journal seqs {lo}..{hi} for {n} records"
        n, lo, hi = idx[run_id]
        assert (lo, hi) == (0, n - 1), f"{goal}: step indexes {lo}..{hi} for {n} steps"
        steps = [comparable(s) for s in stored[run_id]]
        ref_reason, ref = refs[kind]
        counts = ran.get(run_id, Counter())
        reasons[reason] += 1
        assert counts["charge"] <= 1, (
            f"{goal}: the never-replay charge ran {counts['charge']} times"
        )
        if reason == "resume_state_unknown":
            assert steps == ref[: len(steps)], f"{goal}: steps differ from the undisturbed run"
            assert ref[len(steps)].tool_name == "charge", f"{goal}: unknown at the wrong step"
            unknown += 1
            unknown_charged += counts["charge"]
        else:
            assert reason == ref_reason, f"{goal}: ended {reason}, undisturbed {ref_reason}"
            assert steps == ref, f"{goal}: trajectory differs from the undisturbed run"
            executed = {
                t: sum(s.tool_name == t and s.action_status == "executed" for s in steps)
                for t in ("charge", "ship")
            }
            assert counts["charge"] == executed["charge"], f"{goal}: charge effects != its steps"
            assert counts["ship"] == executed["ship"], f"{goal}: ship ran {counts['ship']} times"
        stores = sum(s.tool_name == "store" and s.action_status == "executed" for s in steps)
        assert len(store_ops.get(run_id, ())) == stores, f"{goal}: idempotent op ids drifted"
    return {
        "checked_runs": len(all_goals),
        "by_stop_reason": dict(sorted(reasons.items())),
        "resume_state_unknown": unknown,
        "unknown_with_charge_effect": unknown_charged,
        "effects": dict(Counter(e["tool"] for e in fx)),
        "store_repeats": sum(1 for e in fx if e["tool"] == "store")
        - sum(len(v) for v in store_ops.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per model call")
    ap.add_argument("--pg-dsn", default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "scale_soak")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench import pg

    load = os.getloadavg()
    with pg.server(args.pg_dsn or os.environ.get(pg.ENV), start=True) as server:
        print(
            f"{args.runs} runs, concurrency {args.concurrency}, model "
            f"{args.latency * 1000:.0f} ms, PostgreSQL {server['version']}, "
            f"{os.cpu_count()} CPUs, load {load[0]:.2f}"
        )
        result = soak(
            server["dsn"], runs=args.runs, concurrency=args.concurrency, latency=args.latency
        )
        result["postgres"] = {k: server[k] for k in ("version", "settings")}
    result["load_avg_before"] = [round(x, 2) for x in load]
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(report(result))
    return 0


def report(r: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k} {v}" for k, v in r["by_stop_reason"].items())
    return (
        f"# Scale soak: {r['runs']} runs through polyloop batch --backend ray on PostgreSQL\n\n"
        f"Concurrency {r['concurrency']}, model {r['latency_s'] * 1000:.0f} ms per call, "
        f"{r['mean_model_calls']:.1f} calls per run; {r['cpus']} CPUs, load average "
        f"{r['load_avg_before'][0]} before, {r['load_avg_after'][0]} after.\n\n"
        f"- A Ray worker SIGKILLed at {r['ended_at_worker_kill']} ended runs, the driver at "
        f"{r['ended_at_driver_kill']}; `polyloop recover` finished {r['recovered_by_recover']} "
        f"({r['recover_s']} s), the re-run batch the other {r['finished_by_rerun']} "
        f"({r['rerun_s']} s).\n"
        f"- All {r['checked_runs']} runs checked: one end record each, no gap or duplicate in "
        f"journal seqs and steps, trajectories equal to the undisturbed run, `charge` "
        f"(never) at most once.\n"
        f"- Stop reasons: {reasons}; resume_state_unknown {r['resume_state_unknown']} (a "
        f"`charge` in flight at a kill; {r['unknown_with_charge_effect']} of them had charged).\n"
        f"- Effects: {r['effects']}; idempotent store repeats (same op id): "
        f"{r['store_repeats']}.\n"
        f"- Throughput: ideal {r['ideal_runs_s']} runs/s; undisturbed phase "
        f"{r['steady_runs_s']} runs/s ({r['steady_ratio']} of ideal); whole soak including "
        f"kills and recovery {r['overall_runs_s']} runs/s ({r['overall_ratio']}) over "
        f"{r['wall_s']} s.\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
