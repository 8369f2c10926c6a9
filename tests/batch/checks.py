"""What every batch failure test asserts: each run ended exactly once, its journal rows have no
duplicates or gaps, no ``never``-replay tool ran twice, and its trajectory equals that of an
undisturbed run (or stops ``resume_state_unknown`` where the replay policy demands it)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from polyloop import StepRecord
from polyloop.batch import goal_run_id
from polyloop.journal import MemoryJournal, SQLiteJournal
from tests.batch import world


def sql(path: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(query, args).fetchall()


def comparable(step: StepRecord) -> StepRecord:
    """Equal across two executions except timings and ids drawn per call."""
    return replace(step, step_wall_ms=0.0, llm_call_id=None if step.llm_call_id is None else "id")


_reference_cache: dict[str, list[StepRecord]] = {}


def reference(goal: str, tmp: Path) -> list[StepRecord]:
    """The steps of ``goal`` run undisturbed, start to end, on a memory journal."""
    if goal not in _reference_cache:

        async def go() -> list[StepRecord]:
            loop = world.make_loop(MemoryJournal(), effects=str(tmp / "reference-effects"))
            result = await loop.run(goal, run_id=goal_run_id(goal))
            return [comparable(s) for s in result.steps]

        _reference_cache[goal] = asyncio.run(go()) if not _running() else _in_thread(go)
    return _reference_cache[goal]


def _running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _in_thread(fn: Any) -> Any:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(fn())).result()


def check_batch(journal: Path, effects: Path, goals: list[str], tmp: Path) -> Counter[str]:
    """Assert the whole contract for every goal of a batch finished on a SQLite journal."""

    async def read_all() -> dict[str, Any]:
        async with SQLiteJournal(journal) as j:
            return {goal_run_id(g): await j.steps(goal_run_id(g)) for g in goals}

    stored = asyncio.run(read_all()) if not _running() else _in_thread(read_all)
    return check_rows(lambda q: sql(journal, q), stored, effects, goals, tmp)


def check_rows(
    query: Any, stored: dict[str, list[StepRecord]], effects: Path, goals: list[str], tmp: Path
) -> Counter[str]:
    """The contract, on any journal: ``query(sql)`` gives rows of its tables; ``stored`` is
    each run's steps as the journal reads them back."""
    ids = {goal_run_id(g): g for g in goals}
    runs = {r: (status, reason) for r, status, reason in query(
        "SELECT run_id, status, stop_reason FROM runs"
    )}  # fmt: skip
    assert set(ids) <= set(runs), "every goal has its run row"
    assert len(query("SELECT run_id FROM runs")) == len(runs), "no duplicate run rows"
    ends = dict(query("SELECT run_id, count(*) FROM journal WHERE kind = 'end' GROUP BY 1"))
    seqs = {
        r: (n, lo, hi)
        for r, n, lo, hi in query(
            "SELECT run_id, count(*), min(seq), max(seq) FROM journal GROUP BY 1"
        )
    }
    steps_rows = {
        r: (n, lo, hi)
        for r, n, lo, hi in query(
            "SELECT run_id, count(*), min(step_idx), max(step_idx) FROM steps GROUP BY 1"
        )
    }
    fx = world.effects_of(effects)
    charges = Counter(e["run"] for e in fx if e["tool"] == "charge")
    store_ops: dict[str, set[str]] = {}
    for e in fx:
        if e["tool"] == "store":
            store_ops.setdefault(e["run"], set()).add(e["op"])
    reasons: Counter[str] = Counter()
    for run_id, goal in ids.items():
        status, end_reason = runs[run_id]
        assert status == "ended", f"{goal}: not ended"
        assert ends.get(run_id) == 1, f"{goal}: {ends.get(run_id)} end records"
        n, lo, hi = seqs[run_id]
        assert (lo, hi) == (1, n), f"{goal}: journal seqs {lo}..{hi} for {n} rows"
        n, lo, hi = steps_rows[run_id]
        assert (lo, hi) == (0, n - 1), f"{goal}: steps {lo}..{hi} for {n} rows"
        steps = [comparable(s) for s in stored[run_id]]
        ref = reference(goal, tmp)
        reasons[end_reason] += 1
        assert charges[run_id] <= 1, f"{goal}: the never-replay tool ran {charges[run_id]} times"
        executed_charges = sum(
            s.tool_name == "charge" and s.action_status == "executed" for s in steps
        )
        if end_reason == "resume_state_unknown":
            # only where the policy demands it: the never-replay charge was in flight
            assert steps == ref[: len(steps)], f"{goal}: steps differ from the undisturbed run"
            assert ref[len(steps)].tool_name == "charge", f"{goal}: stopped at the wrong step"
        else:
            assert steps == ref, f"{goal}: trajectory differs from the undisturbed run"
            assert charges[run_id] == executed_charges, f"{goal}: charge effects != its steps"
        stores = sum(s.tool_name == "store" and s.action_status == "executed" for s in steps)
        assert len(store_ops.get(run_id, ())) == stores, f"{goal}: idempotent op ids drifted"
    return reasons
