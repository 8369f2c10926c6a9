"""Retuning the budgets of a run that another process drives (``Loop.set_limits``,
``polyloop limits``), on SQLite and PostgreSQL, with real processes: the owner is a child
process advancing the run, the request comes from this one. The owner learns of a request at
its next heartbeat (its lease renewal returns it: ``HEARTBEAT_TTL_S``) and applies it at its
next step boundary, before rule A.

A model call in the owner is held until this process has seen the owner renew its lease after
the request was stored (``runs.lease_expires_at`` moved), so the request is known to the owner
while the call is in flight: nothing here depends on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import ConfigError, Limits, Loop, ModelReply, StopReason, ToolRegistry
from polyloop.testing import FunctionModel
from polyloop.types import LimitsChanged, ModelRequest, RunSpec, Usage
from tests.conftest import call
from tests.durability.journals import REPO, Store, records_of
from tests.durability.test_stop_requests_processes import Owner, requester, spawn_owner

HEARTBEAT_TTL_S = 0.6  # the owners renew (and so look for requests) every 0.2 s


def owner_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def tick() -> str:
        """A short step."""
        return "ticked"

    return tools


def held_model(marker: str, hold_at: int) -> FunctionModel:
    """Replies ``tick`` (10 input + 5 output tokens); the call of step ``hold_at`` says
    ``calling`` on stdout and waits until the file ``marker`` exists."""

    async def fn(request: ModelRequest) -> ModelReply:
        if request.step_idx == hold_at:
            print("calling", flush=True)
            while True:
                if await asyncio.to_thread(os.path.exists, marker):
                    break
                await asyncio.sleep(0.01)
        return ModelReply(tool_calls=call("tick").tool_calls, usage=Usage(10, 5))

    return FunctionModel(fn)


_OWNER = """
import asyncio, json, sys
from polyloop import Limits, Loop
from tests.durability.crash_child import opened_journal
from tests.durability.test_limits_requests_processes import held_model, owner_tools

async def main(where, run_id, max_steps, marker, hold_at, ttl, resume):
    journal = await opened_journal(where)
    loop = Loop(held_model(marker, int(hold_at)), tools=owner_tools(), journal=journal,
                limits=Limits(max_steps=int(max_steps)), lease_ttl_s=float(ttl))
    print("ready", flush=True)
    if resume == "resume":
        r = await loop.resume(run_id)
    else:
        r = await loop.run("g", run_id=run_id)
    print(json.dumps({"stop_reason": r.stop_reason, "steps": r.steps_used}), flush=True)
    await journal.aclose()

asyncio.run(main(*sys.argv[1:]))
"""


@contextlib.asynccontextmanager
async def owner(
    store: Store,
    run_id: str,
    marker: Path,
    *,
    max_steps: int = 100,
    hold_at: int = 0,
    resume: bool = False,
) -> AsyncIterator[Owner]:
    argv = [store.where, run_id, str(max_steps), str(marker), str(hold_at),
            str(HEARTBEAT_TTL_S), "resume" if resume else "run"]  # fmt: skip
    async with spawn_owner(_OWNER, argv) as child:
        yield child


async def renewed_since(store: Store, run_id: str) -> None:
    """Until the run's owner has renewed its lease twice since now (polled)."""
    (first,) = store.sql("SELECT lease_expires_at FROM runs WHERE run_id = ?", run_id)[0]
    seen = {first}
    while len(seen) < 3:
        await asyncio.sleep(0.02)
        seen.add(store.sql("SELECT lease_expires_at FROM runs WHERE run_id = ?", run_id)[0][0])


def request_rows(store: Store) -> list[dict[str, Any]]:
    return store.rows(
        "SELECT run_id, seq, kind, values_json, requested_by, reason, applied_at, outcome "
        "FROM requests ORDER BY run_id, seq"
    )


@pytest.mark.parametrize(
    ("budget", "stop_reason"),
    [("max_steps", StopReason.step_budget), ("max_tokens", StopReason.token_budget)],
)
async def test_a_budget_lowered_during_a_model_call_elsewhere_ends_the_run_at_the_next_boundary(
    journal_backend: Store, tmp_path: Path, budget: str, stop_reason: StopReason
) -> None:
    store, marker = journal_backend, tmp_path / "go"
    async with store.journal() as journal, owner(store, "r", marker) as child:
        assert await child.line() == "calling"  # step 0's model call is in flight
        asked = await requester(journal).set_limits(
            "r", by="the test", reason="too slow", **{budget: 1}
        )
        assert (asked.seq, asked.applied_at, asked.outcome) == (1, None, None)  # the owner's
        await renewed_since(store, "r")
        marker.touch()
        done = await child.result()
        records = await records_of(journal, "r")
    assert (done["stop_reason"], done["steps"]) == (stop_reason, 1)
    changed = [r for r in records if isinstance(r, LimitsChanged)]
    assert [getattr(c.limits, budget) for c in changed] == [1]
    (row,) = request_rows(store)
    assert row["kind"] == "limits" and row["outcome"] == "applied"
    assert row["applied_at"] is not None
    assert (row["requested_by"], row["reason"]) == ("the test", "too slow")
    old = 100 if budget == "max_steps" else None
    assert json.loads(row["values_json"]) == {budget: {"old": old, "new": 1}}


async def test_a_budget_raised_during_a_model_call_elsewhere_lets_the_run_go_past_the_old_one(
    journal_backend: Store, tmp_path: Path
) -> None:
    store, marker = journal_backend, tmp_path / "go"
    async with store.journal() as journal, owner(store, "r", marker, max_steps=2) as child:
        assert await child.line() == "calling"
        await requester(journal).set_limits("r", reason="needs room", max_steps=5)
        await renewed_since(store, "r")
        marker.touch()
        done = await child.result()
    assert (done["stop_reason"], done["steps"]) == (StopReason.step_budget, 5)
    assert [r["outcome"] for r in request_rows(store)] == ["applied"]


async def test_limits_set_on_a_run_nobody_drives_apply_now_and_resume_uses_them(
    journal_backend: Store, tmp_path: Path
) -> None:
    store, marker = journal_backend, tmp_path / "go"
    marker.touch()
    async with store.journal() as journal:
        lease = await journal.create(RunSpec("r", "g", Limits(max_steps=2), 0.0), ttl_s=30)
        await journal.release(lease)  # created, never driven: nobody holds it
        asked = await requester(journal).set_limits("r", reason="more", max_steps=3)
        assert asked.outcome == "applied" and asked.applied_at is not None
        limits = [r.limits for r in await records_of(journal, "r") if isinstance(r, LimitsChanged)]
        assert [lim.max_steps for lim in limits] == [3]
    async with owner(store, "r", marker, max_steps=50, resume=True) as child:
        done = await child.result()  # another process resumes it
    assert (done["stop_reason"], done["steps"]) == (StopReason.step_budget, 3)


async def test_a_request_whose_owner_was_killed_before_applying_it_is_applied_at_resume(
    journal_backend: Store, tmp_path: Path
) -> None:
    """The owner takes the request with its lease and is killed (SIGKILL) during the model
    call, before the step boundary that would apply it: it stays durable and pending, and is
    applied by whoever drives the run next (here, the requester right away: the dead owner's
    lease is taken over on the same host)."""
    store, marker = journal_backend, tmp_path / "go"
    async with store.journal() as journal:
        async with owner(store, "r", marker) as child:
            assert await child.line() == "calling"
            asked = await requester(journal).set_limits("r", reason="r", max_steps=2)
            assert asked.outcome is None
            await renewed_since(store, "r")
            child.proc.send_signal(signal.SIGKILL)
            await child.proc.wait()
        assert [r["applied_at"] for r in request_rows(store)] == [None]
        marker.touch()
        result = await Loop(held_model(str(marker), -1), tools=owner_tools(),
                            journal=journal).resume("r")  # fmt: skip
    assert (result.stop_reason, result.steps_used) == (StopReason.step_budget, 2)
    assert [r["outcome"] for r in request_rows(store)] == ["applied"]


async def test_values_that_cannot_hold_are_refused_and_nothing_is_written(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        lease = await journal.create(RunSpec("r", "g", Limits(max_steps=2), 0.0), ttl_s=30)
        await journal.release(lease)
        loop = requester(journal)
        for bad in (
            {"max_steps": 0},
            {"max_steps": None},
            {"max_tokens": -5},
            {"max_cost": float("nan")},
            {"max_seconds": float("inf")},
            {"max_prompt_chars": 10},
            {},
        ):
            with pytest.raises(ConfigError) as caught:
                await loop.set_limits("r", reason="bad", **bad)
            assert "\n" not in str(caught.value)
        with pytest.raises(ConfigError, match="reason"):
            await loop.set_limits("r", reason=" ", max_steps=3)
    assert request_rows(store) == []


def readme_query(postgres: bool) -> str:
    """The README's query "which runs had their budget raised, by whom" (on PostgreSQL with
    the replacements its comment names)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("budget raised, and by whom:\n\n```sql\n", 1)[1].split("```", 1)[0]
    query = "\n".join(line for line in block.splitlines() if not line.startswith("--"))
    if postgres:
        query = query.replace("json_each(r.values_json)", "jsonb_each(r.values_json::jsonb)")
        for key in ("old", "new"):
            query = query.replace(
                f"json_extract(b.value, '$.{key}')", f"(b.value ->> '{key}')::float"
            )
    return query.rstrip().rstrip(";")


async def test_the_readme_query_finds_the_runs_whose_budget_was_raised_and_by_whom(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        for run_id in ("up", "down", "unbounded", "from_none"):
            lease = await journal.create(RunSpec(run_id, "g", Limits(max_steps=10), 0.0), ttl_s=30)
            await journal.release(lease)
        loop = requester(journal)
        await loop.set_limits("up", by="alice", reason="more", max_steps=20)
        await loop.set_limits("down", by="bob", reason="less", max_steps=5)
        await loop.set_limits("unbounded", by="carol", reason="any", max_steps=11, max_tokens=9)
        await loop.set_limits("from_none", by="dave", reason="cap", max_tokens=100)
    postgres = type(journal).__name__ == "PostgresJournal"
    found = store.rows(readme_query(postgres))
    assert [(r["run_id"], r["requested_by"], r["budget"]) for r in found] == [
        ("up", "alice", "max_steps"),
        ("unbounded", "carol", "max_steps"),
    ]
    assert [(float(r["old"]), float(r["new"])) for r in found] == [(10, 20), (10, 11)]


async def test_a_2_0_journal_gains_the_requests_table_when_a_writer_opens_it(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        lease = await journal.create(RunSpec("r", "g", Limits(max_steps=2), 0.0), ttl_s=30)
        await journal.release(lease)
    store.damage(  # as a journal of schema 2.0 was: no requests table
        "DROP TABLE requests",
        "UPDATE meta SET value = '2.0' WHERE key = 'journal_schema_version'",
    )
    async with store.journal() as journal:  # a writer opens it: migrated
        asked = await requester(journal).set_limits("r", reason="after migration", max_steps=4)
        assert asked.outcome == "applied"
        assert [r["seq"] for r in await journal.requests("r")] == [1]
    assert store.sql("SELECT value FROM meta WHERE key = 'journal_schema_version'") == [("2.1",)]


async def test_limits_set_on_a_parked_run_apply_now_and_its_resume_after_approval_uses_them(
    journal_backend: Store,
) -> None:
    """A run parked for approval (``awaiting_approval``, no owner) gets the new limits at once;
    it stays parked, its pending action listed, and once approved its resume runs the action
    and stops at the new budget."""
    from tests.contract.test_approval import Mailer, loop_of, park

    store, world = journal_backend, Mailer()
    async with store.journal() as journal:
        parked = await park(world, journal)
        asked = await requester(journal).set_limits("r", by="ops", reason="one", max_steps=1)
        assert asked.outcome == "applied"
        assert store.sql("SELECT status FROM runs") == [("awaiting_approval",)]
        assert [p["op_id"] for p in await journal.pending_approvals()] == [parked.op_id]
        await loop_of(world, journal).approve("r", parked.op_id, by="alice")
        result = await loop_of(world, journal).resume("r")
    assert world.sent == [("ceo@example.com", "alice")]
    assert (result.stop_reason, result.steps_used) == (StopReason.step_budget, 1)
