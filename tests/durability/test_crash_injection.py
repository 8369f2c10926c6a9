"""The crash-injection proof (durability.md, "How this is proven"), on every durable journal.

A child process runs a scripted six-step run and is killed with SIGKILL just before, then just
after, every journal write in turn, holding its lease. The run is then resumed here, in another
process, from what the dead child left in the store (its owner is provably dead: the run is
taken over at once). For every point: a never-replay tool's side effect happened at most once;
an idempotent tool that ran before the crash saw the same op_id again; the resumed trajectory
equals the uncrashed one field by field except timings and per-run ids, or the run ended
resume_state_unknown exactly where the replay policy demands; no step lost or duplicated.

The crash points are independent runs of one store (run ``r<n>`` dies at write n), run side by
side by children forked from a few :class:`~tests.durability.crash_child.ForkServer` s.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from polyloop import StopReason
from polyloop.types import RunEnd
from tests.conftest import RecordingJournal
from tests.contract.test_resume import World, comparable, new_loop, reference
from tests.durability.crash_child import SCENARIOS, ForkServer
from tests.durability.journals import Store, check_resumed, never_replay_intents, records_of


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_then_resume_in_another_process(
    after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    store = journal_backend
    ref_journal, ref = await reference()
    writes = ref_journal.appends
    never = never_replay_intents(ref_journal)
    store_results = {  # writes holding the result of the idempotent `store` tool
        i for i, batch in enumerate(writes, start=1)
        if batch[0].kind == "action_result" and "stored" in batch[0].outcome.observation
    }  # fmt: skip
    servers = await asyncio.gather(*(ForkServer.start() for _ in range(3)))

    async def one(n: int, journal: Any) -> tuple[int, Any, list[str], World]:
        run_id = f"r{n}"
        effects = tmp_path / f"fx{n}.txt"
        effects.touch()
        code = await servers[n % len(servers)].crash(store.where, run_id, n, after, effects)
        assert code == -signal.SIGKILL, (n, code)
        if not after or not any(isinstance(x, RunEnd) for x in writes[n - 1]):
            owner = store.sql("SELECT owner FROM runs WHERE run_id = ?", run_id)
            assert owner[0][0] is not None, n  # it died holding the lease
        world = World()
        result = await new_loop(world, journal).resume(run_id)  # taken over at once
        return n, result, effects.read_text().splitlines(), world

    try:
        async with store.journal() as journal:  # creates the tables the children use
            outcomes = await asyncio.gather(*(one(n, journal) for n in range(1, len(writes) + 1)))
    finally:
        for server in servers:
            await server.close()
    assert len(outcomes) == len(writes) == 19  # every write of the six-step run
    for n, r, lines, world in outcomes:
        charged = [x for x in lines if x.startswith("charged")] + world.charged
        stored = [x.split()[1] for x in lines if x.startswith("stored")] + world.stored
        assert len(charged) <= 1, f"the never-replay tool ran twice (crash at write {n})"
        replayed = len(stored) - len(set(stored))  # op_ids the idempotent tool saw twice
        if not after and n in store_results:  # it ran, its result was lost: same op_id again
            assert replayed == 1, n
        else:
            assert replayed == 0, n
        if check_resumed(n, r, ref, never.get(n if after else n - 1)):
            continue
        assert len(charged) == 1, n
    # Every run ended exactly once, and its records have no duplicate or gap.
    rows = store.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end'), count(*), max(seq) FROM journal "
        "GROUP BY run_id"
    )
    assert len(rows) == len(writes)
    assert all(ends == 1 and count == top for _, ends, count, top in rows), rows


LEDGER_KINDS = ("failure_seen", "failure_known", "test_edit")


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("scenario", ["fix", "escalate"])
async def test_sigkill_around_every_write_of_a_fix_loop_then_resume_rebuilds_its_ledger(
    after: bool, scenario: str, journal_backend: Store, tmp_path: Path
) -> None:
    """The fix loop writes every failure-ledger record (the baseline's known failures, a test
    edit, a round per test run) and ends repeated_failure with its report; the hand-over ends
    escalated with its report. Killed around each of its writes and resumed in another
    process, each ends with the same report and test edits, and its journal holds each ledger
    record exactly once."""
    store = journal_backend
    make = SCENARIOS[scenario]
    ref_journal = RecordingJournal()
    ref = await make(ref_journal).run("fix", run_id="f")
    assert ref.stop_reason in (StopReason.repeated_failure, StopReason.escalated)
    assert ref.report is not None
    writes = ref_journal.count
    ref_kinds = [r.kind for r in ref_journal.inner.records("f")]
    server = await ForkServer.start()

    async def one(n: int, journal: Any) -> None:
        run_id = f"f{n}"
        code = await server.crash(store.where, run_id, n, after, tmp_path / "fx", scenario)
        assert code == -signal.SIGKILL, (n, code)
        r = await make(journal).resume(run_id)
        assert (r.stop_reason, r.stop_detail) == (ref.stop_reason, ref.stop_detail), n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert r.report == replace(ref.report, run_id=run_id), n  # type: ignore[arg-type]
        assert r.test_edits == ref.test_edits, n
        kinds = [x.kind for x in await records_of(journal, run_id)]
        for kind in LEDGER_KINDS:
            assert kinds.count(kind) == ref_kinds.count(kind), (n, kind)

    try:
        async with store.journal() as journal:
            for n in range(1, writes + 1):
                await one(n, journal)
    finally:
        await server.close()
    rows = store.sql(
        "SELECT kind, count(*) FROM journal WHERE kind IN (?, ?, ?) GROUP BY kind", *LEDGER_KINDS
    )
    assert dict(rows) == {k: writes * ref_kinds.count(k) for k in LEDGER_KINDS if k in ref_kinds}
