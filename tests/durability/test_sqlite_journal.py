"""The SQLite journal (durability.md "Storage"): the kernel contract on a file, its tables read
with plain SQL, leases across journal objects and processes, group commit, and refusal of
anything it cannot read safely (without modifying it).

Crashes are injected two ways: in-process (``Crash`` around a journal write, as in
tests/contract/test_resume.py) followed by a *new* ``SQLiteJournal`` object on the same file,
and for real (a child process that ``os._exit``s around a write, holding its lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    ConfigError,
    JournalError,
    LeaseLost,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    RunDetached,
    RunExists,
    RunLeased,
    RunNotFound,
    StepRecord,
    StopReason,
    ToolRegistry,
    Usage,
)
from polyloop.journal import MemoryJournal, SQLiteJournal
from polyloop.journal._owner import host_id, new_owner
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import (
    ActionIntent,
    Lease,
    ModelIntent,
    ModelRequest,
    Record,
    ReplayPolicy,
    RunEnd,
    RunSpec,
    StepAppended,
    StepWritten,
)
from tests.conftest import Crash, RecordingJournal, call, make_tools
from tests.contract.test_resume import World, comparable, new_loop

REPO = Path(__file__).resolve().parents[2]


# -- helpers ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def opened(path: Path, **kw: Any) -> AsyncIterator[SQLiteJournal]:
    journal = SQLiteJournal(path, **kw)
    try:
        yield journal
    finally:
        await journal.aclose()


def recording(inner: SQLiteJournal, **kw: Any) -> RecordingJournal:
    """conftest's crash wrapper around a SQLite journal (it only delegates the seam methods;
    its ``records()``-based helpers are MemoryJournal's and are not used here)."""
    return RecordingJournal(inner, **kw)  # type: ignore[arg-type]


def sql(path: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(query, args).fetchall()


def tamper(path: Path, *statements: str) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for statement in statements:
            conn.execute(statement)


def file_bytes(path: Path) -> bytes:
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    return path.read_bytes()


async def records_of(journal: SQLiteJournal, run_id: str) -> tuple[Record, ...]:
    return tuple((await journal.read(run_id))[1])


async def make_reference() -> tuple[RecordingJournal, Any]:
    journal = RecordingJournal()
    result = await new_loop(World(), journal).run("pay", run_id="r")
    return journal, result


def first_write(ref: RecordingJournal, kind: str, tool: str | None = None) -> int:
    """1-based number of the reference run's first write whose first record is ``kind``."""
    return next(
        i
        for i, batch in enumerate(ref.appends, start=1)
        if batch[0].kind == kind
        and (
            tool is None
            or (isinstance(batch[0], ActionIntent) and batch[0].action.tool_name == tool)
        )
    )


def run_child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        check=False,
    )


def run_crash_child(*args: str) -> subprocess.CompletedProcess[str]:
    """tests/durability/crash_child.py: SIGKILLs itself around its n-th journal write."""
    return subprocess.run(
        [sys.executable, "-m", "tests.durability.crash_child", *args],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip


# -- the kernel contract on SQLite ------------------------------------------------------------


async def test_records_read_back_equal_the_records_appended(tmp_path: Path) -> None:
    async with opened(tmp_path / "j.db") as journal:
        rec = recording(journal)
        result = await new_loop(World(), rec).run("pay", run_id="r", metadata={"team": "a"})
        spec, records = await journal.read("r")
    assert tuple(records) == tuple(r for batch in rec.appends for r in batch)
    assert spec.goal == "pay" and spec.metadata == {"team": "a"} and spec.run_id == "r"
    assert result.stop_reason == StopReason.task_completed


def _scenarios() -> dict[str, tuple[Callable[[ModelRequest], Any], Limits]]:
    def final(req: ModelRequest) -> Any:
        return call("noop") if req.step_idx == 0 else ModelReply("the answer")

    def retry_then_final(req: ModelRequest) -> Any:
        if req.attempt == 1:
            raise ModelCallError("slow down", retryable=True, kind="rate_limit")
        return ModelReply("ok")

    def fail(req: ModelRequest) -> Any:
        raise ModelCallError("invalid api key", kind="auth")

    return {
        "agent_finished": (final, Limits()),
        "retried_then_finished": (retry_then_final, Limits()),
        "task_completed": (lambda r: call("done", {"answer": "42"}), Limits()),
        "step_budget": (lambda r: call("noop"), Limits(max_steps=3)),
        "action_budget": (lambda r: call("count", {"n": 2}), Limits(max_actions=2)),
        "env_error": (lambda r: call("broken"), Limits()),
        "llm_error": (fail, Limits()),
        "parse_failed_repeatedly": (lambda r: ModelReply(""), Limits()),
        "not_executed_then_finished": (
            lambda r: call("nope") if r.step_idx == 0 else ModelReply("fin"),
            Limits(),
        ),
    }


SCENARIOS = _scenarios()


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_a_scenario_on_sqlite_gives_the_memory_journal_result_and_resumes_as_ended(
    name: str, tmp_path: Path
) -> None:
    fn, limits = SCENARIOS[name]

    def loop(journal: Any) -> Loop:
        return Loop(
            FunctionModel(fn), tools=make_tools(), journal=journal, clock=FakeClock(),
            limits=limits,
        )  # fmt: skip

    ref = await loop(MemoryJournal()).run("g", run_id="s")
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        got = await loop(journal).run("g", run_id="s")
    assert (got.stop_reason, got.stop_detail, got.final_answer) == (
        ref.stop_reason, ref.stop_detail, ref.final_answer,
    )  # fmt: skip
    assert [comparable(s) for s in got.steps] == [comparable(s) for s in ref.steps]
    assert (got.steps_used, got.actions_executed) == (ref.steps_used, ref.actions_executed)
    assert len(got.messages) == len(ref.messages)
    async with opened(path) as journal:  # a new object: the ended run comes back as it ended
        model = FunctionModel(fn)
        again = await Loop(model, tools=make_tools(), journal=journal).resume("s")
        assert await journal.steps("s") == list(got.steps)
    assert model.requests == []
    assert again.steps == got.steps and again.stop_reason == got.stop_reason
    assert again.messages == got.messages
    row = sql(path, "SELECT status, stop_reason, steps_used, actions_executed, owner FROM runs")
    assert row == [("ended", got.stop_reason.value, got.steps_used, got.actions_executed, None)]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_around_any_write_resumes_on_a_new_journal_object(
    after: bool, tmp_path: Path
) -> None:
    ref_journal, ref = await make_reference()
    total = ref_journal.count
    never_intents = {
        i: batch[0]
        for i, batch in enumerate(ref_journal.appends, start=1)
        if isinstance(batch[0], ActionIntent) and batch[0].replay_policy == ReplayPolicy.never
    }
    for n in range(1, total + 1):
        path = tmp_path / f"crash-{n}.db"
        world = World()
        async with opened(path) as first:
            with pytest.raises(Crash):
                await new_loop(world, recording(first, crash_at=n, crash_after=after)).run(
                    "pay", run_id="r"
                )
        async with opened(path) as journal:  # the "restarted process"
            r = await new_loop(world, journal).resume("r")
            records = await records_of(journal, "r")
        assert sum(isinstance(x, RunEnd) for x in records) == 1, n
        assert isinstance(records[-1], RunEnd), n
        assert len(world.charged) <= 1, f"charged twice after a crash at write {n}"
        if len(world.stored) > 2:
            assert len(set(world.stored)) == 2, "an idempotent replay reuses its op_id"
        steps_rows = sql(path, "SELECT step_idx FROM steps WHERE run_id = 'r' ORDER BY 1")
        assert steps_rows == [(s.step_idx,) for s in r.steps], n  # no step lost or doubled
        seqs = sql(path, "SELECT seq FROM journal WHERE run_id = 'r' ORDER BY seq")
        assert seqs == [(i,) for i in range(1, len(records) + 1)], n
        unknown = never_intents.get(n if after else n - 1)
        if unknown is not None:
            assert r.stop_reason == StopReason.resume_state_unknown, n
            p = r.pending_action
            assert p is not None and p.tool_name == unknown.action.tool_name
            k = unknown.step_idx
            assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]]
            continue
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert (r.steps_used, r.actions_executed) == (ref.steps_used, ref.actions_executed)
        assert world.charged == ["5"], n
        assert len(r.messages) == len(ref.messages), n


async def test_detach_then_resume_on_another_journal_object(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    world = World()
    async with opened(path) as journal:
        holder: list[Loop] = []

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended) and event.step.step_idx == 1:
                holder[0].detach("r")

        loop = new_loop(world, journal, observers=[on_event])
        holder.append(loop)
        with pytest.raises(RunDetached):
            await loop.run("pay", run_id="r")
    assert sql(path, "SELECT status, owner FROM runs") == [("running", None)]
    assert sql(path, "SELECT count(*) FROM steps") == [(2,)]
    async with opened(path) as journal:
        r = await new_loop(world, journal).resume("r")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 6


async def test_cancelling_a_run_writes_the_cancelled_end_record(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    started = asyncio.Event()
    tools = ToolRegistry()

    @tools.tool
    async def wait_forever() -> str:
        """Blocks."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = FunctionModel(lambda r: call("wait_forever"))
    async with opened(path) as journal:
        task = asyncio.ensure_future(
            Loop(model, tools=tools, journal=journal, cancel_grace_s=0).run("g", run_id="c")
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with opened(path) as journal:
        r = await Loop(model, tools=tools, journal=journal).resume("c")
    assert r.stop_reason == StopReason.cancelled
    assert "outcome unknown" in (r.stop_detail or "")
    assert sql(path, "SELECT stop_reason, owner FROM runs") == [("cancelled", None)]


# -- the tables, read with plain SQL ----------------------------------------------------------


async def test_runs_table_counts_stop_reasons_with_plain_sql(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        for name in ("agent_finished", "step_budget", "env_error", "llm_error"):
            fn, limits = SCENARIOS[name]
            loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal, limits=limits,
                        clock=FakeClock())  # fmt: skip
            for i in range(2 if name == "env_error" else 1):
                await loop.run("g", run_id=f"{name}-{i}")
        listed = await journal.list_runs()
    counts = dict(sql(path, "SELECT stop_reason, count(*) FROM runs GROUP BY 1"))
    assert counts == {"agent_finished": 1, "step_budget": 1, "env_error": 2, "llm_error": 1}
    assert {d["run_id"] for d in listed} == {
        "agent_finished-0", "step_budget-0", "env_error-0", "env_error-1", "llm_error-0",
    }  # fmt: skip
    budget = next(d for d in listed if d["run_id"] == "step_budget-0")
    assert budget["steps_used"] == 3 and budget["limits"]["max_steps"] == 3
    assert "history_json" not in budget


async def test_steps_table_has_a_column_per_step_record_field(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        r = await new_loop(World(), journal).run("pay", run_id="r")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM steps WHERE run_id = ?", ("r",)).fetchall()
        columns = [d[0] for d in conn.execute("SELECT * FROM steps LIMIT 0").description]
    assert columns == ["run_id", *(f.name for f in fields(StepRecord))]
    assert len(rows) == len(r.steps)
    for row, step in zip(sorted(rows, key=lambda x: x["step_idx"]), r.steps, strict=True):
        expected = step.to_dict()
        got = {k: row[k] for k in expected}
        for name in ("parse_ok", "observation_synthetic", "completed"):
            assert got[name] in (0, 1)
            got[name] = bool(got[name])
        assert got == expected


async def test_model_calls_accounts_mark_an_attempt_lost_in_a_crash_uncertain(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    world = World()
    async with opened(path) as journal:  # crash right after step 0's model intent
        with pytest.raises(Crash):
            await new_loop(world, recording(journal, crash_at=1, crash_after=True)).run(
                "pay", run_id="r"
            )
    assert sql(path, "SELECT attempt, state FROM model_calls") == [(1, "pending")]
    async with opened(path) as journal:
        r = await new_loop(world, journal).resume("r")
    rows = sql(
        path,
        "SELECT step_idx, attempt, state, llm_call_id, error FROM model_calls "
        "WHERE run_id = 'r' ORDER BY step_idx, attempt",
    )
    by_step: dict[int, list[tuple[int, str]]] = {}
    for step_idx, attempt, state, _, _ in rows:
        by_step.setdefault(step_idx, []).append((attempt, state))
    assert by_step[0] == [(1, "uncertain"), (2, "ok")]
    assert by_step[2] == [(1, "retried"), (2, "ok")]
    assert all(v == [(1, "ok")] for k, v in by_step.items() if k not in (0, 2))
    ok_ids = {row[3] for row in rows if row[2] == "ok"}
    assert ok_ids == {s.llm_call_id for s in r.steps}  # the join key to the steps table
    retried = next(row for row in rows if row[2] == "retried")
    assert retried[4].startswith("ModelCallError: rate limited")
    intents = sql(path, "SELECT count(DISTINCT intent_id) FROM model_calls WHERE step_idx = 0")
    assert intents == [(1,)]  # the same intent id across the crash


async def test_model_calls_record_a_final_failure_and_usage(tmp_path: Path) -> None:
    path = tmp_path / "j.db"

    def fn(req: ModelRequest) -> ModelReply:
        if req.step_idx == 1:
            raise ModelCallError("bad request", kind="bad_request")
        return ModelReply(tool_calls=call("noop").tool_calls, usage=Usage(12, 3), call_id="c-1")

    async with opened(path) as journal:
        r = await Loop(FunctionModel(fn), tools=make_tools(), journal=journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    rows = sql(path, "SELECT step_idx, state, llm_call_id, input_tokens, output_tokens "
                     "FROM model_calls ORDER BY step_idx")  # fmt: skip
    assert rows == [(0, "ok", "c-1", 12, 3), (1, "failed", None, None, None)]


async def test_journal_seq_is_contiguous_and_kinds_match_bodies(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        loop = new_loop(World(), journal)
        await asyncio.gather(*(loop.run("pay", run_id=f"r{i}") for i in range(3)))
    for i in range(3):
        rows = sql(path, "SELECT seq, kind, body FROM journal WHERE run_id = ? ORDER BY seq",
                   f"r{i}")  # fmt: skip
        assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
        assert all(json.loads(body)["kind"] == kind for _, kind, body in rows)
        assert rows[-1][1] == "end"


def wal_size(path: Path) -> int:
    return Path(f"{path}-wal").stat().st_size


async def test_journal_bytes_per_step_do_not_grow_with_the_history(tmp_path: Path) -> None:
    """A long history is written with the run and never again: a step's appends write the
    same bytes whether the run carries 400 kB of history or none."""

    async def growth_per_step(history_chars: int) -> list[int]:
        path = tmp_path / f"h{history_chars}.db"
        sizes: list[int] = []

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended):
                sizes.append(wal_size(path))

        history = [{"role": "user", "content": "x" * history_chars}]
        async with opened(path) as journal:
            loop = Loop(
                FunctionModel(lambda r: call("noop")), tools=make_tools(), journal=journal,
                limits=Limits(max_steps=12), observers=[on_event],
            )  # fmt: skip
            await loop.run("g", history=history)
        return [b - a for a, b in itertools.pairwise(sizes)]

    without = await growth_per_step(0)
    with_history = await growth_per_step(400_000)
    assert len(with_history) == 11
    assert max(with_history) < 100_000  # four commits of a few pages each, no history copy
    assert sum(with_history) <= sum(without) * 1.2


# -- leases -----------------------------------------------------------------------------------


def spec(run_id: str = "r") -> RunSpec:
    return RunSpec(run_id, "g", Limits(), 0.0, ({"role": "user", "content": "hi"},), {"k": 1})


async def test_a_second_acquire_of_a_live_run_is_run_leased_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as one, opened(path) as two:
        lease = await one.create(spec(), ttl_s=60)
        with pytest.raises(RunExists):
            await two.create(spec(), ttl_s=60)
        before = sql(path, "SELECT * FROM runs")
        with pytest.raises(RunLeased) as info:
            await two.acquire("r", ttl_s=60)
        assert info.value.owner == lease.owner
        assert info.value.expires_at == pytest.approx(lease.expires_at)
        assert lease.owner in str(info.value)
        assert sql(path, "SELECT * FROM runs") == before
        with pytest.raises(RunLeased):
            await new_loop(World(), two).resume("r")
        assert sql(path, "SELECT * FROM runs") == before
        assert sql(path, "SELECT count(*) FROM journal") == [(0,)]


async def test_an_expired_lease_is_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    now = [1000.0]
    async with opened(path, clock=lambda: now[0]) as one, opened(path, clock=lambda: now[0]) as two:
        old = await one.create(spec(), ttl_s=10)
        now[0] += 9
        with pytest.raises(RunLeased):
            await two.acquire("r", ttl_s=10)
        old = await one.renew(old, ttl_s=10)  # renewal moves only the expiry
        now[0] += 9.5
        with pytest.raises(RunLeased):
            await two.acquire("r", ttl_s=10)
        now[0] += 1
        new, got_spec, records = await two.acquire("r", ttl_s=10)
        assert new.owner != old.owner and records == ()
        assert got_spec == spec()  # history and metadata come back as stored
        assert sql(path, "SELECT owner, lease_expires_at FROM runs") == [(new.owner, now[0] + 10)]


def no_such_pid() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 7


async def test_a_dead_owners_lease_is_taken_over_at_once(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    child = run_child(
        "import asyncio, os, sys\n"
        "from polyloop import Limits\n"
        "from polyloop.journal import SQLiteJournal\n"
        "from polyloop.types import RunSpec\n"
        "async def main():\n"
        "    j = SQLiteJournal(sys.argv[1])\n"
        "    lease = await j.create(RunSpec('r', 'g', Limits(), 0.0), ttl_s=3600)\n"
        "    print(lease.owner, flush=True)\n"
        "    os._exit(0)  # dies holding the lease\n"
        "asyncio.run(main())\n",
        str(path),
    )
    assert child.returncode == 0, child.stderr
    dead = child.stdout.strip()
    assert sql(path, "SELECT owner FROM runs") == [(dead,)]
    async with opened(path) as journal:
        lease, _, _ = await journal.acquire("r", ttl_s=60)  # the lease had an hour to run
        assert lease.owner != dead
        # A forged owner on this host whose pid cannot exist is dead too.
        forged = f"{host_id()}/{no_such_pid()}/12345/feedface"
        tamper(path, f"UPDATE runs SET owner = '{forged}', lease_expires_at = 1e12")
        lease2, _, _ = await journal.acquire("r", ttl_s=60)
        assert lease2.owner not in (forged, lease.owner)


async def test_a_stale_owners_writes_after_a_takeover_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    now = [1000.0]
    async with (
        opened(path, clock=lambda: now[0]) as stale,
        opened(path, clock=lambda: now[0]) as fresh,
    ):
        old = await stale.create(spec(), ttl_s=10)
        await stale.append(old, [ModelIntent(0, "i", 1)])  # warms the next-seq cache
        now[0] += 11
        new, _, records = await fresh.acquire("r", ttl_s=60)
        assert [r.kind for r in records] == ["model_intent"]
        await fresh.append(new, [ModelIntent(0, "i", 2)])
        before = sql(path, "SELECT * FROM journal"), sql(path, "SELECT * FROM model_calls")
        with pytest.raises(LeaseLost, match="no longer holds the lease"):
            await stale.append(old, [ModelIntent(0, "i", 3)])
        with pytest.raises(LeaseLost):
            await stale.renew(old, ttl_s=10)
        await stale.release(old)  # not ours any more: a no-op
        after = sql(path, "SELECT * FROM journal"), sql(path, "SELECT * FROM model_calls")
        assert after == before
        assert sql(path, "SELECT owner FROM runs") == [(new.owner,)]
        await fresh.append(new, [ModelIntent(0, "i", 3)])  # the new owner goes on
        assert sql(path, "SELECT max(seq) FROM journal") == [(3,)]
        # The takeover's attempt found attempt 1 pending: it was lost with the old owner.
        states = sql(path, "SELECT attempt, state FROM model_calls ORDER BY attempt")
        assert states == [(1, "uncertain"), (2, "uncertain"), (3, "pending")]


async def test_the_end_record_releases_the_lease_in_its_transaction(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        lease = await journal.create(spec(), ttl_s=60)
        end = RunEnd(StopReason.agent_finished, None, "done", 0, 0, 5.0)
        await journal.append(lease, [end])
        assert sql(path, "SELECT status, owner, final_answer, ended_at FROM runs") == [
            ("ended", None, "done", 5.0)
        ]
        with pytest.raises(LeaseLost):
            await journal.append(lease, [ModelIntent(0, "i", 1)])


# -- group commit -----------------------------------------------------------------------------


async def test_200_concurrent_runs_share_commits_and_all_complete(tmp_path: Path) -> None:
    def fn(req: ModelRequest) -> ModelReply:
        return call("noop") if req.step_idx == 0 else ModelReply(f"answer {req.run_id}")

    async with opened(tmp_path / "j.db") as journal:
        loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
        results = await asyncio.gather(*(loop.run("g", run_id=f"r{i:03}") for i in range(200)))
        commits = journal.commits
        expected = [
            "model_intent", "model_result", "action_intent", "action_result", "step",
            "model_intent", "model_result", "step", "end",
        ]  # fmt: skip
        for r in results:
            assert r.stop_reason == StopReason.agent_finished
            assert r.final_answer == f"answer {r.run_id}"
            records = await records_of(journal, r.run_id)
            assert [x.kind for x in records] == expected
            assert [s.observation for s in await journal.steps(r.run_id)] == ["ok", None]
    writes = 200 * 8  # a create and seven appends per run
    assert commits < writes / 3, f"{commits} commits for {writes} writes: no group commit"


async def test_a_conflicting_append_fails_only_itself_not_its_batch(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        leases = {k: await journal.create(spec(k), ttl_s=60) for k in "abcd"}
        step = StepRecord(0, "", 0, 0, None, False, None, None, False, 0, 0, None, 0.0)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")  # another writer holds the file
            first = asyncio.ensure_future(journal.renew(leases["a"], ttl_s=60))
            await asyncio.sleep(0.1)  # the writer took it and waits for the lock
            before = journal.commits
            tasks = [
                asyncio.ensure_future(journal.append(leases["a"], [ModelIntent(0, "a", 1)])),
                asyncio.ensure_future(
                    journal.append(Lease("b", new_owner(), 0.0), [ModelIntent(0, "b", 1)])
                ),
                asyncio.ensure_future(  # two step records with one step_idx: a PK conflict
                    journal.append(leases["c"], [StepWritten(step), StepWritten(step)])
                ),
                asyncio.ensure_future(journal.append(leases["d"], [ModelIntent(0, "d", 1)])),
            ]
            await asyncio.sleep(0.1)
            assert not any(t.done() for t in tasks)
            other.execute("COMMIT")
            await first
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert journal.commits - before == 2  # the renewal alone, then the four together
        assert outcomes[0] is None and outcomes[3] is None
        assert isinstance(outcomes[1], LeaseLost)
        assert isinstance(outcomes[2], JournalError) and "UNIQUE" in str(outcomes[2])
        assert [r.kind for r in await records_of(journal, "a")] == ["model_intent"]
        assert [r.kind for r in await records_of(journal, "d")] == ["model_intent"]
        assert await records_of(journal, "b") == () and await records_of(journal, "c") == ()
        assert sql(path, "SELECT count(*) FROM steps") == [(0,)]
        # The failed append left the run writable: its next append lands at seq 1.
        await journal.append(leases["c"], [StepWritten(step)])
        assert sql(path, "SELECT seq FROM journal WHERE run_id = 'c'") == [(1,)]


async def test_without_group_commit_every_write_commits_alone(tmp_path: Path) -> None:
    async with opened(tmp_path / "j.db", group_commit=False) as journal:
        leases = [await journal.create(spec(f"r{i}"), ttl_s=60) for i in range(20)]
        before = journal.commits
        await asyncio.gather(*(journal.append(x, [ModelIntent(0, x.run_id, 1)]) for x in leases))
        assert journal.commits - before == 20


async def test_a_cancelled_append_still_lands_before_cancelled_error(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        lease = await journal.create(spec(), ttl_s=60)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            task = asyncio.ensure_future(journal.append(lease, [ModelIntent(0, "i", 1)]))
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()  # twice: it still waits for its write
            await asyncio.sleep(0.05)
            assert not task.done()
            other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.kind for r in await records_of(journal, "r")] == ["model_intent"]


async def test_a_write_blocked_past_the_busy_timeout_fails_clearly_and_writes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with opened(path, busy_timeout_s=0.2) as journal:
        lease = await journal.create(spec(), ttl_s=60)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(JournalError, match="locked"):
                await journal.append(lease, [ModelIntent(0, "i", 1)])
            other.execute("COMMIT")
        assert await records_of(journal, "r") == ()
        await journal.append(lease, [ModelIntent(0, "i", 1)])  # and it works again
        assert sql(path, "SELECT seq FROM journal") == [(1,)]


async def test_a_cancelled_create_gives_its_lease_back(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            task = asyncio.ensure_future(journal.create(spec(), ttl_s=60))
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.sleep(0.05)
            other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sql(path, "SELECT owner FROM runs") == [(None,)]
        await journal.acquire("r", ttl_s=60)  # resumable at once


# -- processes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "tool", "after"),
    [
        ("model_intent", None, True),
        ("action_result", None, False),
        ("action_intent", "charge", True),
    ],
    ids=["model_intent-after", "action_result-before", "charge_intent-after"],
)
async def test_a_killed_process_is_resumed_by_another_at_once(
    kind: str, tool: str | None, after: bool, tmp_path: Path
) -> None:
    ref_journal, ref = await make_reference()
    n = first_write(ref_journal, kind, tool)
    path, effects = tmp_path / "j.db", tmp_path / "effects.txt"
    effects.touch()
    child = run_crash_child(str(path), str(n), "after" if after else "before", str(effects))
    assert child.returncode == -signal.SIGKILL, child.stderr
    dead_owner = sql(path, "SELECT owner FROM runs")[0][0]
    assert dead_owner is not None  # it died holding the lease
    world = World()
    async with opened(path) as journal:
        r = await new_loop(world, journal).resume("r")
    lines = effects.read_text().splitlines()
    charged = [x for x in lines if x.startswith("charged")] + world.charged
    stored = [x.split()[1] for x in lines if x.startswith("stored")] + world.stored
    assert len(charged) <= 1
    if tool == "charge":
        assert r.stop_reason == StopReason.resume_state_unknown and charged == []
        assert r.pending_action is not None and r.pending_action.tool_name == "charge"
        return
    assert r.stop_reason == ref.stop_reason
    assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps]
    if kind == "action_result":  # the idempotent store ran, its result was lost: same op_id
        assert len(stored) == 3 and stored[0] == stored[1] != stored[2]
    else:
        states = sql(path, "SELECT attempt, state FROM model_calls WHERE step_idx = 0")
        assert sorted(states) == [(1, "uncertain"), (2, "ok")]


_RESUME_CHILD = """
import asyncio, json, os, sys, time
from polyloop import Loop, RunLeased
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel
from tests.contract.test_resume import World, script

path, go = sys.argv[1], sys.argv[2]

async def slow(request):
    await asyncio.sleep(0.05)
    return script(request)

async def main():
    journal = SQLiteJournal(path)
    model = FunctionModel(slow)
    loop = Loop(model, tools=World().tools(), journal=journal, clock=FakeClock())
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        r = await loop.resume("r")
        outcome = r.stop_reason.value
    except RunLeased as exc:
        outcome = "leased"
    await journal.aclose()
    print(json.dumps({"outcome": outcome, "calls": len(model.requests)}), flush=True)

asyncio.run(main())
"""


def test_two_processes_resuming_one_run_advance_it_exactly_once(tmp_path: Path) -> None:
    path, go = tmp_path / "j.db", tmp_path / "go"

    async def interrupted() -> None:  # a run interrupted after its first step
        async with opened(path) as journal:
            with pytest.raises(Crash):
                await new_loop(World(), recording(journal, crash_at=4, crash_after=True)).run(
                    "pay", run_id="r"
                )

    asyncio.run(interrupted())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _RESUME_CHILD, str(path), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        go.touch()
        outs = [child.communicate(timeout=60) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    advanced = [x for x in reports if x["calls"] > 0]
    assert len(advanced) == 1, reports
    assert advanced[0]["outcome"] == "task_completed"
    other = next(x for x in reports if x["calls"] == 0)
    assert other["outcome"] in ("leased", "task_completed")  # refused, or read the ended run
    steps = sql(path, "SELECT step_idx FROM steps ORDER BY 1")
    assert steps == [(i,) for i in range(6)]
    assert sql(path, "SELECT count(*) FROM journal WHERE kind = 'end'") == [(1,)]


# -- what it refuses to read, and leaves as it was --------------------------------------------


async def crashed_run(path: Path) -> None:
    """A run interrupted before its 'charge' action, then the file closed (checkpointed)."""
    ref_journal, _ = await make_reference()
    n = first_write(ref_journal, "action_intent", "charge")
    async with opened(path) as journal:
        with pytest.raises(Crash):
            await new_loop(World(), recording(journal, crash_at=n)).run("pay", run_id="r")


async def test_resume_of_an_unknown_run_is_run_not_found(tmp_path: Path) -> None:
    async with opened(tmp_path / "j.db") as journal:
        with pytest.raises(RunNotFound, match="ghost"):
            await new_loop(World(), journal).resume("ghost")
        with pytest.raises(RunNotFound):
            await journal.acquire("ghost", ttl_s=1)
        with pytest.raises(RunNotFound):
            await journal.steps("ghost")
        with pytest.raises(RunNotFound):
            await journal.append(Lease("ghost", "x", 0.0), [ModelIntent(0, "i", 1)])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("DELETE FROM journal WHERE seq = 5", "out of order"),
        ("UPDATE journal SET seq = seq + 100 WHERE seq = 3", "out of order"),
        ("UPDATE journal SET body = substr(body, 1, 20) WHERE seq = 4", "not valid JSON"),
        ("UPDATE journal SET kind = 'step' WHERE seq = 2", "does not match its kind"),
        ('UPDATE journal SET body = \'{"kind": "model_intent"}\' WHERE seq = 1', "malformed"),
    ],
    ids=["gap", "reordered", "truncated", "kind", "malformed"],
)
async def test_damaged_records_fail_clearly_and_the_file_is_not_modified(
    damage: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "j.db"
    await crashed_run(path)
    tamper(path, damage)
    before = file_bytes(path)
    world = World()
    async with opened(path) as journal:
        with pytest.raises(JournalError, match=message):
            await new_loop(world, journal).resume("r")
        with pytest.raises(JournalError, match=message):
            await journal.read("r")
    assert file_bytes(path) == before
    assert world.charged == world.stored == []


async def test_records_that_contradict_each_other_fail_and_stay_as_they_were(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    await crashed_run(path)
    # Drop a step record and close the gap: every record reads, their order is wrong.
    seq = sql(path, "SELECT min(seq) FROM journal WHERE kind = 'step'")[0][0]
    tamper(path, f"DELETE FROM journal WHERE seq = {seq}",
           f"UPDATE journal SET seq = seq - 1 WHERE seq > {seq}")  # fmt: skip
    before = sql(path, "SELECT * FROM journal ORDER BY run_id, seq")
    async with opened(path) as journal:
        with pytest.raises(JournalError, match="out of order"):
            await new_loop(World(), journal).resume("r")
    assert sql(path, "SELECT * FROM journal ORDER BY run_id, seq") == before
    assert sql(path, "SELECT owner FROM runs") == [(None,)]  # the lease was given back


def test_a_sqlite_database_of_another_application_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    tamper(path, "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)",
           "INSERT INTO invoices VALUES (1, 9.5)")  # fmt: skip
    before = file_bytes(path)
    with pytest.raises(JournalError, match="not a PolyLoop journal") as info:
        SQLiteJournal(path)
    assert "invoices" in str(info.value)
    assert file_bytes(path) == before
    assert not Path(f"{path}-wal").exists()


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "random.db"
    path.write_bytes(os.urandom(8192))
    before = path.read_bytes()
    with pytest.raises(JournalError, match="not a SQLite database"):
        SQLiteJournal(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("key", "version"), [("journal_schema_version", "2.0"), ("step_schema_version", "3.1")]
)
async def test_an_unknown_major_version_is_refused_naming_both_versions(
    key: str, version: str, tmp_path: Path
) -> None:
    path = tmp_path / "j.db"
    await crashed_run(path)
    tamper(path, f"UPDATE meta SET value = '{version}' WHERE key = '{key}'")
    before = file_bytes(path)
    with pytest.raises(JournalError) as info:
        SQLiteJournal(path)
    assert repr(version) in str(info.value) and "1.0" in str(info.value)
    assert "upgrade polyloop" in str(info.value)
    assert file_bytes(path) == before


async def test_a_newer_minor_version_opens_and_resumes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await crashed_run(path)
    tamper(path, "UPDATE meta SET value = '1.7' WHERE key = 'journal_schema_version'",
           "UPDATE runs SET journal_schema_version = '1.7'")  # fmt: skip
    async with opened(path) as journal:
        r = await new_loop(World(), journal).resume("r")
    assert r.stop_reason == StopReason.task_completed
    assert sql(path, "SELECT value FROM meta WHERE key = 'journal_schema_version'") == [("1.7",)]


async def test_an_empty_file_gets_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    async with opened(path, durability="normal") as journal:
        await journal.create(spec(), ttl_s=1)
    assert sql(path, "PRAGMA journal_mode") == [("wal",)]
    meta = dict(sql(path, "SELECT key, value FROM meta"))
    assert meta == {"journal_schema_version": "1.0", "step_schema_version": "1.0"}


def test_bad_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="durability"):
        SQLiteJournal(tmp_path / "j.db", durability="off")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="MemoryJournal"):
        SQLiteJournal(":memory:")


async def test_metadata_that_is_not_json_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.db"
    async with opened(path) as journal:
        with pytest.raises(TypeError, match="JSON-ready"):
            await journal.create(
                RunSpec("r", "g", Limits(), 0.0, metadata={"x": object()}), ttl_s=1
            )
    assert sql(path, "SELECT count(*) FROM runs") == [(0,)]


# -- lifecycle --------------------------------------------------------------------------------


async def test_close_stops_the_writer_and_later_calls_fail_clearly(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    lease = await journal.create(spec(), ttl_s=60)
    thread = journal._writer._thread
    await journal.aclose()
    assert not thread.is_alive()
    journal.close()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        await journal.append(lease, [ModelIntent(0, "i", 1)])
    with pytest.raises(JournalError, match="closed"):
        await journal.read("r")


def test_an_unclosed_journal_stops_its_writer_when_collected(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    thread = journal._writer._thread
    del journal
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


@pytest.fixture(autouse=True)
def _no_stray_writer_threads() -> Iterator[None]:
    import threading

    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t.name.startswith("polyloop-journal-writer")]
        if not left:
            return
        time.sleep(0.01)
    raise AssertionError(f"writer threads left running: {left}")
