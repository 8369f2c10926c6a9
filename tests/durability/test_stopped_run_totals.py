"""A run ended by ``stop``/``cancel`` while nobody advanced it (detached, crashed, never
started) gets its totals from its attempts, on every journal (memory, SQLite, PostgreSQL): the
end record's ``RunTotals``, the ``runs`` row's totals columns, ``list_runs`` and
``step_usage`` all say what the model calls reported."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from polyloop import ModelReply, RunDetached, StopReason, ToolCall, Usage
from polyloop.types import ModelRequest, RunEnd, RunSpec
from tests.durability.journals import records_of
from tests.durability.test_stop_requests import LONG, Gate, Journals, loop_on

USAGES = [Usage(100 + i, 10 + i, cached_tokens=5 * i, reasoning_tokens=i) for i in range(50)]


def reply(r: ModelRequest) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall("tick", {}),), usage=USAGES[r.step_idx])


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def journals(request: pytest.FixtureRequest, tmp_path: Any) -> Journals:
    return Journals(request.param, request, tmp_path)


async def test_a_detached_run_stopped_has_the_totals_of_its_attempts(
    journals: Journals,
) -> None:
    gate = Gate(enough=3)
    async with journals.open() as journal:
        loop = loop_on(journal, gate, reply)
        task = asyncio.ensure_future(loop.run("g", run_id="d"))
        await gate.ticked.wait()
        loop.detach("d")
        with pytest.raises(RunDetached):
            await task
        answer = await loop.stop("d", "enough")
        assert answer.happened == "ended"
        records = await records_of(journal, "d")
        end = records[-1]
        assert isinstance(end, RunEnd)
        steps = end.steps_used
        used = USAGES[:steps]
        tokens = sum(u.input_tokens + u.output_tokens for u in used)  # type: ignore[operator]
        assert end.totals is not None
        assert (end.totals.tokens, end.totals.usage_missing) == (tokens, 0)
        assert end.totals.active_s > 0
        row = (await journal.list_runs(run_id="d"))[0]
        assert row["stop_reason"] == "stopped"
        assert (row["tokens_used"], row["usage_missing"]) == (tokens, 0)
        assert row["active_seconds"] == end.totals.active_s
        assert row["input_tokens"] == sum(u.input_tokens for u in used)  # type: ignore[misc]
        assert row["output_tokens"] == sum(u.output_tokens for u in used)  # type: ignore[misc]
        assert row["cached_tokens"] == sum(u.cached_tokens for u in used)  # type: ignore[misc]
        assert row["reasoning_tokens"] == sum(u.reasoning_tokens for u in used)  # type: ignore[misc]
        per_step = await journal.step_usage("d")
        assert sorted(per_step) == list(range(steps))
        for i, u in enumerate(used):
            assert per_step[i] == {
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "cached_tokens": u.cached_tokens,
                "reasoning_tokens": u.reasoning_tokens,
                "cost_usd": None,
            }
    if journals.store is not None:  # the runs row itself, read with plain SQL
        stored = journals.store.sql(
            "SELECT tokens_used, active_seconds, usage_missing FROM runs WHERE run_id = 'd'"
        )
        assert stored == [(tokens, end.totals.active_s, 0)]


async def test_a_run_cancelled_before_it_started_has_zero_totals(journals: Journals) -> None:
    async with journals.open() as journal:
        lease = await journal.create(RunSpec("q", "queued", LONG, 0.0), ttl_s=30)
        await journal.release(lease)
        loop = loop_on(journal, Gate(), reply)
        answer = await loop.cancel("q", reason="withdrawn")
        assert answer.stop_reason == StopReason.cancelled
        row = (await journal.list_runs(run_id="q"))[0]
        assert (row["tokens_used"], row["cost_usd"], row["active_seconds"]) == (0, 0.0, 0.0)
        assert row["input_tokens"] is None
        assert await journal.step_usage("q") == {}
