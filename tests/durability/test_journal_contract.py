"""The contract of a durable journal (durability.md "Storage", "Leases"), run on every backend:
SQLite and PostgreSQL, through the ``journal_backend`` fixture (tests/durability/conftest.py).

The kernel contract on a store, its tables read with plain SQL, leases across journal objects
and processes, writes that land or fail alone, and refusal of anything a journal cannot read
safely (without modifying it). Crashes are injected two ways: in-process (``Crash`` around a
journal write, as in tests/contract/test_resume.py) followed by a *new* journal object on the
same store, and for real (a child process that SIGKILLs itself around a write, holding its
lease; the full proof is test_crash_injection.py). What one backend alone does is tested in
test_sqlite_journal.py and test_postgres_journal.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import secrets
import signal
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
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
    ToolContext,
    ToolRegistry,
    Usage,
)
from polyloop.journal import MemoryJournal
from polyloop.journal import _state as journal_state
from polyloop.journal._owner import host_id, new_owner
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import (
    Lease,
    ModelIntent,
    ModelRequest,
    Record,
    RunEnd,
    RunSpec,
    StepAppended,
    StepWritten,
)
from tests.conftest import Crash, call, first_write, make_tools
from tests.contract.test_resume import World, comparable, new_loop
from tests.durability.journals import (
    REPO,
    SCENARIOS,
    Store,
    check_only_the_conflict_failed,
    check_resumed,
    crashed_run,
    damaged_run,
    make_reference,
    never_replay_intents,
    no_such_pid,
    nul_loop,
    recording,
    records_of,
    run_child,
    spec,
    two_journals,
)

# -- the kernel contract ----------------------------------------------------------------------


async def test_records_read_back_equal_the_records_appended(journal_backend: Store) -> None:
    async with journal_backend.journal() as journal:
        rec = recording(journal)
        result = await new_loop(World(), rec).run("pay", run_id="r", metadata={"team": "a"})
        got_spec, records = await journal.read("r")
    assert tuple(records) == tuple(r for batch in rec.appends for r in batch)
    assert got_spec.goal == "pay" and got_spec.metadata == {"team": "a"}
    assert got_spec.run_id == "r"
    assert result.stop_reason == StopReason.task_completed


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_a_scenario_gives_the_memory_journal_result_and_resumes_as_ended(
    name: str, journal_backend: Store
) -> None:
    store = journal_backend
    fn, limits = SCENARIOS[name]

    def loop(journal: Any) -> Loop:
        return Loop(
            FunctionModel(fn), tools=make_tools(), journal=journal, clock=FakeClock(),
            limits=limits,
        )  # fmt: skip

    ref = await loop(MemoryJournal()).run("g", run_id="s", metadata={"n": 1})
    async with store.journal() as journal:
        got = await loop(journal).run("g", run_id="s", metadata={"n": 1})
    assert (got.stop_reason, got.stop_detail, got.final_answer) == (
        ref.stop_reason, ref.stop_detail, ref.final_answer,
    )  # fmt: skip
    assert [comparable(s) for s in got.steps] == [comparable(s) for s in ref.steps]
    assert (got.steps_used, got.actions_executed) == (ref.steps_used, ref.actions_executed)
    assert len(got.messages) == len(ref.messages)
    async with store.journal() as journal:  # a new object: the ended run comes back as it ended
        model = FunctionModel(fn)
        again = await Loop(model, tools=make_tools(), journal=journal).resume("s")
        assert await journal.steps("s") == list(got.steps)
    assert model.requests == []
    assert again.steps == got.steps and again.stop_reason == got.stop_reason
    assert again.messages == got.messages
    row = store.sql("SELECT status, stop_reason, steps_used, actions_executed, owner FROM runs")
    assert row == [("ended", got.stop_reason.value, got.steps_used, got.actions_executed, None)]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_around_any_write_resumes_on_a_new_journal_object(
    after: bool, journal_backend: Store
) -> None:
    store = journal_backend
    ref_journal, ref = await make_reference()
    total = ref_journal.count
    never_intents = never_replay_intents(ref_journal)
    gate = asyncio.Semaphore(4)

    async def one(n: int, first: Any, restarted: Any) -> tuple[int, Any, tuple[Record, ...], World]:
        run_id = f"r{n}"  # the crash points are independent runs: they run side by side
        world = World()
        async with gate:
            with pytest.raises(Crash):
                await new_loop(world, recording(first, crash_at=n, crash_after=after)).run(
                    "pay", run_id=run_id
                )
            # The "restarted process": a journal object that never saw the run.
            r = await new_loop(world, restarted).resume(run_id)
            records = await records_of(restarted, run_id)
        return n, r, records, world

    async with store.journal() as first, store.journal() as restarted:
        outcomes = await asyncio.gather(*(one(n, first, restarted) for n in range(1, total + 1)))
    for n, r, records, world in outcomes:
        run_id = f"r{n}"
        assert sum(isinstance(x, RunEnd) for x in records) == 1, n
        assert isinstance(records[-1], RunEnd), n
        assert len(world.charged) <= 1, f"charged twice after a crash at write {n}"
        if len(world.stored) > 2:
            assert len(set(world.stored)) == 2, "an idempotent replay reuses its op_id"
        steps_rows = store.sql("SELECT step_idx FROM steps WHERE run_id = ? ORDER BY 1", run_id)
        assert steps_rows == [(s.step_idx,) for s in r.steps], n  # no step lost or doubled
        seqs = store.sql("SELECT seq FROM journal WHERE run_id = ? ORDER BY seq", run_id)
        assert seqs == [(i,) for i in range(1, len(records) + 1)], n
        if check_resumed(n, r, ref, never_intents.get(n if after else n - 1)):
            continue
        assert world.charged == ["5"], n
        assert len(r.messages) == len(ref.messages), n


async def test_detach_then_resume_on_another_journal_object(journal_backend: Store) -> None:
    store = journal_backend
    world = World()
    async with store.journal() as journal:
        holder: list[Loop] = []

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended) and event.step.step_idx == 1:
                holder[0].detach("r")

        loop = new_loop(world, journal, observers=[on_event])
        holder.append(loop)
        with pytest.raises(RunDetached):
            await loop.run("pay", run_id="r")
    assert store.sql("SELECT status, owner FROM runs") == [("running", None)]
    assert store.sql("SELECT count(*) FROM steps") == [(2,)]
    async with store.journal() as journal:
        r = await new_loop(world, journal).resume("r")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 6


async def test_cancelling_a_run_writes_the_cancelled_end_record(journal_backend: Store) -> None:
    store = journal_backend
    started = asyncio.Event()
    tools = ToolRegistry()

    @tools.tool
    async def wait_forever() -> str:
        """Blocks."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    model = FunctionModel(lambda r: call("wait_forever"))
    async with store.journal() as journal:
        task = asyncio.ensure_future(
            Loop(model, tools=tools, journal=journal, cancel_grace_s=0).run("g", run_id="c")
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    async with store.journal() as journal:
        r = await Loop(model, tools=tools, journal=journal).resume("c")
    assert r.stop_reason == StopReason.cancelled
    assert "outcome unknown" in (r.stop_detail or "")
    assert store.sql("SELECT stop_reason, owner FROM runs") == [("cancelled", None)]


async def test_a_nul_character_in_an_observation_and_the_answer_comes_back_exactly(
    journal_backend: Store,
) -> None:
    async with journal_backend.journal() as journal:
        got = await nul_loop(journal).run("g", run_id="r")
    async with journal_backend.journal() as journal:
        again = await nul_loop(journal).resume("r")
    assert got.steps[0].observation == "a\x00b" and got.final_answer == "fin\x00al"
    assert again.steps == got.steps and again.final_answer == got.final_answer


# -- the tables, read with plain SQL ----------------------------------------------------------


async def test_runs_table_counts_stop_reasons_with_plain_sql(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        for name in ("agent_finished", "step_budget", "env_error", "llm_error"):
            fn, limits = SCENARIOS[name]
            loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal, limits=limits,
                        clock=FakeClock())  # fmt: skip
            for i in range(2 if name == "env_error" else 1):
                await loop.run("g", run_id=f"{name}-{i}")
        listed = await journal.list_runs()
        ended = await journal.list_runs(status="ended")
        assert await journal.list_runs(status="running") == []
        one = await journal.list_runs(run_id="env_error-1")
        assert await journal.list_runs(run_id="no-such-run") == []
        assert await journal.list_runs(run_id="") == []  # an empty id is an id, not "any"
        assert await journal.list_runs(status="running", run_id="env_error-1") == []
        assert await journal.list_runs(status="ended", run_id="env_error-1") == one
    counts = dict(store.sql("SELECT stop_reason, count(*) FROM runs GROUP BY 1"))
    assert counts == {"agent_finished": 1, "step_budget": 1, "env_error": 2, "llm_error": 1}
    assert {d["run_id"] for d in listed} == {
        "agent_finished-0", "step_budget-0", "env_error-0", "env_error-1", "llm_error-0",
    }  # fmt: skip
    assert [d["run_id"] for d in listed] == [d["run_id"] for d in ended]
    assert one == [d for d in listed if d["run_id"] == "env_error-1"]
    budget = next(d for d in listed if d["run_id"] == "step_budget-0")
    assert budget["steps_used"] == 3 and budget["limits"]["max_steps"] == 3
    assert "history_json" not in budget and "version" not in budget


def _counting_loop(
    journal: Any, *, detach_at: int | None = None, probe: Callable[[], Any] | None = None
) -> tuple[Loop, list[Any]]:
    """A loop whose steps are noop (executed), nope (an unknown tool: not executed), noop, ...;
    it detaches the run after step ``detach_at``. The list gets ``probe()`` after every step
    (once the step's transaction has committed)."""
    seen: list[Any] = []
    holder: list[Loop] = []

    def on_event(event: object) -> None:
        if isinstance(event, StepAppended):
            if probe is not None:
                seen.append(probe())
            if event.step.step_idx == detach_at:
                holder[0].detach(event.run_id)

    model = FunctionModel(lambda r: call("nope") if r.step_idx == 1 else call("noop"))
    tools = make_tools()
    holder.append(
        Loop(model, tools=tools, journal=journal, observers=[on_event], limits=Limits(max_steps=5))
    )
    return holder[0], seen


def _counters(store: Store) -> Callable[[], Any]:
    return lambda: store.sql("SELECT steps_used, actions_executed, status FROM runs")[0]


async def test_the_runs_counters_are_current_after_every_step(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        loop, seen = _counting_loop(journal, detach_at=2, probe=_counters(store))
        with pytest.raises(RunDetached):
            await loop.run("g", run_id="r")
        listed = (await journal.list_runs(run_id="r"))[0]
    assert seen == [(1, 1, "running"), (2, 1, "running"), (3, 2, "running")]
    assert store.sql("SELECT steps_used, actions_executed, owner FROM runs") == [(3, 2, None)]
    assert (listed["steps_used"], listed["actions_executed"]) == (3, 2)
    assert (listed["status"], listed["state"]) == ("running", "detached")
    async with store.journal() as journal:
        loop, seen = _counting_loop(journal, probe=_counters(store))
        r = await loop.resume("r")
    assert seen == [(4, 3, "running"), (5, 4, "running")]
    assert r.stop_reason == StopReason.step_budget and (r.steps_used, r.actions_executed) == (5, 4)
    assert store.sql("SELECT steps_used, actions_executed, status FROM runs") == [(5, 4, "ended")]


async def test_counters_an_older_version_left_at_zero_are_counted_again_from_the_steps(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        loop, _ = _counting_loop(journal, detach_at=2)
        with pytest.raises(RunDetached):
            await loop.run("g", run_id="r")
    store.damage("UPDATE runs SET steps_used = 0, actions_executed = 0")  # as 1.0 left them
    async with store.journal() as journal:
        listed = (await journal.list_runs(run_id="r"))[0]
        assert (listed["steps_used"], listed["actions_executed"]) == (3, 2)
        loop, seen = _counting_loop(journal, probe=_counters(store))
        await loop.resume("r")  # taking the run over counts them again
    assert seen == [(4, 3, "running"), (5, 4, "running")]


async def test_the_memory_journal_lists_runs_with_live_counters_and_states() -> None:
    journal = MemoryJournal()
    loop, _ = _counting_loop(journal, detach_at=2)
    with pytest.raises(RunDetached):
        await loop.run("g", run_id="r", metadata={"k": 1})
    [row] = await journal.list_runs()
    assert (row["run_id"], row["status"], row["state"], row["owner"]) == (
        "r", "running", "detached", None,
    )  # fmt: skip
    assert (row["steps_used"], row["actions_executed"], row["stop_reason"]) == (3, 2, None)
    assert row["goal"] == "g" and row["metadata"] == {"k": 1} and row["limits"]["max_steps"] == 5
    assert await journal.list_runs(status="ended") == []
    await Loop(FunctionModel(lambda r: ModelReply("fin")), journal=journal).resume("r")
    [row] = await journal.list_runs(run_id="r", status="ended")
    assert (row["state"], row["stop_reason"], row["final_answer"]) == (
        "ended", "agent_finished", "fin",
    )  # fmt: skip
    assert (row["steps_used"], row["actions_executed"]) == (4, 2)
    assert await journal.list_runs(run_id="nope") == []


_STATE_SQL = re.search(r"(SELECT run_id,.*?FROM runs)", journal_state.__doc__ or "", re.S)


async def test_list_runs_derives_whether_a_run_is_running_detached_stale_or_ended(
    journal_backend: Store,
) -> None:
    store = journal_backend
    now = [1000.0]
    async with two_journals(store, now) as (journal, _):
        await journal.create(spec("expired"), ttl_s=10)
        now[0] += 11
        await journal.create(spec("running"), ttl_s=60)
        await journal.release(await journal.create(spec("detached"), ttl_s=60))
        ended = await journal.create(spec("ended"), ttl_s=60)
        await journal.append(ended, [RunEnd(StopReason.agent_finished, None, "fin", 0, 0, now[0])])
        await journal.create(spec("dead"), ttl_s=60)
        dead = f"{host_id()}/{no_such_pid()}/12345/feedface"  # this host, no such process
        store.sql("UPDATE runs SET owner = ? WHERE run_id = 'dead'", dead)
        await journal.create(spec("elsewhere"), ttl_s=60)
        other_host = f"elsewhere:1/{no_such_pid()}/12345/feedface"  # cannot be proved dead
        store.sql("UPDATE runs SET owner = ? WHERE run_id = 'elsewhere'", other_host)
        states = {d["run_id"]: d["state"] for d in await journal.list_runs()}
    assert states == {
        "expired": "stale",
        "running": "running",
        "detached": "detached",
        "ended": "ended",
        "dead": "stale",
        "elsewhere": "running",
    }
    # The SQL the documentation gives agrees, except on a dead owner (only Python can tell).
    assert _STATE_SQL is not None
    by_sql = dict(store.sql(_STATE_SQL.group(1).replace(":now", "?"), now[0]))
    assert by_sql == {**states, "dead": "running"}


async def test_steps_table_has_a_column_per_step_record_field(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        r = await new_loop(World(), journal).run("pay", run_id="r")
    rows = store.rows("SELECT * FROM steps WHERE run_id = ?", "r")
    assert list(rows[0]) == ["run_id", *(f.name for f in fields(StepRecord))]
    assert len(rows) == len(r.steps)
    for row, step in zip(sorted(rows, key=lambda x: x["step_idx"]), r.steps, strict=True):
        expected = step.to_dict()
        got = {k: row[k] for k in expected}
        for name in ("parse_ok", "observation_synthetic", "completed"):
            assert got[name] in (0, 1)
            got[name] = bool(got[name])
        assert got == expected


async def test_model_calls_accounts_mark_an_attempt_lost_in_a_crash_uncertain(
    journal_backend: Store,
) -> None:
    store = journal_backend
    world = World()
    async with store.journal() as journal:  # crash right after step 0's model intent
        with pytest.raises(Crash):
            await new_loop(world, recording(journal, crash_at=1, crash_after=True)).run(
                "pay", run_id="r"
            )
    assert store.sql("SELECT attempt, state FROM model_calls") == [(1, "pending")]
    async with store.journal() as journal:
        r = await new_loop(world, journal).resume("r")
    rows = store.sql(
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
    intents = store.sql("SELECT count(DISTINCT intent_id) FROM model_calls WHERE step_idx = 0")
    assert intents == [(1,)]  # the same intent id across the crash


async def test_model_calls_record_a_final_failure_and_usage(journal_backend: Store) -> None:
    def fn(req: ModelRequest) -> ModelReply:
        if req.step_idx == 1:
            raise ModelCallError("bad request", kind="bad_request")
        return ModelReply(tool_calls=call("noop").tool_calls, usage=Usage(12, 3), call_id="c-1")

    async with journal_backend.journal() as journal:
        r = await Loop(FunctionModel(fn), tools=make_tools(), journal=journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    rows = journal_backend.sql("SELECT step_idx, state, llm_call_id, input_tokens, "
                               "output_tokens FROM model_calls ORDER BY step_idx")  # fmt: skip
    assert rows == [(0, "ok", "c-1", 12, 3), (1, "failed", None, None, None)]


async def test_journal_seq_is_contiguous_and_kinds_match_bodies(journal_backend: Store) -> None:
    async with journal_backend.journal() as journal:
        loop = new_loop(World(), journal)
        await asyncio.gather(*(loop.run("pay", run_id=f"r{i}") for i in range(3)))
    for i in range(3):
        rows = journal_backend.sql(
            "SELECT seq, kind, body FROM journal WHERE run_id = ? ORDER BY seq", f"r{i}"
        )
        assert [row[0] for row in rows] == list(range(1, len(rows) + 1))
        assert all(json.loads(body)["kind"] == kind for _, kind, body in rows)
        assert rows[-1][1] == "end"


async def test_journal_bytes_per_step_do_not_grow_with_the_history(journal_backend: Store) -> None:
    """A long history is written with the run and, by a step, never again: the log a step
    writes is the same whether the run carries 400 kB of (incompressible) history or none. The
    one exception is SQLite's: it rewrites a row whose size changes, history included, and the
    step whose counters reach 2 (their integer needs a byte more) changes the runs row's size."""
    store = journal_backend

    async def growth_per_step(history_chars: int) -> list[int]:
        sizes: list[int] = []

        def on_event(event: object) -> None:
            if isinstance(event, StepAppended):
                sizes.append(store.wal_position())

        history = [{"role": "user", "content": secrets.token_hex(history_chars // 2)}]
        async with store.journal() as journal:
            loop = Loop(
                FunctionModel(lambda r: call("noop")), tools=make_tools(), journal=journal,
                limits=Limits(max_steps=12), observers=[on_event],
            )  # fmt: skip
            await loop.run("g", history=history)
        return [b - a for a, b in itertools.pairwise(sizes)]

    without = await growth_per_step(0)
    with_history = await growth_per_step(400_000)
    assert len(with_history) == 11
    assert min(without + with_history) > 0  # every step was measured (no log restarted)
    copies = [i for i, grown in enumerate(with_history) if grown >= 100_000]
    assert copies == list(store.history_copies)  # else a few kB per step, no history copy
    kept = [i for i in range(len(with_history)) if i not in copies]
    factor, noise = store.wal_noise
    assert sum(with_history[i] for i in kept) <= sum(without[i] for i in kept) * factor + noise


# -- leases -----------------------------------------------------------------------------------


async def test_a_second_acquire_of_a_live_run_is_run_leased_and_writes_nothing(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as one, store.journal() as two:
        lease = await one.create(spec(), ttl_s=60)
        with pytest.raises(RunExists):
            await two.create(spec(), ttl_s=60)
        before = store.dump()
        with pytest.raises(RunLeased) as info:
            await two.acquire("r", ttl_s=60)
        assert info.value.owner == lease.owner and lease.owner in str(info.value)
        assert info.value.expires_at == pytest.approx(lease.expires_at, abs=2)
        assert store.dump() == before
        with pytest.raises(RunLeased):
            await new_loop(World(), two).resume("r")
        assert store.dump() == before  # not even a fencing version moved
        assert store.sql("SELECT count(*) FROM journal") == [(0,)]


async def test_an_expired_lease_is_taken_over_and_renewal_moves_only_the_expiry(
    journal_backend: Store,
) -> None:
    store = journal_backend
    now = [1000.0]
    async with two_journals(store, now) as (one, two):
        old = await one.create(spec(), ttl_s=10)
        created = store.rows("SELECT * FROM runs")[0]
        now[0] += 9
        with pytest.raises(RunLeased):
            await two.acquire("r", ttl_s=10)
        old = await one.renew(old, ttl_s=10)  # the heartbeat
        renewed = store.rows("SELECT * FROM runs")[0]
        assert old.expires_at == 1019.0 and renewed["lease_expires_at"] == 1019.0
        assert {k for k in created if renewed[k] != created[k]} == {"lease_expires_at"}
        now[0] += 9.5
        with pytest.raises(RunLeased):
            await two.acquire("r", ttl_s=10)
        now[0] += 1
        new, got_spec, records = await two.acquire("r", ttl_s=10)
        assert new.owner != old.owner and records == ()
        assert got_spec == spec()  # history and metadata come back as stored
        claimed = store.rows("SELECT * FROM runs")[0]
        assert (claimed["owner"], claimed["lease_expires_at"]) == (new.owner, now[0] + 10)
        changed = {k for k in created if claimed[k] != renewed[k]}
        assert changed <= {"owner", "lease_expires_at", "version"}
        if "version" in created:  # PostgreSQL's fencing version: the claim moved it, once
            assert claimed["version"] == created["version"] + 1


async def test_a_dead_owners_lease_is_taken_over_at_once(journal_backend: Store) -> None:
    store = journal_backend
    child = run_child(
        "import asyncio, os, sys\n"
        "from polyloop import Limits\n"
        "from polyloop.types import RunSpec\n"
        "from tests.durability.crash_child import open_journal\n"
        "async def main():\n"
        "    j = open_journal(sys.argv[1])\n"
        "    lease = await j.create(RunSpec('r', 'g', Limits(), 0.0), ttl_s=3600)\n"
        "    print(lease.owner, flush=True)\n"
        "    os._exit(0)  # dies holding the lease\n"
        "asyncio.run(main())\n",
        store.where,
    )
    assert child.returncode == 0, child.stderr
    dead = child.stdout.strip()
    assert store.sql("SELECT owner FROM runs") == [(dead,)]
    async with store.journal() as journal:
        lease, _, _ = await journal.acquire("r", ttl_s=60)  # the lease had an hour to run
        assert lease.owner != dead
        forged = f"{host_id()}/{no_such_pid()}/12345/feedface"  # this host, no such process
        store.sql("UPDATE runs SET owner = ?, lease_expires_at = 1e12", forged)
        lease2, _, _ = await journal.acquire("r", ttl_s=60)
        assert lease2.owner not in (forged, lease.owner)
        other_host = f"elsewhere:1/{no_such_pid()}/12345/feedface"  # cannot be proved dead
        store.sql("UPDATE runs SET owner = ?, lease_expires_at = 1e12", other_host)
        with pytest.raises(RunLeased):
            await journal.acquire("r", ttl_s=60)


async def test_a_stale_owners_writes_after_a_takeover_are_refused(journal_backend: Store) -> None:
    store = journal_backend
    now = [1000.0]
    async with two_journals(store, now) as (stale, fresh):
        old = await stale.create(spec(), ttl_s=10)
        await stale.append(old, [ModelIntent(0, "i", 1)])  # warms any next-seq cache
        now[0] += 11
        new, _, records = await fresh.acquire("r", ttl_s=60)
        assert [r.kind for r in records] == ["model_intent"]
        await fresh.append(new, [ModelIntent(0, "i", 2)])
        before = store.dump()
        with pytest.raises(LeaseLost, match="no longer holds the lease"):
            await stale.append(old, [ModelIntent(0, "i", 3)])
        with pytest.raises(LeaseLost):
            await stale.renew(old, ttl_s=10)
        await stale.release(old)  # not ours any more: a no-op
        assert store.dump() == before
        assert store.sql("SELECT owner FROM runs") == [(new.owner,)]
        await fresh.append(new, [ModelIntent(0, "i", 3)])  # the new owner goes on
        assert store.sql("SELECT max(seq) FROM journal") == [(3,)]
        # The takeover's attempt found attempt 1 pending: it was lost with the old owner.
        states = store.sql("SELECT attempt, state FROM model_calls ORDER BY attempt")
        assert states == [(1, "uncertain"), (2, "uncertain"), (3, "pending")]


async def test_a_stale_worker_whose_action_outlived_its_lease_writes_nothing(
    journal_backend: Store,
) -> None:
    """Worker A's lease expires during a slow action; worker B takes the run over and ends
    it. A's next write is refused (LeaseLost): the run ends once, with B's trajectory."""
    store = journal_backend
    now = [1000.0]
    started, release = asyncio.Event(), asyncio.Event()
    ran: list[str] = []

    def tools() -> ToolRegistry:
        reg = ToolRegistry()

        @reg.tool(replay="idempotent")
        async def slow(ctx: ToolContext) -> str:
            """Slow the first time."""
            ran.append(ctx.op_id)
            if len(ran) == 1:
                started.set()
                await release.wait()
            return "done"

        return reg

    def script(r: ModelRequest) -> ModelReply:
        return call("slow") if r.step_idx == 0 else ModelReply("the end")

    async with two_journals(store, now) as (ja, jb):
        a = asyncio.ensure_future(
            Loop(FunctionModel(script), tools=tools(), journal=ja, lease_ttl_s=30).run(
                "g", run_id="r"
            )
        )
        await started.wait()
        now[0] += 100  # A's lease has expired (its heartbeat never ran: the clock jumped)
        b = await Loop(FunctionModel(script), tools=tools(), journal=jb).resume("r")
        before = store.dump()
        release.set()
        with pytest.raises(LeaseLost):
            await a
        assert store.dump() == before
    assert b.stop_reason == StopReason.agent_finished and b.final_answer == "the end"
    assert ran[0] == ran[1] and len(ran) == 2  # B re-ran the idempotent action, same op_id
    assert store.sql("SELECT count(*) FROM journal WHERE kind = 'end'") == [(1,)]
    assert store.sql("SELECT step_idx FROM steps ORDER BY 1") == [(0,), (1,)]


async def test_the_end_record_releases_the_lease_in_its_transaction(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        lease = await journal.create(spec(), ttl_s=60)
        end = RunEnd(StopReason.agent_finished, None, "done", 0, 0, 5.0)
        await journal.append(lease, [end])
        assert store.sql(
            "SELECT status, owner, lease_expires_at, final_answer, ended_at FROM runs"
        ) == [("ended", None, None, "done", 5.0)]
        with pytest.raises(LeaseLost):
            await journal.append(lease, [ModelIntent(0, "i", 1)])


async def test_many_executions_racing_to_claim_one_run_exactly_one_wins(
    journal_backend: Store,
) -> None:
    store = journal_backend
    now = [1000.0]
    async with store.journal(clock=lambda: now[0]) as journal:
        await journal.create(spec(), ttl_s=10)
    now[0] += 11  # expired: everyone may try
    before = store.rows("SELECT * FROM runs")[0]
    journals = [store.journal(clock=lambda: now[0]) for _ in range(8)]
    try:
        results = await asyncio.gather(
            *(j.acquire("r", ttl_s=60) for j in journals), return_exceptions=True
        )
    finally:
        for j in journals:
            await j.aclose()
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1, results
    assert all(isinstance(r, RunLeased) for r in results if isinstance(r, BaseException))
    after = store.rows("SELECT * FROM runs")[0]
    assert (after["owner"], after["lease_expires_at"]) == (winners[0][0].owner, 1071.0)
    assert {k for k in before if after[k] != before[k]} <= {"owner", "lease_expires_at", "version"}
    if "version" in before:  # PostgreSQL's fencing version: one claim moved it, once
        assert after["version"] == before["version"] + 1


async def test_the_lease_reported_is_never_later_than_the_stored_one(
    journal_backend: Store,
) -> None:
    async with journal_backend.journal() as journal:
        lease = await journal.create(spec(), ttl_s=30)
    stored = journal_backend.sql("SELECT lease_expires_at FROM runs")[0][0]
    assert lease.expires_at <= float(stored) + 0.05  # same machine: the clocks agree


# -- writes that land or fail alone -----------------------------------------------------------


async def test_200_concurrent_runs_all_complete(journal_backend: Store) -> None:
    store = journal_backend

    def fn(req: ModelRequest) -> ModelReply:
        return call("noop") if req.step_idx == 0 else ModelReply(f"answer {req.run_id}")

    expected = [
        "model_intent", "model_result", "action_intent", "action_result", "step",
        "model_intent", "model_result", "step", "end",
    ]  # fmt: skip
    async with store.journal() as journal:
        loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
        results = await asyncio.gather(*(loop.run("g", run_id=f"r{i:03}") for i in range(200)))
        for r in results:
            assert r.stop_reason == StopReason.agent_finished
            assert r.final_answer == f"answer {r.run_id}"
            assert [x.kind for x in await records_of(journal, r.run_id)] == expected
            assert [s.observation for s in await journal.steps(r.run_id)] == ["ok", None]
    by_run: dict[str, list[tuple[int, str]]] = {}
    for run_id, seq, kind in store.sql("SELECT run_id, seq, kind FROM journal ORDER BY 1, 2"):
        by_run.setdefault(run_id, []).append((seq, kind))
    assert sorted(by_run) == sorted(r.run_id for r in results)
    assert all(rows == list(enumerate(expected, start=1)) for rows in by_run.values())
    ended = store.sql("SELECT count(*), count(owner) FROM runs WHERE status = 'ended'")
    assert ended == [(200, 0)]
    assert store.sql("SELECT count(*) FROM steps") == [(400,)]


async def test_a_conflicting_append_fails_only_itself(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        leases = {k: await journal.create(spec(k), ttl_s=60) for k in "abcd"}
        step = StepRecord(0, "", 0, 0, None, False, None, None, False, 0, 0, None, 0.0)
        outcomes = await asyncio.gather(
            journal.append(leases["a"], [ModelIntent(0, "a", 1)]),
            journal.append(Lease("b", new_owner(), 0.0), [ModelIntent(0, "b", 1)]),
            journal.append(leases["c"], [StepWritten(step), StepWritten(step)]),  # PK conflict
            journal.append(leases["d"], [ModelIntent(0, "d", 1)]),
            return_exceptions=True,
        )
        await check_only_the_conflict_failed(store, journal, leases, step, outcomes)


async def test_a_cancelled_append_still_lands_before_cancelled_error(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        lease = await journal.create(spec(), ttl_s=60)
        with store.writes_blocked():
            task = asyncio.ensure_future(journal.append(lease, [ModelIntent(0, "i", 1)]))
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.sleep(0.05)
            task.cancel()  # twice: it still waits for its write
            await asyncio.sleep(0.05)
            assert not task.done()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.kind for r in await records_of(journal, "r")] == ["model_intent"]
        await journal.append(lease, [ModelIntent(0, "i", 2)])  # and the lease still writes


async def test_a_cancelled_create_gives_its_lease_back(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        with store.writes_blocked():
            task = asyncio.ensure_future(journal.create(spec(), ttl_s=60))
            await asyncio.sleep(0.1)
            task.cancel()
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.CancelledError):
            await task
        assert store.sql("SELECT owner FROM runs") == [(None,)]
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
    kind: str, tool: str | None, after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    """tests/durability/crash_child.py, run as a program, SIGKILLs itself around a write."""
    store = journal_backend
    ref_journal, ref = await make_reference()
    n = first_write(ref_journal, kind, tool)
    effects = tmp_path / "effects.txt"
    effects.touch()
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.durability.crash_child", store.where, str(n),
        "after" if after else "before", str(effects), cwd=REPO, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, err.decode()
    assert store.sql("SELECT owner FROM runs")[0][0] is not None  # it died holding the lease
    world = World()
    async with store.journal() as journal:
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
        states = store.sql("SELECT attempt, state FROM model_calls WHERE step_idx = 0")
        assert sorted(states) == [(1, "uncertain"), (2, "ok")]


_RESUME_CHILD = """
import asyncio, json, os, sys, time
from polyloop import Loop, RunLeased
from polyloop.testing import FakeClock, FunctionModel
from tests.contract.test_resume import World, script
from tests.durability.crash_child import opened_journal

where, go = sys.argv[1], sys.argv[2]

async def slow(request):
    await asyncio.sleep(0.05)
    return script(request)

async def main():
    journal = await opened_journal(where)
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


async def test_two_processes_resuming_one_run_advance_it_exactly_once(
    journal_backend: Store, tmp_path: Path
) -> None:
    store = journal_backend
    go = tmp_path / "go"
    async with store.journal() as journal:  # a run interrupted after its first step
        with pytest.raises(Crash):
            await new_loop(World(), recording(journal, crash_at=4, crash_after=True)).run(
                "pay", run_id="r"
            )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO / "src"), str(REPO)))}
    pipe = asyncio.subprocess.PIPE
    argv = [sys.executable, "-c", _RESUME_CHILD, store.where, str(go)]
    children = [
        await asyncio.create_subprocess_exec(*argv, stdout=pipe, stderr=pipe, cwd=REPO, env=env)
        for _ in range(2)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert (await asyncio.wait_for(child.stdout.readline(), 60)).strip() == b"ready"
        go.touch()
        outs = [await asyncio.wait_for(child.communicate(), 60) for child in children]
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    reports = [json.loads(out.decode().strip().splitlines()[-1]) for out, _ in outs]
    advanced = [x for x in reports if x["calls"] > 0]
    assert len(advanced) == 1, reports
    assert advanced[0]["outcome"] == "task_completed"
    other = next(x for x in reports if x["calls"] == 0)
    assert other["outcome"] in ("leased", "task_completed")  # refused, or read the ended run
    assert store.sql("SELECT step_idx FROM steps ORDER BY 1") == [(i,) for i in range(6)]
    assert store.sql("SELECT count(*) FROM journal WHERE kind = 'end'") == [(1,)]
    seqs = store.sql("SELECT seq FROM journal ORDER BY seq")
    assert seqs == [(i,) for i in range(1, len(seqs) + 1)]


# -- what it refuses to read, and leaves as it was --------------------------------------------


async def test_resume_of_an_unknown_run_is_run_not_found(journal_backend: Store) -> None:
    async with journal_backend.journal() as journal:
        with pytest.raises(RunNotFound, match="ghost"):
            await new_loop(World(), journal).resume("ghost")
        with pytest.raises(RunNotFound):
            await journal.acquire("ghost", ttl_s=1)
        with pytest.raises(RunNotFound):
            await journal.steps("ghost")
        with pytest.raises(RunNotFound):
            await journal.append(Lease("ghost", "x", 0.0), [ModelIntent(0, "i", 1)])
        with pytest.raises(RunNotFound):
            await journal.renew(Lease("ghost", "x", 0.0), ttl_s=1)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("DELETE FROM journal WHERE seq = 5", "out of order"),
        ("UPDATE journal SET seq = seq + 100 WHERE seq = 3", "out of order"),
        ("UPDATE journal SET body = substr(body, 1, 20) WHERE seq = 4", "not valid JSON"),
        ("UPDATE journal SET kind = 'step' WHERE seq = 2", "does not match its kind"),
        ('UPDATE journal SET body = \'{"kind": "model_intent"}\' WHERE seq = 1', "malformed"),
        ("UPDATE runs SET limits_json = '['", "runs row is damaged"),
    ],
    ids=["gap", "reordered", "truncated", "kind", "malformed", "runs-row"],
)
async def test_damaged_records_fail_clearly_and_nothing_is_modified(
    damage: str, message: str, journal_backend: Store
) -> None:
    store = journal_backend
    before = await damaged_run(store, damage)
    world = World()
    async with store.journal() as journal:
        with pytest.raises(JournalError, match=message):
            await new_loop(world, journal).resume("r")
        with pytest.raises(JournalError, match=message):
            await journal.read("r")
    assert store.snapshot() == before
    assert world.charged == world.stored == []


async def test_a_stored_history_that_makes_no_context_is_refused_before_the_lease(
    journal_backend: Store,
) -> None:
    """The journal reads it (a list), the context builder cannot use it: resume fails with a
    JournalError before it takes the lease, so the row (a dead owner's lease included) stays
    as it was."""
    store = journal_backend
    before = await damaged_run(store, "UPDATE runs SET history_json = '[1]'")
    world = World()
    async with store.journal() as journal:
        with pytest.raises(JournalError, match="no context can be built from its stored goal"):
            await new_loop(world, journal).resume("r")
    assert store.snapshot() == before
    assert world.charged == world.stored == []


async def test_records_that_contradict_each_other_fail_and_stay_as_they_were(
    journal_backend: Store,
) -> None:
    store = journal_backend
    await crashed_run(store)
    # Drop a step record and close the gap: every record reads, their order is wrong.
    seq = store.sql("SELECT min(seq) FROM journal WHERE kind = 'step'")[0][0]
    store.damage(f"DELETE FROM journal WHERE seq = {seq}",
                 f"UPDATE journal SET seq = seq - 1 WHERE seq > {seq}")  # fmt: skip
    before = store.snapshot()
    async with store.journal() as journal:
        with pytest.raises(JournalError, match="out of order"):
            await new_loop(World(), journal).resume("r")
    assert store.snapshot() == before
    assert store.sql("SELECT owner FROM runs") == [(None,)]  # no lease is left behind


async def test_a_store_holding_another_applications_tables_is_refused_untouched(
    journal_backend: Store,
) -> None:
    store = journal_backend
    store.damage(
        "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)",
        "CREATE TABLE runs (id INTEGER)",  # a name clash, to be sure nothing is mixed in
        "INSERT INTO invoices VALUES (1, 9.5)",
    )
    before = store.snapshot()
    with pytest.raises(JournalError, match="not a PolyLoop journal") as info:
        await store.open()
    assert "invoices" in str(info.value) and store.refusal_hint in str(info.value)
    assert store.snapshot() == before


@pytest.mark.parametrize(
    ("key", "version"), [("journal_schema_version", "3.0"), ("step_schema_version", "3.1")]
)
async def test_an_unknown_major_version_is_refused_naming_both_versions(
    key: str, version: str, journal_backend: Store
) -> None:
    store = journal_backend
    before = await damaged_run(store, f"UPDATE meta SET value = '{version}' WHERE key = '{key}'")
    with pytest.raises(JournalError) as info:
        await store.open()
    ours = "2.1" if key == "journal_schema_version" else "1.0"  # this PolyLoop's version
    assert repr(version) in str(info.value) and ours in str(info.value)
    assert "upgrade polyloop" in str(info.value)
    assert store.snapshot() == before


async def test_a_run_of_an_unknown_major_version_is_refused(journal_backend: Store) -> None:
    store = journal_backend
    before = await damaged_run(store, "UPDATE runs SET journal_schema_version = '9.0'")
    async with store.journal() as journal:
        with pytest.raises(JournalError, match=r"'9\.0'.*2\.1"):
            await new_loop(World(), journal).resume("r")
    assert store.snapshot() == before


async def test_a_newer_minor_version_opens_and_resumes(journal_backend: Store) -> None:
    store = journal_backend
    await damaged_run(
        store,
        "UPDATE meta SET value = '2.7' WHERE key = 'journal_schema_version'",
        "UPDATE runs SET journal_schema_version = '2.7'",
        "ALTER TABLE steps ADD COLUMN something_new TEXT",  # a minor may add columns
    )
    async with store.journal() as journal:
        r = await new_loop(World(), journal).resume("r")
    assert r.stop_reason == StopReason.task_completed
    meta = store.sql("SELECT value FROM meta WHERE key = 'journal_schema_version'")
    assert meta == [("2.7",)]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("DROP TABLE model_calls", r"lacks the tables \['model_calls'\]"),
        ("DELETE FROM meta WHERE key = 'journal_schema_version'", "without journal_schema_ver"),
        ("ALTER TABLE model_calls DROP COLUMN error", r"model_calls lacks the columns \['error'\]"),
    ],
    ids=["table", "meta", "column"],
)
async def test_a_damaged_schema_is_refused_untouched(
    damage: str, message: str, journal_backend: Store
) -> None:
    await damaged_run(journal_backend, damage)
    await refused_untouched(journal_backend, message)


async def test_a_meta_table_that_is_not_polyloops_is_refused_untouched(
    journal_backend: Store,
) -> None:
    journal_backend.damage("CREATE TABLE meta (name TEXT)", "INSERT INTO meta VALUES ('x')")
    await refused_untouched(journal_backend, "not PolyLoop's")


async def refused_untouched(store: Store, message: str) -> None:
    """Opening ``store`` fails with ``message`` and changes nothing in it."""
    before = store.snapshot()
    with pytest.raises(JournalError, match=message):
        await store.open()
    assert store.snapshot() == before


async def test_a_new_store_gets_the_tables_and_journals_opening_it_at_once_agree(
    journal_backend: Store,
) -> None:
    store = journal_backend
    journals = await asyncio.gather(*(store.open() for _ in range(4)))
    try:
        meta = dict(store.sql("SELECT key, value FROM meta"))
        for i, journal in enumerate(journals):  # each of them writes to the one store
            await journal.create(spec(f"r{i}"), ttl_s=1)
    finally:
        for journal in journals:
            await journal.aclose()
    assert meta == {"journal_schema_version": "2.1", "step_schema_version": "1.0"}
    assert store.sql("SELECT count(*) FROM runs") == [(4,)]


async def test_metadata_that_is_not_json_is_refused_before_anything_is_written(
    journal_backend: Store,
) -> None:
    async with journal_backend.journal() as journal:
        with pytest.raises(TypeError, match="JSON-ready"):
            await journal.create(
                RunSpec("r", "g", Limits(), 0.0, metadata={"x": object()}), ttl_s=1
            )
    assert journal_backend.sql("SELECT count(*) FROM runs") == [(0,)]


# -- lifecycle --------------------------------------------------------------------------------


async def test_a_closed_journal_fails_clearly(journal_backend: Store) -> None:
    journal = journal_backend.journal()
    lease = await journal.create(spec(), ttl_s=60)
    await journal.aclose()
    await journal.aclose()  # idempotent
    with pytest.raises(JournalError, match="closed"):
        await journal.append(lease, [ModelIntent(0, "i", 1)])
    with pytest.raises(JournalError, match="closed"):
        await journal.read("r")
