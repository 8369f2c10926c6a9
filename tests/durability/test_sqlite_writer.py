"""The SQLite writer's fence from memory (no fence query while nothing else wrote) stays a
fence: a takeover through the same journal object, or an end, or another connection's commit,
makes the next stale write fail with nothing written. Each with the writer thread and with the
writer process (``writer="process"``), whose connection is not the one taking over."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from polyloop import LeaseLost
from polyloop.journal import SQLiteJournal
from polyloop.types import Limits, ModelIntent, RunEnd, RunSpec, StopReason


def _spec(run_id: str = "r") -> RunSpec:
    return RunSpec(run_id, "g", Limits(), 0.0, ({"role": "user", "content": "hi"},), None)


@pytest.fixture(params=["thread", "process"])
def writer(request: pytest.FixtureRequest) -> Any:
    return request.param


def _rows(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT run_id, seq, kind FROM journal ORDER BY run_id, seq").fetchall()


async def test_a_takeover_through_the_same_journal_object_fences_the_old_owner(
    tmp_path: Path,
    writer: Any,
) -> None:
    now = [1000.0]
    path = tmp_path / "j.db"
    async with SQLiteJournal(path, clock=lambda: now[0], writer=writer) as journal:
        old = await journal.create(_spec(), ttl_s=10)
        await journal.append(old, [ModelIntent(0, "i", 1)])  # the old owner's fence is cached
        now[0] += 11
        new, _, _ = await journal.acquire("r", ttl_s=60)  # same object, same connection
        before = _rows(path)
        with pytest.raises(LeaseLost, match="no longer holds the lease"):
            await journal.append(old, [ModelIntent(0, "i", 2)])
        assert _rows(path) == before
        await journal.append(new, [ModelIntent(0, "i", 2)])
        assert [seq for _, seq, _ in _rows(path)] == [1, 2]


async def test_after_the_end_record_the_owner_cannot_append_again(
    tmp_path: Path, writer: Any
) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path, writer=writer) as journal:
        lease = await journal.create(_spec(), ttl_s=60)
        await journal.append(lease, [ModelIntent(0, "i", 1)])
        end = RunEnd(StopReason.cancelled, None, None, 0, 0, 1.0)
        await journal.append(lease, [end])
        with pytest.raises(LeaseLost):
            await journal.append(lease, [ModelIntent(1, "j", 1)])
        assert [kind for _, _, kind in _rows(path)] == ["model_intent", "end"]


async def test_a_plain_sql_change_of_owner_from_another_connection_is_seen(
    tmp_path: Path,
    writer: Any,
) -> None:
    """Even a write that is not PolyLoop's (an operator's UPDATE) drops the cached fence."""
    path = tmp_path / "j.db"
    async with SQLiteJournal(path, writer=writer) as journal:
        lease = await journal.create(_spec(), ttl_s=60)
        await journal.append(lease, [ModelIntent(0, "i", 1)])
        with sqlite3.connect(path) as other:
            other.execute("UPDATE runs SET owner = 'someone-else' WHERE run_id = 'r'")
        with pytest.raises(LeaseLost, match="someone-else"):
            await journal.append(lease, [ModelIntent(0, "i", 2)])
        assert len(_rows(path)) == 1


async def test_runs_appending_together_keep_their_own_sequences(
    tmp_path: Path, writer: Any
) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path, writer=writer) as journal:
        leases = [await journal.create(_spec(f"r{i}"), ttl_s=60) for i in range(5)]
        for attempt in range(1, 4):  # each round queued together: shares transactions
            await asyncio.gather(
                *(journal.append(x, [ModelIntent(0, x.run_id, attempt)]) for x in leases)
            )
    rows = _rows(path)
    assert rows == [(f"r{i}", seq, "model_intent") for i in range(5) for seq in (1, 2, 3)]
