"""Stopping and cancelling a run from anywhere (``Loop.stop`` / ``Loop.cancel``), in one process,
on every journal (memory, SQLite, PostgreSQL): a run this Loop drives, a run another Loop drives
(its owner learns of the request at its next heartbeat), a detached run, a run created and never
started, a crashed run whose lease expired (its action in flight named), an ended run, and
requests that meet a pending one. tests/durability/test_stop_requests_processes.py does it
across processes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    ConfigError,
    Limits,
    Loop,
    ModelReply,
    RunDetached,
    RunNotFound,
    StopReason,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel
from polyloop.types import ActionResult, ModelRequest, RunEnd, RunSpec, StepWritten
from tests.conftest import Crash, RecordingJournal, call, first_write
from tests.contract.test_resume import World, new_loop
from tests.durability.journals import (
    SQLiteStore,
    make_reference,
    recording,
    records_of,
)

LONG = Limits(max_steps=10_000)


class Clock:
    """Epoch seconds for the journals' leases: the real time, plus what a test skips ahead."""

    def __init__(self) -> None:
        self.skipped = 0.0

    def __call__(self) -> float:
        return time.time() + self.skipped


class Journals:
    """Journal objects on one fresh store of one journal (memory, SQLite, PostgreSQL), their
    lease clock :attr:`clock`; ``async with journals.open() as journal`` opens another object
    on the same store (the memory journal hands back its one object)."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.clock = Clock()
        self.memory = MemoryJournal(clock=self.clock) if kind == "memory" else None
        store: Any = None
        if kind == "sqlite":
            store = SQLiteStore(tmp_path / "j.db")
        elif kind == "postgres":
            store = request.getfixturevalue("db")
        self.store = store

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[Any]:
        if self.memory is not None:
            yield self.memory
            return
        async with self.store.journal(clock=self.clock) as journal:
            yield journal


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def journals(request: pytest.FixtureRequest, tmp_path: Path) -> Journals:
    return Journals(request.param, request, tmp_path)


async def crash_at(journal: Any, n: int, *, after: bool, run_id: str = "r") -> World:
    """tests/contract/test_resume.py's run, crashed around its n-th write, its lease then
    held for 60 s as a process that died would have left it (a crash inside this process
    releases it on the way out)."""
    world = World()
    with pytest.raises(Crash):
        await new_loop(world, recording(journal, crash_at=n, crash_after=after)).run(
            "pay", run_id=run_id
        )
    await journal.acquire(run_id, ttl_s=60)
    return world


class Gate:
    """Tools whose action waits until the test lets it go: ``tick`` (returns at once),
    ``hold`` (waits for ``release``), ``forever`` (never returns)."""

    def __init__(self, enough: int = 2) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.ticks = 0
        self.enough = enough
        self.ticked = asyncio.Event()  # set once ``enough`` ticks have run

    def tools(self) -> ToolRegistry:
        tools = ToolRegistry()

        @tools.tool(replay="idempotent")
        async def tick() -> str:
            """One more step."""
            self.ticks += 1
            if self.ticks >= self.enough:
                self.ticked.set()
            await asyncio.sleep(0)
            return f"tick {self.ticks}"

        @tools.tool
        async def hold() -> str:
            """Waits until released."""
            self.entered.set()
            await self.release.wait()
            return "held and released"

        @tools.tool
        async def forever() -> str:
            """Never returns."""
            self.entered.set()
            await asyncio.Event().wait()
            return "never"

        return tools


def after(n: int, tool: str) -> Callable[[ModelRequest], ModelReply]:
    """``tick`` for steps 0..n-1, then ``tool`` every step."""
    return lambda r: call("tick") if r.step_idx < n else call(tool)


def loop_on(journal: Any, gate: Gate, fn: Callable[[ModelRequest], Any], **kw: Any) -> Loop:
    kw.setdefault("limits", LONG)
    return Loop(FunctionModel(fn), tools=gate.tools(), journal=journal, **kw)


async def row(journal: Any, run_id: str) -> dict[str, Any]:
    listed: list[dict[str, Any]] = await journal.list_runs(run_id=run_id)
    return listed[0]


def ends(records: Any) -> list[RunEnd]:
    return [r for r in records if isinstance(r, RunEnd)]


async def test_a_stop_of_a_run_this_loop_drives_ends_it_after_the_action_in_flight(
    journals: Journals,
) -> None:
    gate = Gate()
    async with journals.open() as journal:
        loop = loop_on(journal, gate, after(2, "hold"))
        task = asyncio.ensure_future(loop.run("g", run_id="s"))
        await gate.entered.wait()  # step 2's action is in flight
        answer = await loop.stop("s", "budget exhausted", by="ops")
        assert answer.happened == "requested" and answer.request is not None
        assert (answer.request.kind, answer.request.by) == ("stop", "ops")
        assert not task.done()  # the action in flight finishes first
        gate.release.set()
        r = await task
        assert (r.stop_reason, r.stop_detail) == (StopReason.stopped, "budget exhausted")
        assert r.steps_used == 3 and r.steps[-1].observation == "held and released"
        records = await records_of(journal, "s")
        assert [x.kind for x in records[-3:]] == ["action_result", "step", "end"]
        assert records[-1] == ends(records)[0]  # no model call after the stop
        stored = await row(journal, "s")
        assert (stored["stop_reason"], stored["stop_detail"]) == ("stopped", "budget exhausted")
        assert (stored["request"], stored["request_reason"], stored["requested_by"]) == (
            "stop",
            "budget exhausted",
            "ops",
        )


async def test_a_cancel_of_a_run_this_loop_drives_returns_its_result_instead_of_raising(
    journals: Journals,
) -> None:
    gate = Gate()
    async with journals.open() as journal:
        loop = loop_on(journal, gate, after(1, "hold"), cancel_grace_s=30)
        task = asyncio.ensure_future(loop.run("c", run_id="c"))
        await gate.entered.wait()
        answer = await loop.cancel("c", reason="wrong goal")
        assert answer.happened == "requested"
        await asyncio.sleep(0.05)
        assert not task.done()  # the action in flight has the grace to finish
        gate.release.set()
        r = await task  # returned, not raised: nobody cancelled the caller
        assert (r.stop_reason, r.stop_detail) == (StopReason.cancelled, "wrong goal")
        assert r.steps_used == 2 and r.steps[-1].observation == "held and released"
        assert not task.cancelled()


async def test_a_cancelled_action_that_outlives_the_grace_is_named_with_the_reason(
    journals: Journals,
) -> None:
    gate = Gate()
    async with journals.open() as journal:
        loop = loop_on(journal, gate, after(1, "forever"), cancel_grace_s=0.05)
        task = asyncio.ensure_future(loop.run("g", run_id="c"))
        await gate.entered.wait()
        await loop.cancel("c", reason="hung")
        r = await task
        assert r.stop_reason == StopReason.cancelled and r.steps_used == 1
        detail = r.stop_detail or ""
        assert detail.startswith("hung; in-flight action op_id=") and "tool=forever" in detail
        assert detail.endswith("outcome unknown")
        records = await records_of(journal, "c")
        assert [x.step_idx for x in records if isinstance(x, ActionResult)] == [0]  # tick's


async def test_a_request_cancel_and_a_cancel_of_the_caller_still_raise() -> None:
    gate = Gate()
    journal = MemoryJournal()
    loop = loop_on(journal, gate, after(0, "hold"), cancel_grace_s=30)
    task = asyncio.ensure_future(loop.run("g", run_id="c"))
    await gate.entered.wait()
    await loop.cancel("c")
    task.cancel()  # the caller too
    gate.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ends(journal.records("c"))[0].stop_reason == StopReason.cancelled


async def test_a_stop_reaches_a_run_another_loop_drives_at_its_next_heartbeat(
    journals: Journals,
) -> None:
    gate = Gate()
    async with journals.open() as owner_journal, journals.open() as other_journal:
        owner = loop_on(owner_journal, gate, after(10_000, "tick"), lease_ttl_s=0.3)
        task = asyncio.ensure_future(owner.run("g", run_id="h"))
        await gate.ticked.wait()
        other = loop_on(other_journal, Gate(), after(0, "tick"))
        answer = await other.stop("h", "from elsewhere")
        assert answer.happened == "requested"
        r = await task
        assert (r.stop_reason, r.stop_detail) == (StopReason.stopped, "from elsewhere")
        assert r.steps_used == gate.ticks  # every action's step was recorded


async def test_a_detached_run_is_ended_at_once_and_resumes_as_ended(
    journals: Journals,
) -> None:
    gate = Gate()
    async with journals.open() as journal:
        loop = loop_on(journal, gate, after(10_000, "tick"))
        task = asyncio.ensure_future(loop.run("g", run_id="d"))
        await gate.ticked.wait()
        loop.detach("d")
        with pytest.raises(RunDetached):
            await task
        steps = (await row(journal, "d"))["steps_used"]
        answer = await loop.stop("d", "not needed")
        assert answer.happened == "ended" and answer.stop_reason == StopReason.stopped
        assert answer.stop_detail == "not needed"
        model = FunctionModel(lambda r: pytest.fail("no model call for an ended run"))
        r = await Loop(model, tools=gate.tools(), journal=journal).resume("d")
        assert (r.stop_reason, r.stop_detail, r.steps_used) == (
            StopReason.stopped,
            "not needed",
            steps,
        )
        assert r.pending_action is None
        assert len(ends(await records_of(journal, "d"))) == 1


async def test_a_run_created_and_never_started_is_ended_at_once(
    journals: Journals,
) -> None:
    async with journals.open() as journal:
        lease = await journal.create(RunSpec("q", "queued", LONG, 0.0), ttl_s=30)
        await journal.release(lease)  # as a batch leaves a row it has not dispatched
        loop = loop_on(journal, Gate(), after(0, "tick"))
        answer = await loop.cancel("q", reason="batch withdrawn")
        assert (answer.happened, answer.stop_reason) == ("ended", StopReason.cancelled)
        stored = await row(journal, "q")
        assert (stored["state"], stored["stop_reason"], stored["steps_used"]) == (
            "ended",
            "cancelled",
            0,
        )
        assert stored["stop_detail"] == "batch withdrawn" and stored["request"] == "cancel"


async def test_a_crashed_run_whose_lease_expired_is_ended_naming_its_action_in_flight(
    journals: Journals,
) -> None:
    ref, _ = await make_reference()
    async with journals.open() as journal:
        # Crashed with the intent of its never-replay 'charge' action durable, no result.
        world = await crash_at(journal, first_write(ref, "action_intent", "charge"), after=True)
        assert [x.kind for x in await records_of(journal, "r")][-1] == "action_intent"
        loop = new_loop(World(), journal)
        answer = await loop.stop("r", "giving up")
        assert answer.happened == "requested"  # its lease is still live: nothing ended
        journals.clock.skipped += 3600  # the lease expires
        answer = await loop.stop("r", "giving up")  # a pending stop, but nobody to honour it
        assert answer.happened == "ended" and answer.stop_reason == StopReason.stopped
        detail = answer.stop_detail or ""
        assert detail.startswith("giving up; in-flight action op_id=") and "tool=charge" in detail
        assert detail.endswith("outcome unknown")
        later = World()
        r = await new_loop(later, journal).resume("r")
        assert r.pending_action is not None and r.pending_action.tool_name == "charge"
        assert (r.stop_reason, r.stop_detail) == (StopReason.stopped, detail)
        assert world.charged == later.charged == []  # the crash came first; never run after
        assert len(ends(await records_of(journal, "r"))) == 1


async def test_a_request_on_an_ended_run_changes_nothing_and_says_how_it_ended(
    journals: Journals,
) -> None:
    async with journals.open() as journal:
        done = await new_loop(World(), journal).run("pay", run_id="e")
        before = await records_of(journal, "e")
        answer = await new_loop(World(), journal).stop("e", "too late")
        assert (answer.happened, answer.stop_reason) == ("already_ended", done.stop_reason)
        assert answer.request is None and "had already ended task_completed" in answer.describe()
        assert await records_of(journal, "e") == before
        assert (await row(journal, "e"))["request"] is None  # nothing was written


async def test_a_second_stop_keeps_the_first_a_cancel_upgrades_it_a_stop_never_downgrades(
    journals: Journals,
) -> None:
    gate = Gate()
    async with journals.open() as journal:
        owner = loop_on(journal, gate, after(0, "hold"), lease_ttl_s=3600, cancel_grace_s=30)
        task = asyncio.ensure_future(owner.run("g", run_id="p"))
        await gate.entered.wait()
        other = loop_on(journal, Gate(), after(0, "tick"))  # not the driver: no direct hand-over
        first = await other.stop("p", "first", by="alice")
        second = await other.stop("p", "second", by="bob")
        assert (first.happened, second.happened) == ("requested", "already_requested")
        assert second.request == first.request  # the first stays in force, and says who
        assert "alice" in second.describe()
        upgraded = await other.cancel("p", reason="now", by="carol")
        assert upgraded.happened == "requested" and upgraded.request is not None
        assert upgraded.request.kind == "cancel"
        downgrade = await other.stop("p", "later", by="dave")
        assert downgrade.happened == "already_requested" and downgrade.request == upgraded.request
        stored = await row(journal, "p")
        assert (stored["request"], stored["requested_by"]) == ("cancel", "carol")
        await owner.cancel("p")  # its own Loop: handed to the driver at once
        gate.release.set()
        r = await task
        assert (r.stop_reason, r.stop_detail) == (StopReason.cancelled, "now")


async def test_a_resumed_run_with_a_stored_stop_ends_at_once_without_a_model_call(
    journals: Journals,
) -> None:
    ref, _ = await make_reference()
    async with journals.open() as journal:
        world = await crash_at(journal, first_write(ref, "action_intent", "charge"), after=False)
        steps = sum(isinstance(x, StepWritten) for x in await records_of(journal, "r"))
        asked = await new_loop(World(), journal).stop("r", "halt")
        assert asked.happened == "requested"  # its crashed owner's lease is live: stored only
        journals.clock.skipped += 3600
        model = FunctionModel(lambda r: pytest.fail("a stored stop is honoured first"))
        r = await Loop(model, tools=world.tools(), journal=journal).resume("r")
        assert (r.stop_reason, r.stop_detail, r.steps_used) == (StopReason.stopped, "halt", steps)
        assert r.pending_action is None  # its model call was in flight: no action was
        assert len(ends(await records_of(journal, "r"))) == 1


async def test_a_journal_that_takes_no_requests_is_a_config_error() -> None:
    loop = Loop(FunctionModel(lambda r: "x"), journal=RecordingJournal())
    with pytest.raises(ConfigError, match="RecordingJournal cannot take requests to end a run"):
        await loop.stop("r", "why")


async def test_a_stop_needs_a_reason() -> None:
    loop = Loop(FunctionModel(lambda r: "x"))
    await loop.run("g", run_id="r")
    with pytest.raises(ConfigError, match="give a reason"):
        await loop.stop("r", "  ")


async def test_a_request_on_a_run_that_does_not_exist_raises_run_not_found(
    journals: Journals,
) -> None:
    async with journals.open() as journal:
        with pytest.raises(RunNotFound):
            await loop_on(journal, Gate(), after(0, "tick")).cancel("nope")


async def test_a_cancel_requested_before_an_action_starts_keeps_it_from_starting() -> None:
    gate = Gate()
    loop: Loop

    async def ask_then_act(request: ModelRequest) -> ModelReply:
        if request.step_idx == 1:  # nothing in the journal's writes awaits in memory
            await loop.cancel(request.run_id, reason="now")
        return call("tick")

    loop = loop_on(MemoryJournal(), gate, ask_then_act)
    r = await loop.run("g", run_id="c")
    assert (r.stop_reason, r.steps_used, gate.ticks) == (StopReason.cancelled, 1, 1)
    assert (r.stop_detail or "").endswith("cancelled before it started")


async def test_a_cancellation_its_caller_swallowed_earlier_does_not_stop_the_run() -> None:
    me = asyncio.current_task()
    assert me is not None
    me.cancel()
    with contextlib.suppress(asyncio.CancelledError):  # caught, never uncancelled
        await asyncio.sleep(0)
    assert me.cancelling() == 1
    gate = Gate()
    r = await loop_on(MemoryJournal(), gate, after(2, "none"), limits=Limits(max_steps=2)).run("g")
    assert (r.stop_reason, gate.ticks) == (StopReason.step_budget, 2)
    me.uncancel()
