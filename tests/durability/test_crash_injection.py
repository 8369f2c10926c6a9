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
import re
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from polyloop import StopReason
from polyloop.journal import MemoryJournal
from polyloop.types import ActionIntent, ActionResult, ActionUnknown, RunEnd, StepWritten
from tests.conftest import Crash, RecordingJournal
from tests.contract.test_resume import World, comparable, new_loop, reference
from tests.durability.crash_child import SCENARIOS, ForkServer, asking_loop
from tests.durability.journals import (
    Store,
    check_resumed,
    never_replay_intents,
    recording,
    records_of,
)


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
    assert len(outcomes) == len(writes) == 14  # every write of the six-step run
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


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_of_a_spent_budget_and_its_wrap_up(
    after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    """A token budget spent, then the wrap-up call (Loop(wrap_up=True)): killed around each
    write and resumed in another process, the run ends token_budget with the wrap-up's answer,
    the same steps, and the same tokens and cost (a lost attempt had no usage to count); its
    journal holds one end record and one wrap-up step."""
    store = journal_backend
    make = SCENARIOS["budget"]
    ref_journal = RecordingJournal()
    ref = await make(ref_journal).run("fix", run_id="b")
    assert ref.stop_reason == StopReason.token_budget and ref.steps[-1].wrap_up
    writes = ref_journal.count
    server = await ForkServer.start()
    try:
        async with store.journal() as journal:
            for n in range(1, writes + 1):
                run_id = f"b{n}"
                code = await server.crash(store.where, run_id, n, after, tmp_path / "fx", "budget")
                assert code == -signal.SIGKILL, (n, code)
                r = await make(journal).resume(run_id)
                assert (r.stop_reason, r.final_answer) == (ref.stop_reason, ref.final_answer), n
                assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
                assert r.totals.tokens == ref.totals.tokens, n
                assert r.totals.cost_usd == pytest.approx(ref.totals.cost_usd), n
    finally:
        await server.close()
    rows = store.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end') FROM journal GROUP BY run_id"
    )
    assert len(rows) == writes and all(ends == 1 for _, ends in rows), rows
    wrapped = store.sql("SELECT count(*) FROM steps WHERE wrap_up = 1")
    assert wrapped == [(writes,)]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_of_the_approval_path_then_resume(
    after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    """A run parks on an action that needs approval, its process approves it and resumes it:
    killed around each write (the park, the decision, the approved start, the result, the
    end), the run is decided once and ends once, the never-replay e-mail is sent at most once,
    and the run ends as the undisturbed one did, or resume_state_unknown when the kill came
    while the e-mail was being sent (its outcome unknown)."""
    from polyloop import ApprovalRequired
    from polyloop.journal import MemoryJournal
    from tests.contract.test_approval import Mailer, loop_of
    from tests.durability.crash_child import Dying, approval_scenario

    store = journal_backend
    counting = Dying(MemoryJournal(), 0, False)
    ref = await approval_scenario(counting, "a", None)
    assert ref.stop_reason == StopReason.agent_finished
    writes = counting.count
    server = await ForkServer.start()
    try:
        async with store.journal() as journal:
            for n in range(1, writes + 1):
                run_id = f"a{n}"
                effects = tmp_path / f"fx{n}.txt"
                effects.touch()
                code = await server.crash(store.where, run_id, n, after, effects, "approval")
                assert code == -signal.SIGKILL, (n, code)
                world = Mailer()
                try:
                    r = await loop_of(world, journal).resume(run_id)
                except ApprovalRequired as parked:  # killed before its decision was durable
                    await loop_of(world, journal).approve(run_id, parked.op_id, by="parent")
                    r = await loop_of(world, journal).resume(run_id)
                sent = effects.read_text().splitlines() + [f"sent {x}" for x in world.sent]
                assert len(sent) <= 1, f"the never-replay e-mail was sent twice (write {n})"
                if r.stop_reason == StopReason.resume_state_unknown:
                    assert r.pending_action is not None, n
                    assert r.pending_action.tool_name == "send_email", n
                else:
                    assert (r.stop_reason, r.final_answer) == (ref.stop_reason, ref.final_answer)
                    assert len(sent) == 1, n
    finally:
        await server.close()
    rows = store.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end'), "
        "count(*) FILTER (WHERE kind = 'approval_decided'), count(*), max(seq) FROM journal "
        "GROUP BY run_id"
    )
    assert len(rows) == writes
    assert all(e == 1 and d == 1 and c == top for _, e, d, c, top in rows), rows


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_of_an_outcome_unknown_replayed(
    after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    """An idempotent tool raising OutcomeUnknown live, executed again with the same op_id:
    killed around each write (its action_unknown records included) and resumed in another
    process, the run finishes with the same steps (the action's says ``replayed``); each run's
    reports are numbered 1, 2, ... across the processes, and it has one end record."""
    store = journal_backend
    make = SCENARIOS["unknown"]
    ref_journal = RecordingJournal()
    ref = await make(ref_journal).run("fix", run_id="u")
    assert ref.stop_reason == StopReason.agent_finished
    assert ref.steps[0].outcome_unknown == "replayed"
    writes = ref_journal.count
    server = await ForkServer.start()
    try:
        async with store.journal() as journal:
            for n in range(1, writes + 1):
                run_id = f"u{n}"
                fx = tmp_path / "fx"
                code = await server.crash(store.where, run_id, n, after, fx, "unknown")
                assert code == -signal.SIGKILL, (n, code)
                r = await make(journal).resume(run_id)
                assert (r.stop_reason, r.final_answer) == (ref.stop_reason, ref.final_answer), n
                assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
                records = await records_of(journal, run_id)
                reports = [x.attempt for x in records if isinstance(x, ActionUnknown)]
                assert reports == list(range(1, len(reports) + 1)) and reports, n
    finally:
        await server.close()
    rows = store.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end') FROM journal GROUP BY run_id"
    )
    assert len(rows) == writes and all(ends == 1 for _, ends in rows), rows
    paths = store.sql("SELECT DISTINCT outcome_unknown FROM steps WHERE step_idx = 0")
    assert paths == [("replayed",)]


# -- the writes of a request to end a run -----------------------------------------------------


class Writes:
    """Delegates to a journal and labels each write: ``request`` for a request to end a run,
    else the kinds of the records appended."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.labels: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, lease: Any, records: Any) -> None:
        self.labels.append([r.kind for r in records])
        await self.inner.append(lease, records)

    async def request_end(self, run_id: str, request: Any, **kw: Any) -> Any:
        self.labels.append(["request"])
        return await self.inner.request_end(run_id, request, **kw)


def ids_out(detail: str | None) -> str | None:
    """A stop detail without the op ids drawn per run."""
    return None if detail is None else re.sub(r"op_id=\w+", "op_id=…", detail)


@pytest.mark.parametrize("kind", ["stop", "cancel"])
@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_of_a_run_asked_to_end_then_resume(
    kind: str, after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    # The run's model asks its own Loop to stop (cancel) the run during step 3's call: the
    # request is a write of its own, then the run ends at the step boundary (stop) or at once
    # (cancel). Killed around each write, the run is resumed in another process: a request
    # that was durable is honoured at once (the step it interrupted is not finished); one
    # that was not is made again when the resumed run's model reaches step 3.
    store = journal_backend
    reference = Writes(MemoryJournal())
    ref = await asking_loop(World(), reference, kind).run("pay", run_id="ref")
    reason = StopReason.stopped if kind == "stop" else StopReason.cancelled
    assert ref.stop_reason == reason and ref.stop_detail is not None
    writes = reference.labels
    assert ["request"] in writes and writes[-1][-1] == "end"
    servers = await asyncio.gather(*(ForkServer.start() for _ in range(3)))

    async def one(n: int, journal: Any) -> None:
        run_id = f"{kind}{n}"
        effects = tmp_path / f"fx{kind}{n}.txt"
        effects.touch()
        code = await servers[n % len(servers)].crash(
            store.where, run_id, n, after, effects, scenario=kind
        )
        assert code == -signal.SIGKILL, (n, code)
        status, request = store.sql("SELECT status, request FROM runs WHERE run_id = ?", run_id)[0]
        _, records = await journal.read(run_id)
        steps = sum(isinstance(x, StepWritten) for x in records)
        resolved = {x.op_id for x in records if isinstance(x, ActionResult)}
        unresolved = any(  # the charge's outcome was lost: never replayed
            isinstance(x, ActionIntent)
            and x.action.tool_name == "charge"
            and x.op_id not in resolved
            for x in records
        )
        world = World()
        r = await asking_loop(world, journal, kind).resume(run_id)
        lines = effects.read_text().splitlines()
        charged = [x for x in lines if x.startswith("charged")] + world.charged
        assert len(charged) <= 1, f"the never-replay tool ran twice (crash at write {n})"
        if unresolved:
            assert r.stop_reason == StopReason.resume_state_unknown, n
            return
        assert r.stop_reason == reason, (n, r.stop_reason)
        if request is not None and status == "running":  # durable, not yet honoured
            assert r.steps_used == steps, n  # ended at once by the resumer
            assert (r.stop_detail or "").startswith("enough"), n
        else:  # not asked yet (asked again on resume), or ended as the reference did
            assert r.steps_used == ref.steps_used, n
            assert ids_out(r.stop_detail) == ids_out(ref.stop_detail), n
        k = r.steps_used
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]], n

    try:
        async with store.journal() as journal:
            await asyncio.gather(*(one(n, journal) for n in range(1, len(writes) + 1)))
    finally:
        for server in servers:
            await server.close()
    rows = store.sql(
        "SELECT run_id, count(*) FILTER (WHERE kind = 'end'), count(*), max(seq) FROM journal "
        "GROUP BY run_id"
    )
    assert len(rows) == len(writes)
    assert all(ends == 1 and count == top for _, ends, count, top in rows), rows


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_the_request_that_ends_a_run_nobody_holds(
    after: bool, journal_backend: Store, tmp_path: Path
) -> None:
    # Runs left by a crash before each write of the contract scenario in turn (their lease
    # released: nobody holds them), each stopped by a child process that is killed just
    # before or just after its request, the one write that stores it and ends the run. Then
    # the run is stopped again here, and resumed: it ended exactly once, as the request that
    # landed says, with an action left without a result named.
    store = journal_backend
    ref_journal, _ = await reference()
    server = await ForkServer.start()
    try:
        async with store.journal() as journal:
            for n in range(1, len(ref_journal.appends) + 1):
                run_id = f"q{n}"
                with pytest.raises(Crash):
                    await new_loop(World(), recording(journal, crash_at=n)).run(
                        "pay", run_id=run_id
                    )
                before = await records_of(journal, run_id)
                code = await server.crash(
                    store.where, run_id, 1, after, tmp_path / "fx", scenario="request"
                )
                assert code == -signal.SIGKILL, (n, code)
                status = store.sql("SELECT status FROM runs WHERE run_id = ?", run_id)[0][0]
                assert status == ("ended" if after else "running"), n
                again = await new_loop(World(), journal).stop(run_id, "again", by="the test")
                assert again.happened == ("already_ended" if after else "ended"), n
                assert again.request is not None
                assert again.request.by == ("the requester" if after else "the test"), n
                r = await new_loop(World(), journal).resume(run_id)
                assert r.stop_reason == StopReason.stopped, n
                assert await records_of(journal, run_id) == (
                    *before,
                    (await journal.read(run_id))[1][-1],
                )
                intent = before[-1] if before else None
                if isinstance(intent, ActionIntent):
                    assert r.pending_action is not None and r.pending_action.op_id == intent.op_id
                else:
                    assert r.pending_action is None, n
    finally:
        await server.close()
    rows = store.sql(
        "SELECT count(*) FILTER (WHERE kind = 'end'), count(DISTINCT run_id) FROM journal"
    )
    assert rows[0][0] == rows[0][1] or rows[0][0] == len(ref_journal.appends), rows
