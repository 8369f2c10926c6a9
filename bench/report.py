"""Aggregation (median, min–max over repetitions) and the Markdown tables of ratios."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from . import SYSTEMS

LABELS = {
    "floor": "hand-written floor",
    "floor_sqlite": "floor + the same fsync'd commits",
    "polyloop": "**PolyLoop** (memory journal)",
    "polyloop_sqlite": "**PolyLoop** SQLiteJournal",
    "polyloop_sqlite_process": '**PolyLoop** SQLiteJournal `full`, `writer="process"`',
    "polyloop_postgres": "**PolyLoop** PostgresJournal",
    "smolagents": "smolagents",
    "mini_swe_agent": "mini-swe-agent",
    "langgraph": "LangGraph",
    "langgraph_sqlite": "LangGraph + SQLite checkpointer",
    "pydantic_ai": "pydantic-ai",
    "openai_agents": "openai-agents",
}
PEERS = ("smolagents", "mini_swe_agent", "langgraph", "pydantic_ai", "openai_agents")
SQLITE = ("polyloop_sqlite", "polyloop_sqlite_process", "floor_sqlite")


def _key(spec: dict[str, Any]) -> tuple[Any, ...]:
    sqlite = spec["system"] in SQLITE
    return (
        spec["scenario"],
        spec["system"],
        spec["steps"],
        spec["runs"],
        spec["latency_ms"],
        spec["durability"] if sqlite else None,
        spec["group_commit"] if sqlite and spec["system"] == "polyloop_sqlite" else None,
    )


def _stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _metrics(r: dict[str, Any]) -> dict[str, float]:
    spec = r["spec"]
    calls = r["model_calls"]
    m = {
        "wall_us_per_step": r["wall_s"] / calls * 1e6,
        "cpu_us_per_step": r["cpu_s"] / calls * 1e6,
        "wall_s": r["wall_s"],
        "cpu_s": r["cpu_s"],
        "peak_rss_mb": r["peak_rss_mb"],
    }
    if spec["latency_ms"]:
        ideal = spec["batches"] * spec["steps"] * spec["latency_ms"] / 1000
        m["wall_vs_ideal"] = r["wall_s"] / ideal
    if "commits" in r:
        m["commits_per_step"] = r["commits"] / calls
        full = spec["durability"] == "full"
        # WAL with synchronous=FULL fsyncs the WAL once per commit (checkpoints add a few more);
        # NORMAL fsyncs only at checkpoints.
        m["fsyncs_per_step_est"] = r["commits"] / calls if full else 0.0
    if "journal_bytes" in r and spec["scenario"] != "resume":
        m["wal_bytes_per_step"] = r["journal_bytes"] / calls
    if "stored_bytes" in r:
        m["stored_bytes_per_step"] = r["stored_bytes"] / calls
    if "server_cpu_s" in r:
        m["server_cpu_us_per_step"] = r["server_cpu_s"] / calls * 1e6
    return m


def aggregate(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in raw:
        groups.setdefault(_key(r["spec"]), []).append(r)
    out = []
    for key, rs in groups.items():
        ok = [r for r in rs if r.get("ok")]
        per: dict[str, list[float]] = {}
        for r in ok:
            for name, value in _metrics(r).items():
                per.setdefault(name, []).append(value)
        scenario, system, steps, runs, latency, durability, gc = key
        out.append(
            {
                "scenario": scenario,
                "system": system,
                "steps": steps,
                "runs": runs,
                "latency_ms": latency,
                "durability": durability,
                "group_commit": gc,
                "reps": len(ok),
                "errors": sorted({r.get("error", "?") for r in rs if not r.get("ok")}),
                "metrics": {name: _stats(v) for name, v in per.items()},
            }
        )
    return out


# -- Markdown ---------------------------------------------------------------------------------


class _Index:
    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = results

    def get(
        self,
        scenario: str,
        system: str,
        steps: int | None = None,
        runs: int | None = None,
        durability: str | None = None,
        gc: bool | None = None,
    ) -> dict[str, Any] | None:
        for r in self.results:
            if r["scenario"] != scenario or r["system"] != system or not r["reps"]:
                continue
            if steps is not None and r["steps"] != steps:
                continue
            if runs is not None and r["runs"] != runs:
                continue
            if durability is not None and r["durability"] != durability:
                continue
            if gc is not None and r["group_commit"] is not None and r["group_commit"] != gc:
                continue
            return r
        return None

    def med(self, metric: str, *args: Any, **kw: Any) -> float | None:
        r = self.get(*args, **kw)
        if r is None or metric not in r["metrics"]:
            return None
        return float(r["metrics"][metric]["median"])


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _spread(
    r: dict[str, Any] | None, metric: str, fmt: Callable[[float | None], str] = _num
) -> str:
    if r is None or metric not in r["metrics"]:
        return "–"
    s = r["metrics"][metric]
    if r["reps"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "–"
    r = a / b
    if r < 1:
        return f"{r:.3f} (1/{1 / r:.0f})" if r < 0.1 else f"{r:.2f}"
    return f"{r:.2f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def markdown(doc: dict[str, Any]) -> str:
    ix = _Index(doc["results"])
    plan = doc["plan"]
    lines: list[str] = []
    m = doc["machine"]
    lines += [
        "# PolyLoop benchmark results",
        "",
        f"Generated {doc['generated_at']} by `{doc['command'].strip()}` in {doc['duration_s']} s; "
        f"{doc['reps']} repetition(s), each configuration in its own process. Machine: "
        f"{m['cpu'] or 'unknown CPU'}, {m['cpus']} CPUs, Python {m['python']}, SQLite "
        f"{m['sqlite']}. Load average before/after: "
        f"{', '.join(f'{x:.1f}' for x in doc['load_average']['before'])} / "
        f"{', '.join(f'{x:.1f}' for x in doc['load_average']['after'])} (a shared machine: "
        "read CPU time next to wall time).",
        "",
        "Cells: median (min–max) over repetitions. **Ratios are PolyLoop ÷ the other system** "
        "(median wall time per step): below 1 PolyLoop is cheaper, 1/N means N times cheaper. "
        "A step is one model call (runs of N steps: N−1 calls of the no-op tool, then a final "
        "answer).",
        "",
    ]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    lines += [f"Versions: {versions}.", ""]
    if doc["skipped"]:
        lines += [
            "Skipped: "
            + "; ".join(f"{LABELS.get(s, s)} ({why})" for s, why in doc["skipped"].items())
            + ".",
            "",
        ]

    # -- single ---------------------------------------------------------------------------------
    steps = plan["single_steps"]
    mid = steps[1] if len(steps) > 1 else steps[0]
    lo, hi = steps[0], steps[-1]
    if any(r["scenario"] == "single" for r in doc["results"]):
        lines += [
            "## Single run, zero-latency model, one no-op tool",
            "",
            f"µs per step (wall). Flatness = per-step cost at the longest run measured ÷ at {lo} "
            f"steps (1 = no work over the history). Peers run up to {plan['peer_max_steps']} "
            "steps.",
            "",
        ]
        head = [
            "system",
            *(f"{n} steps" for n in steps),
            f"CPU µs/step @{mid}",
            "flatness",
            f"peak RSS MB @{mid}",
            f"stored bytes/step @{mid}",
            f"PolyLoop ÷ this @{mid}",
        ]
        rows = []
        order = [
            "floor",
            "polyloop",
            *PEERS,
            "floor_sqlite",
            "polyloop_sqlite",
            "polyloop_postgres",
            "langgraph_sqlite",
        ]
        pl_mem = ix.med("wall_us_per_step", "single", "polyloop", mid)
        pl_full = ix.med("wall_us_per_step", "single", "polyloop_sqlite", mid, durability="full")
        for system in order:
            for d in ("full", "normal") if system in SQLITE else (None,):
                if ix.get("single", system, durability=d) is None:
                    continue
                name = LABELS[system] + (f" `{d}`" if d else "")
                cells = [
                    _spread(ix.get("single", system, n, durability=d), "wall_us_per_step")
                    for n in steps
                ]
                measured = [n for n in steps if ix.get("single", system, n, durability=d)]
                first = ix.med("wall_us_per_step", "single", system, measured[0], durability=d)
                last = ix.med("wall_us_per_step", "single", system, measured[-1], durability=d)
                flat = _ratio(last, first) if len(measured) > 1 else "–"
                if len(measured) > 1 and measured[-1] != hi:
                    flat += f" ({measured[-1]}÷{measured[0]})"
                this = ix.med("wall_us_per_step", "single", system, mid, durability=d)
                durable = system in (*SQLITE, "polyloop_postgres", "langgraph_sqlite")
                ref = pl_full if durable else pl_mem
                is_ref = (system == "polyloop") or (system == "polyloop_sqlite" and d == "full")
                rows.append(
                    [
                        name,
                        *cells,
                        _spread(ix.get("single", system, mid, durability=d), "cpu_us_per_step"),
                        flat,
                        _spread(ix.get("single", system, mid, durability=d), "peak_rss_mb"),
                        _spread(
                            ix.get("single", system, mid, durability=d), "stored_bytes_per_step"
                        ),
                        "(reference)" if is_ref else _ratio(ref, this),
                    ]
                )
        lines += _table(head, rows)
        lines += [
            "",
            "Durable rows are compared with PolyLoop SQLiteJournal `full`; the others "
            "with PolyLoop's memory journal.",
            "",
        ]

    # -- concurrent -----------------------------------------------------------------------------
    if any(r["scenario"] == "concurrent" for r in doc["results"]):
        cs = plan["concurrent_runs"]
        n, lat = plan["concurrent_steps"], plan["latency_ms"]
        lines += [
            f"## Concurrent runs × {n} steps, model latency {lat:g} ms",
            "",
            f"Wall time ÷ ideal (ideal = {n} × {lat:g} ms = {n * lat / 1000:g} s: the model "
            f"latency alone). Peers run up to {plan['peer_max_concurrency']} concurrent runs "
            "(smolagents and mini-swe-agent are synchronous: one thread per run).",
            "",
        ]
        head = [
            "system",
            *(f"{c} runs: wall ÷ ideal" for c in cs),
            f"CPU µs/step @{cs[0]}",
            f"peak RSS MB @{cs[0]}",
            f"peak RSS ÷ runs @{cs[-1]} (KB per run)",
            f"PolyLoop ÷ this @{cs[0]} (wall)",
        ]
        rows = []
        pl = ix.med("wall_s", "concurrent", "polyloop", runs=cs[0])

        def per_run(system: str) -> str:
            # Peak RSS of the process at the most concurrent runs, ÷ that many runs (imports
            # included: an upper bound on what one more concurrent run costs).
            rss = ix.med("peak_rss_mb", "concurrent", system, runs=cs[-1])
            return "–" if rss is None else _num(rss * 1024 / cs[-1])

        systems = ["floor", "polyloop", "polyloop_sqlite", "polyloop_sqlite_process"]
        for system in [*systems, *PEERS, "langgraph_sqlite"]:
            if ix.get("concurrent", system) is None:
                continue
            name = LABELS[system] + (" `full`" if system == "polyloop_sqlite" else "")
            this = ix.med("wall_s", "concurrent", system, runs=cs[0])
            rows.append(
                [
                    name,
                    *(_spread(ix.get("concurrent", system, runs=c), "wall_vs_ideal") for c in cs),
                    _spread(ix.get("concurrent", system, runs=cs[0]), "cpu_us_per_step"),
                    _spread(ix.get("concurrent", system, runs=cs[0]), "peak_rss_mb"),
                    per_run(system),
                    "(reference)" if system == "polyloop" else _ratio(pl, this),
                ]
            )
        lines += [*_table(head, rows), ""]

    # -- durable --------------------------------------------------------------------------------
    if any(r["scenario"] == "durable" for r in doc["results"]):
        cs = plan["durable_runs"]
        n = plan["durable_steps"]
        lines += [
            f"## Durable journal: concurrent runs × {n} steps, zero-latency model",
            "",
            "µs per step (wall, all runs together) and ÷ PolyLoop's memory journal at the same "
            "concurrency. Commits and fsyncs per step at the highest concurrency; fsyncs are "
            "estimated as one per commit with `synchronous=FULL` in WAL mode (checkpoints add a "
            "few), none per commit with `NORMAL`. WAL bytes = growth of the database and its "
            "WAL; stored = after a checkpoint. PostgreSQL: WAL bytes = how far the server's WAL "
            "position moved, stored = growth of the schema's tables with their indexes; its "
            "journal counts no commits (one per append, see below).",
            "",
        ]
        head = [
            "journal",
            *(f"{c} runs µs/step" for c in cs),
            *(f"÷ memory @{c}" for c in cs),
            f"commits/step @{cs[-1]}",
            f"fsyncs/step @{cs[-1]}",
            f"WAL bytes/step @{cs[-1]}",
            f"stored bytes/step @{cs[-1]}",
        ]
        rows = []
        configs: list[tuple[str, str, str | None, bool | None]] = [
            ("polyloop", LABELS["polyloop"], None, None)
        ]
        for d in ("full", "normal"):
            for gc in (True, False):
                configs.append(
                    (
                        "polyloop_sqlite",
                        f"PolyLoop SQLite `{d}`, group commit {'on' if gc else 'off'}",
                        d,
                        gc,
                    )
                )
        configs += [
            ("polyloop_postgres", "PolyLoop PostgreSQL", None, None),
            ("floor_sqlite", LABELS["floor_sqlite"] + " `full`", "full", None),
            ("langgraph_sqlite", LABELS["langgraph_sqlite"], None, None),
        ]
        for system, name, d, gc in configs:
            if ix.get("durable", system, durability=d, gc=gc) is None:
                continue
            per = [ix.get("durable", system, runs=c, durability=d, gc=gc) for c in cs]
            ratios = [
                _ratio(
                    ix.med("wall_us_per_step", "durable", system, runs=c, durability=d, gc=gc),
                    ix.med("wall_us_per_step", "durable", "polyloop", runs=c),
                )
                for c in cs
            ]
            rows.append(
                [
                    name,
                    *(_spread(r, "wall_us_per_step") for r in per),
                    *ratios,
                    _spread(per[-1], "commits_per_step"),
                    _spread(per[-1], "fsyncs_per_step_est"),
                    _spread(per[-1], "wal_bytes_per_step"),
                    _spread(per[-1], "stored_bytes_per_step"),
                ]
            )
        lines += [*_table(head, rows), ""]

    lines += postgres(doc, ix)

    # -- resume ---------------------------------------------------------------------------------
    r = ix.get("resume", "polyloop_sqlite")
    if r is not None:
        lines += [
            f"## Resume of a {r['steps']}-step run from SQLite",
            "",
            "A fresh `SQLiteJournal` object and `Loop`, then `resume`: read every record, check "
            "and replay them, rebuild the context, take the lease, one more step (the final "
            "answer) and the end record.",
            "",
        ]
        lines += [
            *_table(
                ["", "wall s", "CPU s"], [["resume", _spread(r, "wall_s"), _spread(r, "cpu_s")]]
            ),
            "",
        ]

    lines += instructions(doc)
    lines += targets(doc, ix)
    errors = [r for r in doc["results"] if r["errors"]]
    if errors:
        lines += ["## Failures", ""]
        for r in errors:
            lines.append(
                f"- {r['scenario']} {r['system']} steps={r['steps']} runs={r['runs']}: "
                + "; ".join(r["errors"])
            )
        lines.append("")
    return "\n".join(lines)


def _server(info: dict[str, Any]) -> str:
    where = (
        "a throwaway cluster the runner started (and stopped)"
        if info["started"]
        else "the server given by `--pg-dsn` / `POLYLOOP_BENCH_PG_DSN`"
    )
    settings = ", ".join(f"{k}={v}" for k, v in info["settings"].items())
    return f"PostgreSQL {info['version']} at {info['server']}, {where}: {settings}."


def postgres(doc: dict[str, Any], ix: _Index) -> list[str]:
    """PostgresJournal next to SQLiteJournal `full` (group commit on) and the memory journal,
    in the single and durable scenarios."""
    plan = doc["plan"]
    cases = [("single", n, 1, f"single run, {n} steps") for n in plan["single_steps"]]
    n = plan["durable_steps"]
    cases += [
        ("durable", n, c, f"{c} concurrent run{'s' * (c != 1)} × {n} steps")
        for c in plan["durable_runs"]
    ]
    rows = []

    def med(r: dict[str, Any] | None, metric: str) -> float | None:
        if r is None or metric not in r["metrics"]:
            return None
        return float(r["metrics"][metric]["median"])

    def less(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    for scenario, steps, runs, name in cases:
        p = ix.get(scenario, "polyloop_postgres", steps, runs)
        if p is None:
            continue
        s = ix.get(scenario, "polyloop_sqlite", steps, runs, durability="full", gc=True)
        m = ix.get(scenario, "polyloop", steps, runs)
        wp, ws, wm = (med(r, "wall_us_per_step") for r in (p, s, m))
        client, server = med(p, "cpu_us_per_step"), med(p, "server_cpu_us_per_step")
        total = None if client is None or server is None else client + server
        rows.append(
            [
                name,
                _num(wp),
                _num(ws),
                _num(wm),
                _ratio(wp, ws),
                _ratio(wp, wm),
                f"{_num(less(wp, wm))} / {_num(less(ws, wm))}",
                f"{_num(client)} + {_num(server)} = {_num(total)}",
                _num(med(s, "cpu_us_per_step")),
                _num(med(p, "wal_bytes_per_step")),
            ]
        )
    if not rows:
        return []
    head = [
        "configuration",
        "PostgreSQL µs/step",
        "SQLite `full` µs/step",
        "memory µs/step",
        "PostgreSQL ÷ SQLite `full`",
        "PostgreSQL ÷ memory",
        "over memory µs/step: PostgreSQL / SQLite",
        "PostgreSQL CPU µs/step: client + server",
        "SQLite `full` CPU µs/step",
        "PostgreSQL WAL bytes/step",
    ]
    info = doc.get("postgres")
    return [
        "## PostgreSQL journal against SQLite `full` and memory",
        "",
        "Medians of wall time per step; ratios are **PostgreSQL ÷ the other** (above 1 the "
        'PostgreSQL journal is slower). SQLite is `SQLiteJournal(durability="full")` with '
        "group commit on (its defaults). `PostgresJournal(dsn, schema=…)` uses a fresh schema "
        "per configuration and repetition, and a pool of 10 connections (the default "
        "`max_size`), opened before timing. Each append is one transaction (BEGIN, the fence, "
        "the rows, COMMIT) sent in one pipelined round trip; the journal counts no commits, so "
        "there is no commits column. Client CPU is this process's (as for SQLite, whose writer "
        "thread is in the process); server CPU is the PostgreSQL processes' own, read from "
        "`/proc` (10 ms ticks), when the server runs on this machine.",
        "",
        *([_server(info), ""] if info else []),
        *_table(head, rows),
        "",
    ]


def instructions(doc: dict[str, Any]) -> list[str]:
    """The callgrind count of PolyLoop's work per step (bench/instructions.py), if made."""
    counted = doc.get("instructions")
    if not counted:
        return []
    head = ["## Work per step, in instructions (callgrind)", ""]
    if "skipped" in counted:
        return [*head, f"Not counted: {counted['skipped']}.", ""]
    return [
        *head,
        "PolyLoop with the memory journal under valgrind's callgrind: instructions per step "
        "as the difference between two child processes that differ only in steps (start-up "
        "and warm-up cancel out). Short runs: 101 runs of 20 steps minus 1; a long run: steps "
        "1,000 to 3,000 of one run. An instruction count does not move with the machine's "
        "load; it is the steadier measure of whether per-step work grows with the history.",
        "",
        *_table(
            ["runs of 20 steps", "around step 2,000 of one run", "flatness (÷)"],
            [
                [
                    _num(counted["instructions_per_step_20"]),
                    _num(counted["instructions_per_step_2000"]),
                    f"{counted['flatness']:.3f}",
                ]
            ],
        ),
        "",
        *_durable_instructions(counted.get("durable")),
    ]


def _durable_instructions(d: dict[str, Any] | None) -> list[str]:
    """Issue 4's configuration counted: the memory journal's work per step against SQLite
    `full`'s, the latter split between the event loop's thread and the writer's."""
    if not d:
        return []
    memory, loop, other = d["memory"], d["sqlite_loop"], d["sqlite_other"]
    return [
        f"{d['runs']} concurrent runs of 20 steps (two batches minus one), instructions per step "
        "by thread. The SQLite writer thread and the event loop share the interpreter lock, so "
        "their work adds up in time; the event loop's share alone is the least a durable step "
        "can cost there, however the writer's work were moved or overlapped.",
        "",
        *_table(
            [
                "memory journal",
                "SQLite `full`: event loop",
                "SQLite `full`: writer (other threads)",
                "SQLite `full`: all",
                "all ÷ memory",
                "event loop ÷ memory",
            ],
            [
                [
                    _num(memory),
                    _num(loop),
                    _num(other),
                    _num(loop + other),
                    _ratio(loop + other, memory),
                    _ratio(loop, memory),
                ]
            ],
        ),
        "",
    ]


def targets(doc: dict[str, Any], ix: _Index) -> list[str]:
    """The issue's targets, each with its measured value and met / not met."""
    plan = doc["plan"]
    steps = plan["single_steps"]
    mid = steps[1] if len(steps) > 1 else steps[0]
    rows: list[list[str]] = []

    def check(what: str, value: float | None, limit: float, shown: str) -> None:
        if value is None:
            rows.append([what, "not measured", "–"])
            return
        rows.append([what, shown, "met" if value <= limit else "**not met**"])

    w = ix.med("wall_us_per_step", "single", "polyloop", mid)
    c = ix.med("cpu_us_per_step", "single", "polyloop", mid)
    check(
        f"memory journal ≤ 50 µs/step at {mid} steps (wall)",
        w,
        50,
        f"{_num(w)} µs wall, {_num(c)} µs CPU",
    )
    a = ix.med("wall_us_per_step", "single", "polyloop", steps[-1])
    b = ix.med("wall_us_per_step", "single", "polyloop", steps[0])
    ca = ix.med("cpu_us_per_step", "single", "polyloop", steps[-1])
    cb = ix.med("cpu_us_per_step", "single", "polyloop", steps[0])
    flat = None if a is None or b is None else a / b
    shown = f"{_ratio(a, b)} wall, {_ratio(ca, cb)} CPU"
    counted = doc.get("instructions") or {}
    if "flatness" in counted:  # the work itself, not the machine's mood: judged on this
        flat = counted["flatness"]
        shown = f"{flat:.2f} instructions (callgrind); {shown}"
    check(f"per-step at {steps[-1]} ≤ 1.5 × at {steps[0]} steps", flat, 1.5, shown)
    a = ix.med("wall_us_per_step", "single", "polyloop_sqlite", mid, durability="full")
    b = ix.med("wall_us_per_step", "single", "floor_sqlite", mid, durability="full")
    ca = ix.med("cpu_us_per_step", "single", "polyloop_sqlite", mid, durability="full")
    cb = ix.med("cpu_us_per_step", "single", "floor_sqlite", mid, durability="full")
    r = None if a is None or b is None else a / b
    check(
        f"SQLite `full` ≤ 1.3 × floor with the same fsync'd commits ({mid} steps)",
        r,
        1.3,
        f"{_ratio(a, b)} wall, {_ratio(ca, cb)} CPU",
    )
    cs = plan["concurrent_runs"]
    for system, limit in (("polyloop", 1.10), ("polyloop_sqlite", 1.25)):
        v = ix.med("wall_vs_ideal", "concurrent", system, runs=cs[0])
        name = "memory" if system == "polyloop" else "SQLite `full`"
        check(
            f"{cs[0]} × {plan['concurrent_steps']} at {plan['latency_ms']:g} ms, {name}: "
            f"≤ {limit:.2f} × ideal",
            v,
            limit,
            _num(v),
        )
    a = ix.med("stored_bytes_per_step", "single", "polyloop_sqlite", steps[-1], durability="full")
    b = ix.med("stored_bytes_per_step", "single", "polyloop_sqlite", steps[0], durability="full")
    grow = None if a is None or b is None else a / b
    check(
        f"journal bytes/step bounded: stored bytes/step at {steps[-1]} ÷ at {steps[0]} steps ≤ 1.5",
        grow,
        1.5,
        f"{_num(b)} → {_num(a)} B/step ({_ratio(a, b)})",
    )
    v = ix.med("wall_s", "resume", "polyloop_sqlite")
    check(f"resume of a {plan['resume_steps']}-step run < 1 s", v, 1.0, f"{_num(v)} s")
    dr = plan["durable_runs"][-1]
    a = ix.med(
        "wall_us_per_step", "durable", "polyloop_sqlite", runs=dr, durability="full", gc=True
    )
    b = ix.med("wall_us_per_step", "durable", "polyloop", runs=dr)
    ca = ix.med(
        "cpu_us_per_step", "durable", "polyloop_sqlite", runs=dr, durability="full", gc=True
    )
    cb = ix.med("cpu_us_per_step", "durable", "polyloop", runs=dr)
    r = None if a is None or b is None else a / b
    shown = f"{_ratio(a, b)} wall, {_ratio(ca, cb)} CPU"
    d = counted.get("durable")
    if d:  # the work, split by thread: shown beside the times, which move by half run to run
        shown += (
            f"; instructions {_ratio(d['sqlite_loop'] + d['sqlite_other'], d['memory'])} "
            f"(event loop alone {_ratio(d['sqlite_loop'], d['memory'])})"
        )
    check(f"issue 4: SQLite `full` with {dr} concurrent runs < 2 × memory journal", r, 2.0, shown)
    # Issue 21's targets (throughput at rollout scale).
    n = counted.get("instructions_per_step_20")
    check("issue 21: ≤ 150,000 instructions per step (callgrind)", n, 150_000, _num(n))
    f = counted.get("flatness")
    check("issue 21: flatness ≤ 1.05 (instructions)", f, 1.05, _num(f))
    for system, runs, limit in (
        ("polyloop", cs[-1], 1.25),
        ("polyloop_sqlite", cs[0], 1.5),
        ("polyloop_sqlite", cs[-1], 3.0),
        ("polyloop_sqlite_process", cs[0], 1.5),
        ("polyloop_sqlite_process", cs[-1], 3.0),
    ):
        v = ix.med("wall_vs_ideal", "concurrent", system, runs=runs)
        name = {
            "polyloop": "memory",
            "polyloop_sqlite": "SQLite `full`",
            "polyloop_sqlite_process": 'SQLite `full`, `writer="process"`',
        }[system]
        check(
            f"issue 21: {runs} × {plan['concurrent_steps']} at {plan['latency_ms']:g} ms, "
            f"{name}: ≤ {limit:g} × ideal",
            v,
            limit,
            _num(v),
        )
    return ["## Targets", "", *_table(["target", "measured (median)", ""], rows), ""]


__all__ = ["SYSTEMS", "aggregate", "instructions", "markdown", "postgres"]
