"""Batch execution on the local backend, and the recovery sweeper, on a SQLite journal."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from polyloop import ConfigError, Limits, StopReason
from polyloop.batch import (
    BatchProgress,
    Goal,
    GoalFileError,
    execute,
    find_stalled,
    goal_run_id,
    journal_spec,
    load_goals,
    recover,
    resolve_factory,
    run_batch,
    submit,
)
from polyloop.journal import MemoryJournal, SQLiteJournal
from tests.batch import world
from tests.batch.checks import check_batch, sql

REPO = Path(__file__).resolve().parents[2]


def goals(n: int) -> list[str]:
    return [f"task {i}" for i in range(n)]


def loop_factory(tmp_path: Path, **kw: Any) -> Any:
    return functools.partial(world.make_loop, effects=str(tmp_path / "effects"), **kw)


# -- ids and submission -----------------------------------------------------------------------


def test_derived_run_ids_are_deterministic_and_content_addressed() -> None:
    a = Goal("fix it", metadata={"x": 1, "y": [1, 2]}, source="s")
    same = Goal("fix it", metadata={"y": [1, 2], "x": 1}, source="s")
    assert goal_run_id(a) == goal_run_id(same)
    assert len(goal_run_id(a)) == 24 and int(goal_run_id(a), 16) >= 0
    assert goal_run_id(a) != goal_run_id(Goal("fix it", metadata={"x": 1, "y": [1, 2]}))
    assert goal_run_id(a) != goal_run_id(
        Goal("fix it!", metadata={"x": 1, "y": [1, 2]}, source="s")
    )
    assert goal_run_id(Goal("fix it", run_id="mine")) == "mine"
    assert goal_run_id("fix it") == goal_run_id(Goal("fix it"))
    with pytest.raises(ValueError, match="non-finite"):
        goal_run_id(Goal("g", metadata={"x": float("nan")}))


async def test_resubmitting_the_same_batch_never_duplicates_a_run(tmp_path: Path) -> None:
    async with SQLiteJournal(tmp_path / "j.db") as j:
        batch = [*goals(5), Goal("task 0", metadata={"seed": 1}), "task 0"]
        first = await submit(j, batch)
        second = await submit(j, list(reversed(batch)))
        assert first[0] == first[-1] and len(set(first)) == 6
        assert set(first) == set(second)
        rows = await j.list_runs()
    assert len(rows) == 6
    assert all(r["owner"] is None and r["status"] == "running" for r in rows), "queued rows"
    assert sql(tmp_path / "j.db", "SELECT count(*) FROM journal") == [(0,)]


class CountingJournal(SQLiteJournal):
    """A real SQLite journal that counts the rows asked for."""

    creates = 0

    async def create(self, spec: Any, *, ttl_s: float) -> Any:
        self.creates += 1
        return await super().create(spec, ttl_s=ttl_s)


async def test_resubmitting_writes_only_the_new_rows(tmp_path: Path) -> None:
    async with CountingJournal(tmp_path / "j.db") as j:
        await submit(j, goals(5))
        assert j.creates == 5
        ids = await submit(j, [*goals(5), "task new"])  # one query finds the five made before
        assert j.creates == 6
        assert len(await j.list_runs()) == 6 and len(ids) == 6


async def test_two_goals_with_one_explicit_id_but_different_content_are_refused(
    tmp_path: Path,
) -> None:
    j = MemoryJournal()
    with pytest.raises(ConfigError, match="nothing was written"):
        await submit(j, [Goal("a", run_id="r"), Goal("b", run_id="r")])


# -- execution ----------------------------------------------------------------------------------


async def test_fifty_goals_run_eight_at_a_time_and_each_ends_once(tmp_path: Path) -> None:
    track = [0, 0]
    effects = tmp_path / "effects"
    make_loop = loop_factory(tmp_path, latency_s=0.01, track=track)  # counts calls in flight
    snapshots: list[BatchProgress] = []
    batch = [*goals(48), "loop forever", "talk to me"]
    async with SQLiteJournal(tmp_path / "j.db") as j:
        result = await run_batch(
            j, batch, make_loop, concurrency=8, limits=world.LIMITS, on_progress=snapshots.append
        )
    assert result.complete and len(result.outcomes) == 50
    assert result.by_status == {"ended": 50}
    assert result.by_stop_reason == {"task_completed": 48, "step_budget": 1, "agent_finished": 1}
    assert 2 <= track[1] <= 8, f"at most 8 model calls at once, saw {track[1]}"
    last = snapshots[-1]
    assert (last.done, last.running, last.total) == (50, 0, 50)
    assert max(s.running for s in snapshots) == 8
    reasons = check_batch(tmp_path / "j.db", effects, batch, tmp_path)
    assert reasons == Counter(result.by_stop_reason)


async def test_a_second_batch_skips_the_ended_runs_and_finishes_the_rest(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    make_loop = loop_factory(tmp_path, calls=str(calls))
    async with SQLiteJournal(tmp_path / "j.db") as j:
        ids = await submit(j, goals(10), limits=world.LIMITS)
        first = await execute(j, ids[:4], make_loop)
        assert first.by_status == {"ended": 4}
        calls_before = len(world.effects_of(calls))
        second = await run_batch(j, goals(10), make_loop, limits=world.LIMITS)
        assert second.by_status == {"already_ended": 4, "ended": 6}
        assert [o.run_id for o in second.outcomes] == ids
        assert len(world.effects_of(calls)) - calls_before == 6 * 3, "no call for ended runs"
        third = await run_batch(j, goals(10), make_loop, limits=world.LIMITS)
    assert third.by_status == {"already_ended": 10} and third.complete
    assert third.by_stop_reason == {"task_completed": 10}
    check_batch(tmp_path / "j.db", tmp_path / "effects", goals(10), tmp_path)


async def test_stop_reasons_are_results_and_failures_are_outcomes_not_exceptions(
    tmp_path: Path,
) -> None:
    async with SQLiteJournal(tmp_path / "j.db") as j:
        result = await execute(j, ["no-such-run"], loop_factory(tmp_path))
        assert result.by_status == {"error": 1}
        assert "RunNotFound" in (result.outcomes[0].detail or "")
        budget = await run_batch(j, ["loop a"], loop_factory(tmp_path), limits=Limits(max_steps=2))
    assert budget.outcomes[0].stop_reason == StopReason.step_budget
    assert budget.outcomes[0].status == "ended"


async def test_a_cancelled_batch_detaches_its_runs_and_the_next_batch_finishes_them(
    tmp_path: Path,
) -> None:
    """Graceful shutdown: runs in flight stop at a step boundary with no end record."""
    effects = tmp_path / "effects"
    make_loop = loop_factory(tmp_path, latency_s=0.05)
    batch = goals(12)
    async with SQLiteJournal(tmp_path / "j.db") as j:
        task = asyncio.ensure_future(
            run_batch(j, batch, make_loop, concurrency=4, limits=world.LIMITS)
        )
        while sql(tmp_path / "j.db", "SELECT count(*) FROM steps")[0][0] < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rows = await j.list_runs()
        assert not any(r["stop_reason"] == "cancelled" for r in rows), "never cancelled"
        assert all(r["owner"] is None for r in rows), "every lease released"
        paused = [r for r in rows if r["status"] == "running" and r["steps_used"] > 0]
        assert paused, "some runs were detached mid-way"
        result = await run_batch(j, batch, make_loop, concurrency=4, limits=world.LIMITS)
    assert result.complete
    check_batch(tmp_path / "j.db", effects, batch, tmp_path)


async def test_two_workers_racing_for_the_same_runs_advance_each_run_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    batch = goals(6)
    calls_a, calls_b = tmp_path / "calls-a", tmp_path / "calls-b"
    async with SQLiteJournal(path) as ja, SQLiteJournal(path) as jb:
        ids = await submit(ja, batch, limits=world.LIMITS)
        a, b = await asyncio.gather(
            execute(ja, ids, loop_factory(tmp_path, latency_s=0.02, calls=str(calls_a))),
            execute(jb, ids, loop_factory(tmp_path, latency_s=0.02, calls=str(calls_b))),
        )
    by_a = Counter(c["run"] for c in world.effects_of(calls_a))
    by_b = Counter(c["run"] for c in world.effects_of(calls_b))
    for run_id in ids:
        assert (by_a[run_id] == 0) != (by_b[run_id] == 0), "exactly one worker advanced it"
        assert by_a[run_id] + by_b[run_id] == 3, "each step's model call made once"
    statuses = Counter(o.status for o in (*a.outcomes, *b.outcomes))
    assert statuses["leased"] >= 1, "they did race"
    for oa, ob in zip(a.outcomes, b.outcomes, strict=True):
        assert "ended" in (oa.status, ob.status), "every run ended, through one of them"
    check_batch(path, tmp_path / "effects", batch, tmp_path)


# -- the driver dies: the sweeper ----------------------------------------------------------------


def test_a_killed_driver_is_finished_by_the_sweeper(tmp_path: Path) -> None:
    path, effects = tmp_path / "j.db", tmp_path / "effects"
    n, stall_from, concurrency = 20, 8, 4
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [str(path), str(effects), str(n), "0.02", str(concurrency), str(stall_from)]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.batch.driver_child", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        # Runs 0-7 end; runs 8-11 hang mid-run (step 1's model call); runs 12-19 wait.
        world.wait_for(
            lambda: (
                child.poll() is not None
                or (_ended(path) == stall_from and _mid_run(path) == concurrency)
            ),
            what="the child to reach its stall",
        )
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL
    left = n - _ended(path)
    assert left == n - stall_from

    async def sweep() -> None:
        async with SQLiteJournal(path) as j:
            stalled = await find_stalled(j, older_than_s=0)
            # mid-run: leases of a dead process (not expired yet); never started: no owner
            why = Counter(s.why for s in stalled)
            assert why == {"leased": concurrency, "unowned": left - concurrency}
            result = await recover(j, loop_factory(tmp_path, latency_s=0.01), older_than_s=0)
            assert result.complete, result.summary()
            assert len(result.outcomes) == left
            assert await find_stalled(j, older_than_s=0) == []
            again = await recover(j, loop_factory(tmp_path), older_than_s=0)
            assert again.outcomes == ()

    asyncio.run(sweep())
    check_batch(path, effects, [f"task {i}" for i in range(n)], tmp_path)


def _ended(path: Path) -> int:
    try:
        return int(sql(path, "SELECT count(*) FROM runs WHERE status = 'ended'")[0][0])
    except Exception:
        return 0


def _mid_run(path: Path) -> int:
    """Runs leased, with records, not ended."""
    try:
        query = (
            "SELECT count(*) FROM runs WHERE status = 'running' AND owner IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM journal WHERE journal.run_id = runs.run_id)"
        )
        return int(sql(path, query)[0][0])
    except Exception:
        return 0


async def test_the_sweeper_leaves_live_and_young_runs_alone(tmp_path: Path) -> None:
    async with SQLiteJournal(tmp_path / "j.db") as j:
        await submit(j, goals(3))
        assert await find_stalled(j, older_than_s=3600) == [], "just submitted: not stalled"
        assert len(await find_stalled(j, older_than_s=0)) == 3
        # a live lease (held here, by another execution): the sweeper must not take it
        await j.acquire(goal_run_id("task 0"), ttl_s=60)
        result = await recover(j, loop_factory(tmp_path), older_than_s=0)
    by_id = {o.run_id: o.status for o in result.outcomes}
    assert by_id[goal_run_id("task 0")] == "leased"
    assert by_id[goal_run_id("task 1")] == "ended"


async def test_the_sweeper_needs_a_journal_that_lists_runs() -> None:
    class Unlisted:  # the Journal seam has no list_runs; SQLite, PostgreSQL, memory add it
        pass

    with pytest.raises(ConfigError, match="lists its runs"):
        await find_stalled(Unlisted())  # type: ignore[arg-type]


# -- goal files -----------------------------------------------------------------------------------


def test_goal_files_name_the_bad_line(tmp_path: Path) -> None:
    f = tmp_path / "g.jsonl"
    f.write_text('{"goal": "a"}\n\n{"goal": "b", "metadata": {"k": 1}, "run_id": "r2"}\n')
    got = load_goals(f)
    assert [(g.goal, g.run_id) for g in got] == [("a", None), ("b", "r2")]
    assert got[0].source == str(f.resolve())
    for text, why in [
        ('{"goal": "a"}\n{"goal": 3}\n', 'line 2: "goal" must be a non-empty string'),
        ('{"goal": "a"}\nnot json\n', "line 2: not valid JSON"),
        ("[1]\n", "line 1: expected a JSON object"),
        ('{"goal": "a", "extra": 1}\n', "line 1: unknown key"),
        ('{"goal": "a", "metadata": []}\n', 'line 1: "metadata" must be a JSON object'),
        ("\n\n", "holds no goal"),
    ]:
        f.write_text(text)
        with pytest.raises(GoalFileError, match=why.replace("(", r"\(")):
            load_goals(f)
    f.write_text('{"goal": "a", "metadata": {"cli": 1}}\n')
    with pytest.raises(GoalFileError, match=r"line 1: .*reserved"):
        load_goals(f, reserved=("cli",))


# -- specs, factories, the missing extra ---------------------------------------------------


async def test_journal_specs_and_factory_paths_reopen_the_same_things(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYLOOP_TEST_EFFECTS", str(tmp_path / "effects"))
    async with SQLiteJournal(tmp_path / "j.db") as j:
        spec = journal_spec(j)
        assert spec == f"sqlite:{tmp_path / 'j.db'}"
        await submit(j, ["task 1"], limits=world.LIMITS)
    # a spec string and a "module:function" path: what a Ray worker gets
    result = await execute(spec, [goal_run_id("task 1")], "tests.batch.world:make_loop_for_tests")
    assert result.by_stop_reason == {"task_completed": 1}
    with pytest.raises(ConfigError, match="cannot be opened by another process"):
        journal_spec(MemoryJournal())
    with pytest.raises(ConfigError, match="cannot load make_loop"):
        resolve_factory("tests.batch.world:no_such_function")
    with pytest.raises(ConfigError, match="module:function"):
        resolve_factory("no colon")


async def test_the_ray_backend_without_ray_says_which_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    async with SQLiteJournal(tmp_path / "j.db") as j:
        with pytest.raises(ImportError, match=r"pip install 'polyloop\[ray\]'"):
            await run_batch(j, ["task 1"], loop_factory(tmp_path), backend="ray")


async def test_a_restarted_worker_takes_back_a_lease_from_another_host_once_it_expires(
    tmp_path: Path,
) -> None:
    """What a restarted Ray worker does when the previous attempt died on another machine: its
    owner cannot be proved dead, so it waits for the lease to expire, then resumes."""
    from polyloop.batch._drive import drive_run

    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as j:
        [run_id] = await submit(j, ["task 1"], limits=world.LIMITS)
        loop = loop_factory(tmp_path)(j)
        expires = time.time() + 1.0
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute(  # a lease of a worker on another host
                "UPDATE runs SET owner = 'otherhost:0/4242/1/abc', lease_expires_at = ? "
                "WHERE run_id = ?",
                (expires, run_id),
            )
        skipped = await drive_run(loop, run_id)
        assert skipped.status == "leased" and "otherhost" in (skipped.detail or "")
        too_long = await drive_run(loop, run_id, wait_leased_s=0.1)
        assert too_long.status == "leased", "never waits longer than it may"
        taken = await drive_run(loop, run_id, wait_leased_s=5.0)
        assert time.time() >= expires
    assert taken.status == "ended" and taken.stop_reason == "task_completed"
    check_batch(path, tmp_path / "effects", ["task 1"], tmp_path)
