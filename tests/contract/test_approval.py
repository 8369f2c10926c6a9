"""Durable human approval (issue 18): a tool declared with ``approval=`` parks its run until a
person decides, from any process; the decision is journaled exactly once; resume executes an
approved action, records a denied one ``not_executed`` with the reason, and asks nothing while
no decision is made. Crashes anywhere on the path resume into the same end."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    AlreadyDecided,
    ApprovalRequired,
    Limits,
    Loop,
    NotAwaitingApproval,
    StopReason,
    SystemClock,
    ToolContext,
    ToolRegistry,
)
from polyloop.batch.sweeper import deny_expired, find_stalled
from polyloop.journal import MemoryJournal, SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelReply, ModelRequest, ToolCall
from tests.conftest import Crash, RecordingJournal
from tests.durability import pg

ROOT = Path(__file__).resolve().parents[2]


class Mailer:
    """``send_email`` needs approval for every call; ``post`` only for a public channel."""

    def __init__(self, *, replay: str = "never", dies: bool = False) -> None:
        self.sent: list[tuple[str, str | None]] = []
        self.posted: list[str] = []
        self.tools = ToolRegistry()

        @self.tools.tool(approval=True, replay=replay)  # type: ignore[arg-type]
        def send_email(to: str, body: str, ctx: ToolContext) -> str:
            """Send an e-mail."""
            if dies:
                raise Crash("the process dies mid-action")
            self.sent.append((to, ctx.approved_by))
            return f"sent to {to}"

        @self.tools.tool(approval=lambda args: args["channel"] == "public")
        def post(channel: str, text: str) -> str:
            """Post a message."""
            self.posted.append(channel)
            return f"posted to {channel}"


def mail_then_answer(request: ModelRequest) -> ModelReply:
    """Step 0 sends an e-mail; then the model answers with what it saw last."""
    if request.step_idx == 0:
        call = ToolCall("send_email", {"to": "ceo@example.com", "body": "hi"}, "c1")
        return ModelReply(tool_calls=(call,))
    last = request.messages[-1].get("content") or ""
    return ModelReply(f"saw: {last}")


def loop_of(world: Mailer, journal: Any, **kw: Any) -> Loop:
    kw.setdefault("clock", FakeClock())
    return Loop(FunctionModel(mail_then_answer), tools=world.tools, journal=journal, **kw)


async def park(world: Mailer, journal: Any, run_id: str = "r", **kw: Any) -> ApprovalRequired:
    with pytest.raises(ApprovalRequired) as info:
        await loop_of(world, journal, **kw).run("mail the CEO", run_id=run_id)
    return info.value


async def test_a_call_that_needs_approval_parks_the_run_durably(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    world = Mailer()
    async with SQLiteJournal(db) as journal:
        exc = await park(world, journal)
        assert (exc.run_id, exc.step_idx, exc.tool_name) == ("r", 0, "send_email")
        assert exc.arguments == {"to": "ceo@example.com", "body": "hi"}
        assert exc.args_json == '{"body":"hi","to":"ceo@example.com"}'
        assert world.sent == []  # nothing executed
        conn = sqlite3.connect(db)
        status, owner, reason = conn.execute(
            "SELECT status, owner, stop_reason FROM runs WHERE run_id = 'r'"
        ).fetchone()
        assert (status, owner, reason) == ("awaiting_approval", None, None)  # no lease, no end
        kinds = [k for (k,) in conn.execute("SELECT kind FROM journal ORDER BY seq")]
        assert kinds[-2:] == ["action_intent", "approval_requested"]
        (row,) = await journal.pending_approvals()
        assert (row["run_id"], row["op_id"], row["tool_name"]) == ("r", exc.op_id, "send_email")
        runs = await journal.list_runs(run_id="r")
        assert runs[0]["state"] == "awaiting_approval"

        # A resume without a decision calls nothing and writes nothing.
        asked: list[int] = []
        model = FunctionModel(lambda q: asked.append(q.step_idx) or ModelReply("x"))
        again = Loop(model, tools=world.tools, journal=journal, clock=FakeClock())
        with pytest.raises(ApprovalRequired) as second:
            await again.resume("r")
        assert second.value.op_id == exc.op_id and asked == [] and world.sent == []
        assert [k for (k,) in conn.execute("SELECT kind FROM journal ORDER BY seq")] == kinds


async def test_approved_the_action_runs_once_and_the_tool_knows_who_approved() -> None:
    journal, world = MemoryJournal(), Mailer()
    exc = await park(world, journal)
    decision = await loop_of(world, journal).approve("r", exc.op_id, note="ok", by="alice")
    assert (decision.approved, decision.by, decision.step_idx) == (True, "alice", 0)
    r = await loop_of(world, journal).resume("r")
    assert r.stop_reason == StopReason.agent_finished
    assert world.sent == [("ceo@example.com", "alice")]
    assert (
        r.steps[0].action_status == "executed" and r.final_answer == "saw: sent to ceo@example.com"
    )
    kinds = [x.kind for x in journal.records("r")]
    assert kinds.count("approved_action_started") == 1 and kinds.count("approval_decided") == 1


async def test_denied_the_model_sees_the_reason_and_the_run_goes_on() -> None:
    journal, world = MemoryJournal(), Mailer()
    exc = await park(world, journal)
    await loop_of(world, journal).deny("r", exc.op_id, reason="not to the CEO", by="bob")
    r = await loop_of(world, journal).resume("r")
    assert world.sent == []
    step = r.steps[0]
    assert step.action_status == "not_executed" and step.observation_synthetic
    assert "not to the CEO" in (step.observation or "")
    assert r.final_answer is not None and "not to the CEO" in r.final_answer  # what it saw
    assert r.stop_reason == StopReason.agent_finished


async def test_one_decision_per_action_a_second_says_who_decided_first() -> None:
    journal, world = MemoryJournal(), Mailer()
    exc = await park(world, journal)
    loop = loop_of(world, journal)
    await loop.deny("r", exc.op_id, reason="no", by="bob")
    with pytest.raises(AlreadyDecided, match="denied by bob") as info:
        await loop.approve("r", exc.op_id, by="alice")
    assert info.value.decision.by == "bob"  # type: ignore[attr-defined]
    with pytest.raises(NotAwaitingApproval):
        await loop.approve("r", "no-such-op", by="alice")
    await loop.resume("r")
    with pytest.raises(AlreadyDecided):  # ended: the decision still stands and is named
        await loop.approve("r", exc.op_id)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_two_processes_racing_exactly_one_decision_wins(
    backend: str, tmp_path: Path, journal_where: Any
) -> None:
    where = journal_where(backend, tmp_path)
    world = Mailer()
    async with open_where(where) as journal:
        exc = await park(world, journal)
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from polyloop import AlreadyDecided, Loop
        from tests.contract.test_approval import open_where
        from polyloop.testing import ScriptedModel
        async def main(verdict):
            async with open_where({where!r}) as j:
                loop = Loop(ScriptedModel([]), journal=j)
                try:
                    if verdict == "approve":
                        await loop.approve("r", {exc.op_id!r}, by="p-" + verdict)
                    else:
                        await loop.deny("r", {exc.op_id!r}, reason="no", by="p-" + verdict)
                    print("won")
                except AlreadyDecided:
                    print("lost")
        asyncio.run(main(sys.argv[1]))
        """
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, verdict, cwd=ROOT, stdout=asyncio.subprocess.PIPE
        )
        for verdict in ("approve", "deny", "approve", "deny")
    ]
    outs = [(await p.communicate())[0].decode().strip() for p in procs]
    assert sorted(outs) == ["lost", "lost", "lost", "won"], outs
    async with open_where(where) as journal:
        r = await loop_of(world, journal).resume("r")
        records = (await journal.read("r"))[1]
    decided = [x for x in records if x.kind == "approval_decided"]
    assert len(decided) == 1
    winner = ["approve", "deny", "approve", "deny"][outs.index("won")]
    assert decided[0].by == f"p-{winner}"  # type: ignore[union-attr]
    assert len(world.sent) == (1 if winner == "approve" else 0)
    assert r.stop_reason == StopReason.agent_finished


async def test_approval_by_arguments_parks_only_the_calls_it_selects() -> None:
    world = Mailer()
    calls = iter(
        [
            ModelReply(tool_calls=(ToolCall("post", {"channel": "team", "text": "a"}),)),
            ModelReply(tool_calls=(ToolCall("post", {"channel": "public", "text": "b"}),)),
            ModelReply("done"),
        ]
    )
    journal = MemoryJournal()
    loop = Loop(FunctionModel(lambda q: next(calls)), tools=world.tools, journal=journal)
    with pytest.raises(ApprovalRequired) as info:
        await loop.run("post", run_id="p")
    assert world.posted == ["team"] and info.value.step_idx == 1
    await loop.approve("p", info.value.op_id)
    r = await loop.resume("p")
    assert world.posted == ["team", "public"] and r.final_answer == "done"


async def test_an_approved_never_tool_that_crashed_mid_action_is_resume_state_unknown() -> None:
    journal, world = MemoryJournal(), Mailer()
    exc = await park(world, journal)
    await loop_of(world, journal).approve("r", exc.op_id)
    with pytest.raises(Crash):
        await loop_of(Mailer(dies=True), journal).resume("r")
    r = await loop_of(world, journal).resume("r")
    assert r.stop_reason == StopReason.resume_state_unknown and world.sent == []
    assert r.pending_action is not None and r.pending_action.op_id == exc.op_id


@pytest.mark.parametrize("verdict", ["approve", "deny"])
@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_at_every_write_of_the_approval_path_resumes_into_the_same_end(
    verdict: str, after: bool
) -> None:
    async def through(journal: RecordingJournal, world: Mailer) -> Any:
        """Run, decide, resume until it ends, on one journal that crashes once (at write
        ``crash_at``, wherever on the path it falls): a crash is survived by resuming, a
        parked run by deciding (as a person would, on the journal underneath)."""
        try:
            return await loop_of(world, journal).run("mail the CEO", run_id="r")
        except (Crash, ApprovalRequired):
            pass
        for _ in range(6):
            pending = await journal.inner.pending_approvals()
            if pending:
                decider = loop_of(world, journal.inner)
                if verdict == "approve":
                    await decider.approve("r", pending[0]["op_id"], by="alice")
                else:
                    await decider.deny("r", pending[0]["op_id"], reason="no", by="bob")
            try:
                return await loop_of(world, journal).resume("r")
            except (Crash, ApprovalRequired):
                continue
        raise AssertionError("the run never ended")

    ref_journal, ref_world = RecordingJournal(), Mailer(replay="idempotent")
    ref = await through(ref_journal, ref_world)
    assert len(ref_world.sent) == (1 if verdict == "approve" else 0)
    for n in range(1, ref_journal.count + 1):
        journal = RecordingJournal(crash_at=n, crash_after=after)
        world = Mailer(replay="idempotent")
        r = await through(journal, world)
        assert (r.stop_reason, r.final_answer) == (ref.stop_reason, ref.final_answer), n
        if verdict == "deny":
            assert world.sent == [], n
        else:  # idempotent: a lost result may run it once more, always as approved
            assert 1 <= len(world.sent) <= 2 and {b for _, b in world.sent} == {"alice"}, n
        kinds = [x.kind for x in journal.inner.records("r")]
        assert kinds.count("end") == 1 and kinds.count("approval_decided") == 1, n
        assert kinds.count("approval_requested") == 1, n


async def test_parked_time_does_not_count_in_max_seconds() -> None:
    clock = FakeClock()
    journal, world = MemoryJournal(), Mailer()

    def slow(request: ModelRequest) -> ModelReply:
        clock.advance(2.0)
        return mail_then_answer(request)

    loop = Loop(FunctionModel(slow), tools=world.tools, journal=journal, clock=clock,
                limits=Limits(max_seconds=100))  # fmt: skip
    with pytest.raises(ApprovalRequired) as info:
        await loop.run("mail", run_id="t")
    clock.advance(10_000.0)  # a weekend waiting for the approver
    await loop.approve("t", info.value.op_id)
    r = await loop.resume("t")
    assert r.stop_reason == StopReason.agent_finished  # not time_budget
    assert r.totals.active_s == pytest.approx(4.0)


async def test_recover_leaves_parked_runs_alone_and_denies_expired_approvals(
    tmp_path: Path,
) -> None:
    world = Mailer()
    async with SQLiteJournal(tmp_path / "runs.db") as journal:
        await park(world, journal, run_id="waits", clock=SystemClock())
        await park(world, journal, run_id="expires", approval_timeout_s=60, clock=SystemClock())
        assert await find_stalled(journal, older_than_s=0) == []  # parked is not stalled
        assert await deny_expired(journal) == []  # not yet expired (wall clock)
        far = (await journal.pending_approvals())[0]["requested_at"] + 3600
        assert await deny_expired(journal, now=far) == ["expires"]
        assert [row["run_id"] for row in await journal.pending_approvals()] == ["waits"]
        r = await loop_of(world, journal).resume("expires")
        assert "timed out" in (r.steps[0].observation or "") and world.sent == []


# -- journals by where they live, for tests that use other processes -------------------------


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """``POLYLOOP_TEST_PG_DSN``, or a throwaway server (as the other PostgreSQL tests)."""
    with pg.server() as dsn:
        yield dsn


@pytest.fixture
def journal_where(request: pytest.FixtureRequest) -> Any:
    def make(backend: str, tmp_path: Path) -> str:
        if backend == "sqlite":
            return str(tmp_path / "runs.db")
        dsn = request.getfixturevalue("pg_dsn")  # a server only for the PostgreSQL cases
        schema = f"appr_{__import__('uuid').uuid4().hex[:12]}"
        return f"postgres:{dsn}#{schema}"

    return make


@contextlib.asynccontextmanager
async def open_where(where: str) -> AsyncIterator[Any]:
    """An opened journal from :func:`journal_where`'s string."""
    if where.startswith("postgres:"):
        from polyloop.journal import PostgresJournal

        dsn, _, schema = where.removeprefix("postgres:").partition("#")
        journal: Any = await PostgresJournal(dsn, schema=schema).open()
    else:
        journal = SQLiteJournal(where)
    try:
        yield journal
    finally:
        await journal.aclose()


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_stopping_a_parked_run_ends_it_and_says_its_action_never_ran(
    backend: str, tmp_path: Path, journal_where: Any
) -> None:
    async with opened(backend, tmp_path, journal_where) as journal:
        world = Mailer()
        await park(world, journal)
        answer = await loop_of(world, journal).stop("r", "not today", by="ops")
        assert answer.happened == "ended" and answer.stop_reason == StopReason.stopped
        r = await loop_of(world, journal).resume("r")
        assert r.pending_action is None and world.sent == []
        assert r.stop_detail is not None and "awaited approval: not executed" in r.stop_detail
        assert await journal.pending_approvals() == []
        (row,) = await journal.list_runs(run_id="r")
        assert (row["status"], row["stop_reason"]) == ("ended", "stopped")


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"])
async def test_runs_parking_together_are_each_marked_awaiting_approval(
    backend: str, tmp_path: Path, journal_where: Any
) -> None:
    # Their parking writes share a turn of the event loop (group commit where it exists).
    async with opened(backend, tmp_path, journal_where) as journal:
        world = Mailer()
        ids = [f"g{i}" for i in range(6)]
        await asyncio.gather(*(park(world, journal, run_id=i) for i in ids))
        rows = {r["run_id"]: r["status"] for r in await journal.list_runs()}
        assert rows == dict.fromkeys(ids, "awaiting_approval")
        assert sorted(p["run_id"] for p in await journal.pending_approvals()) == ids


def opened(backend: str, tmp_path: Path, journal_where: Any) -> Any:
    if backend == "memory":
        return contextlib.nullcontext(MemoryJournal())
    return open_where(journal_where(backend, tmp_path))


async def test_the_batch_runner_leaves_a_parked_run_alone_and_reports_it(tmp_path: Path) -> None:
    from polyloop.batch import execute

    world = Mailer()
    async with SQLiteJournal(tmp_path / "runs.db") as journal:
        exc = await park(world, journal, run_id="b")
        result = await execute(journal, ["b"], lambda j: loop_of(world, j))
        (outcome,) = result.outcomes
        assert outcome.status == "detached" and not outcome.is_ended
        assert outcome.detail == f"awaiting approval: send_email op_id={exc.op_id}"
        assert world.sent == [] and len(await journal.pending_approvals()) == 1
