"""The records the budgets, the fallback and the wrap-up add (a priced model result, the active
seconds of a step, the totals of the end record, a fallback, a wrap-up intent and step), through
the durable journals: a run dies around every one of its writes and is resumed from SQLite or
PostgreSQL into the same end, the totals in ``runs`` and the costs in ``model_calls`` agreeing
with the result."""

from __future__ import annotations

import pytest

from polyloop import StopReason
from tests.conftest import Crash, RecordingJournal
from tests.contract.test_wrap_up import spending_loop
from tests.durability.journals import Store, recording


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_spending_run_dies_around_every_write_and_resumes_from_the_store(
    after: bool, journal_backend: Store
) -> None:
    store = journal_backend
    ref_journal = RecordingJournal()
    ref = await spending_loop(ref_journal).run("go", run_id="ref")
    assert ref.stop_reason == StopReason.token_budget and ref.steps[-1].wrap_up
    async with store.journal() as journal:
        for n in range(1, ref_journal.count + 1):
            run_id = f"r{n}"
            with pytest.raises(Crash):
                await spending_loop(recording(journal, crash_at=n, crash_after=after)).run(
                    "go", run_id=run_id
                )
            r = await spending_loop(journal).resume(run_id)
            assert (r.stop_reason, r.final_answer) == (ref.stop_reason, ref.final_answer), n
            assert [(s.model, s.wrap_up) for s in r.steps] == [
                (s.model, s.wrap_up) for s in ref.steps
            ], n
            assert await journal.steps(run_id) == list(r.steps), n
            (row,) = store.rows(
                "SELECT tokens_used, cost_usd, usage_missing FROM runs WHERE run_id = ?", run_id
            )
            assert row["tokens_used"] == ref.totals.tokens, n
            assert row["cost_usd"] == pytest.approx(ref.totals.cost_usd), n
            costs = store.sql(
                "SELECT sum(cost_usd) FROM model_calls WHERE run_id = ? AND state = 'ok'", run_id
            )
            assert costs[0][0] == pytest.approx(ref.totals.cost_usd), n
            wrapped = store.sql(
                "SELECT count(*) FROM steps WHERE run_id = ? AND wrap_up = 1", run_id
            )
            assert wrapped == [(1,)], n
