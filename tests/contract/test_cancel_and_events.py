"""kernel.md §2, §8 and §9: the entry, cancellation, detaching, other exceptions, events."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from typing import Any

import pytest

from polyloop import (
    Limits,
    Loop,
    ModelReply,
    RunDetached,
    RunExists,
    StopReason,
    ToolRegistry,
)
from polyloop.events import (
    ActionFinished,
    ActionStarted,
    ModelCallFinished,
    ModelCallStarted,
    RunEnded,
    RunStarted,
    StepAppended,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel, ScriptedModel
from polyloop.tools import ToolEnvironment
from polyloop.types import ActionResult, ActionStatus, JournalError, Lease, ModelRequest, RunEnd
from tests.conftest import RecordingJournal, call, make_tools

# --- §2 the entry ----------------------------------------------------------------------------


async def test_loop_with_only_a_model_and_tools_works() -> None:
    r = await Loop(ScriptedModel([call("noop"), "done"]), tools=make_tools()).run("g")
    assert r.stop_reason == StopReason.agent_finished


def test_tools_and_environment_together_is_a_type_error() -> None:
    tools = ToolRegistry()
    from polyloop import ToolEnvironment

    with pytest.raises(TypeError, match="not both"):
        Loop(ScriptedModel([]), tools=tools, environment=ToolEnvironment(tools))


async def test_a_duplicate_run_id_raises_run_exists_and_writes_nothing() -> None:
    journal = RecordingJournal()
    loop = Loop(ScriptedModel(["a", "b"]), journal=journal)
    await loop.run("g", run_id="r1")
    before = list(journal.inner.records("r1"))
    with pytest.raises(RunExists, match="r1"):
        await loop.run("other", run_id="r1")
    assert list(journal.inner.records("r1")) == before


async def test_history_is_stored_counts_toward_no_budget_and_steps_start_at_zero() -> None:
    journal = MemoryJournal()
    model = ScriptedModel(["fine"])
    history = [{"role": "user", "content": "phase 1 said hi"}]
    r = await Loop(model, journal=journal, limits=Limits(max_steps=1)).run("g", history=history)
    spec, _ = await journal.read(r.run_id)
    assert list(spec.history) == history
    assert r.steps[0].step_idx == 0 and r.stop_reason == StopReason.agent_finished
    assert any(m.get("content") == "phase 1 said hi" for m in model.requests[0].messages)


async def test_concurrent_runs_on_one_loop_are_independent() -> None:
    def fn(request: ModelRequest) -> ModelReply:
        return call("noop") if request.step_idx < 3 else ModelReply(f"end {request.run_id}")

    loop = Loop(FunctionModel(fn), tools=make_tools())
    results = await asyncio.gather(*(loop.run("g", run_id=f"r{i}") for i in range(20)))
    assert [r.final_answer for r in results] == [f"end r{i}" for i in range(20)]
    assert all(r.steps_used == 4 and r.actions_executed == 3 for r in results)


def test_run_sync_works_from_a_script() -> None:
    r = Loop(ScriptedModel(["sync answer"])).run_sync("g")
    assert r.final_answer == "sync answer"


# --- §8 cancellation ---------------------------------------------------------------------------


async def test_cancellation_reraises_and_the_journal_end_record_says_cancelled() -> None:
    journal = RecordingJournal()
    started = asyncio.Event()

    async def hang(request: ModelRequest) -> ModelReply:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    task = asyncio.create_task(Loop(FunctionModel(hang), journal=journal).run("g", run_id="c1"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    end = journal.end("c1")
    assert end is not None and end.stop_reason == StopReason.cancelled
    assert end.stop_detail is None  # nothing was in flight but the model call


async def test_a_cancelled_run_resumes_as_cancelled_without_calls() -> None:
    journal = MemoryJournal()
    started = asyncio.Event()

    async def hang(request: ModelRequest) -> ModelReply:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    task = asyncio.create_task(Loop(FunctionModel(hang), journal=journal).run("g", run_id="c2"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    model = ScriptedModel([])
    r = await Loop(model, journal=journal).resume("c2")
    assert r.stop_reason == StopReason.cancelled and model.requests == []


async def test_a_sync_tool_in_flight_finishes_within_the_grace_and_its_step_is_kept() -> None:
    journal = RecordingJournal()
    entered, release = threading.Event(), threading.Event()
    tools = ToolRegistry()

    @tools.tool
    def slow_write() -> str:
        """A tool that takes a while."""
        entered.set()
        release.wait(5)
        return "written"

    loop = Loop(
        ScriptedModel([call("slow_write")]), tools=tools, journal=journal, cancel_grace_s=5.0
    )
    task = asyncio.create_task(loop.run("g", run_id="c3"))
    await asyncio.to_thread(entered.wait, 5)
    task.cancel()
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    records = journal.inner.records("c3")
    assert [r.kind for r in records[-3:]] == ["action_result", "step", "end"]
    result = next(r for r in records if isinstance(r, ActionResult))
    assert result.outcome.observation == "written"
    end = records[-1]
    assert isinstance(end, RunEnd) and end.stop_reason == StopReason.cancelled
    assert (end.steps_used, end.actions_executed) == (1, 1)


async def test_an_action_that_outlives_the_grace_is_named_in_the_stop_detail() -> None:
    journal = RecordingJournal()
    tools = ToolRegistry()
    entered = asyncio.Event()

    @tools.tool
    async def forever() -> str:
        """Never returns."""
        entered.set()
        await asyncio.sleep(3600)
        return "never"

    loop = Loop(ScriptedModel([call("forever")]), tools=tools, journal=journal, cancel_grace_s=0.05)
    task = asyncio.create_task(loop.run("g", run_id="c4"))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    end = journal.end("c4")
    assert end is not None and end.stop_reason == StopReason.cancelled
    assert "op_id=" in (end.stop_detail or "") and "tool=forever" in (end.stop_detail or "")
    assert "unknown" in (end.stop_detail or "")
    assert not any(isinstance(r, ActionResult) for r in journal.inner.records("c4"))


async def test_an_end_record_already_written_stands_on_cancellation() -> None:
    inner = MemoryJournal()
    landed = asyncio.Event()

    class SlowAfterEnd(RecordingJournal):
        async def append(self, lease: Any, records: Any) -> None:
            await super().append(lease, records)
            if any(isinstance(r, RunEnd) for r in records):
                landed.set()
                await asyncio.sleep(3600)  # cancelled here, after the end record landed

    journal = SlowAfterEnd(inner)
    task = asyncio.create_task(
        Loop(ScriptedModel(["answer"]), journal=journal).run("g", run_id="c5")
    )
    await landed.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ends = [r for r in inner.records("c5") if isinstance(r, RunEnd)]
    assert len(ends) == 1 and ends[0].stop_reason == StopReason.agent_finished


@pytest.mark.parametrize("late", ["fails", "lands"])
async def test_a_cancelled_end_record_not_durable_in_time_is_followed_to_its_end(
    late: str, caplog: pytest.LogCaptureFixture
) -> None:
    inner = MemoryJournal()
    started, disk_back = asyncio.Event(), asyncio.Event()

    class StuckEnd(RecordingJournal):
        async def append(self, lease: Any, records: Any) -> None:
            if not any(isinstance(r, RunEnd) for r in records):
                await super().append(lease, records)
            elif late == "fails":  # the disk hangs past the timeout, then fails the write
                await disk_back.wait()
                raise JournalError("the disk went away")
            else:  # the write lands, its acknowledgement comes past the timeout
                await super().append(lease, records)
                await disk_back.wait()

    async def hang(request: ModelRequest) -> ModelReply:
        started.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    loop = Loop(FunctionModel(hang), journal=StuckEnd(inner))
    # Not a Loop argument: how long cancellation waits for its end record (10 s by default).
    loop._kernel.cfg = dataclasses.replace(loop._kernel.cfg, end_write_timeout_s=0.05)
    task = asyncio.create_task(loop.run("g", run_id="c6"))
    await started.wait()
    t = time.monotonic()
    task.cancel()
    with caplog.at_level(logging.INFO, logger="polyloop"):
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t < 5  # the timeout, not the hung write, ended the wait
        assert "was not durable in time" in caplog.text
        disk_back.set()
        for _ in range(3):
            await asyncio.sleep(0)  # the stuck write ends now
    ends = [r for r in inner.records("c6") if isinstance(r, RunEnd)]
    model = ScriptedModel(["done after all"])
    r = await Loop(model, journal=inner).resume("c6")
    if late == "fails":  # no end record ever lands: the run stays resumable
        assert "late cancelled end record failed" in caplog.text
        assert "disk went away" in caplog.text and ends == []
        assert r.stop_reason == StopReason.agent_finished and r.final_answer == "done after all"
    else:  # it landed on its own: the run ended cancelled
        assert "late cancelled end record landed" in caplog.text
        assert [e.stop_reason for e in ends] == [StopReason.cancelled]
        assert r.stop_reason == StopReason.cancelled and model.requests == []


# --- §8 detaching and other exceptions ---------------------------------------------------------


async def test_detach_stops_at_the_next_step_boundary_without_an_end_record() -> None:
    journal = RecordingJournal()
    holder: dict[str, Loop] = {}

    def fn(request: ModelRequest) -> ModelReply:
        if request.step_idx == 1:
            assert holder["loop"].detach("d1") is True
        return call("noop") if request.step_idx < 4 else ModelReply("end")

    loop = Loop(FunctionModel(fn), tools=make_tools(), journal=journal)
    holder["loop"] = loop
    with pytest.raises(RunDetached, match="d1") as info:
        await loop.run("g", run_id="d1")
    assert info.value.steps_used == 2  # the step in progress finished first
    assert journal.end("d1") is None

    # The lease is released: another Loop can resume at once; detached again, resume raises
    # RunDetached too; a third execution finishes the run.
    def detach_at_3(request: ModelRequest) -> ModelReply:
        if request.step_idx == 3:
            assert holder["again"].detach("d1") is True
        return fn(request)

    holder["again"] = Loop(FunctionModel(detach_at_3), tools=make_tools(), journal=journal)
    with pytest.raises(RunDetached, match="d1") as info:
        await holder["again"].resume("d1")
    assert info.value.steps_used == 4 and journal.end("d1") is None
    r = await Loop(FunctionModel(fn), tools=make_tools(), journal=journal).resume("d1")
    assert r.stop_reason == StopReason.agent_finished and r.steps_used == 5
    assert [s.step_idx for s in r.steps] == [0, 1, 2, 3, 4]


async def test_detach_of_an_unknown_run_says_false() -> None:
    assert Loop(ScriptedModel([])).detach("nobody") is False


async def test_another_exception_propagates_with_no_end_record_and_the_run_resumes() -> None:
    journal = MemoryJournal()

    class BuggyInterpreter:
        def interpret(self, reply: ModelReply, tool_specs: Any) -> Any:
            raise KeyError("bug in my interpreter")

    with pytest.raises(KeyError, match="bug in my interpreter"):
        await Loop(ScriptedModel(["x"]), journal=journal, interpreter=BuggyInterpreter()).run(
            "g", run_id="e1"
        )
    assert not any(isinstance(r, RunEnd) for r in journal.records("e1"))
    model = ScriptedModel([])  # the stored reply is re-interpreted: no new model call
    r = await Loop(model, journal=journal).resume("e1")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "x"
    assert model.requests == []


# --- §9 results and events ---------------------------------------------------------------------


async def test_observers_receive_the_events_of_a_run_in_order() -> None:
    events: list[object] = []
    await Loop(
        ScriptedModel([call("noop"), "bye"]), tools=make_tools(), observers=[events.append]
    ).run("g")
    kinds = [type(e) for e in events]
    assert kinds == [
        RunStarted,
        ModelCallStarted,
        ModelCallFinished,
        ActionStarted,
        ActionFinished,
        StepAppended,
        ModelCallStarted,
        ModelCallFinished,
        StepAppended,
        RunEnded,
    ]
    started = events[3]
    finished = events[4]
    assert isinstance(started, ActionStarted) and isinstance(finished, ActionFinished)
    assert started.op_id == finished.op_id and started.tool_name == "noop"


async def test_an_observer_that_raises_is_logged_and_never_changes_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def bad(event: object) -> None:
        raise RuntimeError("observer bug")

    with caplog.at_level(logging.ERROR, logger="polyloop"):
        r = await Loop(
            ScriptedModel([call("noop"), "bye"]), tools=make_tools(), observers=[bad]
        ).run("g")
    assert r.stop_reason == StopReason.agent_finished and r.steps_used == 2
    assert "observer bug" in caplog.text


async def test_the_result_carries_counters_timestamps_usage_and_messages() -> None:
    from polyloop import Usage

    script = [
        ModelReply(tool_calls=call("noop").tool_calls, usage=Usage(10, 2)),
        ModelReply("done", usage=Usage(15, 3)),
    ]
    r = await Loop(ScriptedModel(script), tools=make_tools()).run("g")
    assert r.usage == Usage(25, 5) and r.usage.total_tokens == 30
    assert r.ended_at >= r.started_at
    assert r.messages[-1] == {"role": "assistant", "content": "done"}
    assert r.pending_action is None


async def test_a_live_run_renews_its_lease_every_third_of_its_duration() -> None:
    renewals: list[float] = []

    class Counting(RecordingJournal):
        async def renew(self, lease: Any, *, ttl_s: float) -> Any:
            renewals.append(ttl_s)
            return await super().renew(lease, ttl_s=ttl_s)

    async def slow(request: ModelRequest) -> ModelReply:
        await asyncio.sleep(0.35)  # a slow model call: about three heartbeats at ttl 0.3 s
        return ModelReply("done")

    r = await Loop(FunctionModel(slow), journal=Counting(), lease_ttl_s=0.3).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert len(renewals) >= 2 and set(renewals) == {0.3}
    seen = len(renewals)
    await asyncio.sleep(0.25)  # more than a heartbeat period: an ended run renews nothing
    assert len(renewals) == seen


async def test_no_action_starts_with_less_than_a_third_of_the_lease_left() -> None:
    """durability.md, leases: a run whose lease is about to run out renews it before the
    environment is called, not only on the heartbeat."""
    renewals: list[float] = []
    seen_at_call: list[int] = []

    class Expiring(RecordingJournal):
        async def create(self, spec: Any, *, ttl_s: float) -> Any:
            lease = await super().create(spec, ttl_s=ttl_s)
            return Lease(lease.run_id, lease.owner, time.time() + 1.0)  # 1 s of 30 left

        async def renew(self, lease: Any, *, ttl_s: float) -> Any:
            renewals.append(ttl_s)
            return await super().renew(lease, ttl_s=ttl_s)

    tools = ToolRegistry()

    @tools.tool
    def probe() -> str:
        """Note how many renewals happened before this action."""
        seen_at_call.append(len(renewals))
        return "ok"

    loop = Loop(ScriptedModel([call("probe"), "done"]), tools=tools, journal=Expiring())
    r = await loop.run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert seen_at_call == [1] and renewals == [30.0]


# -- what is not a cancellation of the run ---------------------------------------------------


def _fetch_then_answer(request: ModelRequest) -> ModelReply:
    return call("fetch") if request.step_idx == 0 else ModelReply("done")


async def _run_to_end(tools: ToolRegistry, environment: Any = None) -> tuple[Any, list[RunEnd]]:
    """Run the script; the run's result (or the CancelledError it raised) and its end records."""
    journal = MemoryJournal()
    loop = Loop(
        FunctionModel(_fetch_then_answer),
        tools=tools if environment is None else None,
        environment=environment,
        journal=journal,
        cancel_grace_s=1.0,
    )
    try:
        outcome: Any = await asyncio.ensure_future(loop.run("g", run_id="t"))
    except asyncio.CancelledError as exc:  # nobody cancelled the caller
        outcome = exc
    return outcome, [x for x in journal.records("t") if isinstance(x, RunEnd)]


async def test_a_tools_own_timeout_before_its_first_await_stays_in_the_tool() -> None:
    """What ``asyncio.timeout`` or a TaskGroup takes as the current task, on a tool's first
    line, is the action's task: its timeout ends the tool, not the run."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def fetch() -> str:
        """A slow fetch with its own 50 ms timeout."""
        async with asyncio.timeout(0.05):
            await asyncio.sleep(5)
        return "fetched"

    result, ends = await _run_to_end(tools)
    assert [e.stop_reason for e in ends] == [StopReason.agent_finished]
    assert result.steps[0].action_status is ActionStatus.executed
    assert "TimeoutError" in result.steps[0].observation


async def test_a_tools_task_group_whose_child_fails_fails_the_tool_not_the_run() -> None:
    tools = ToolRegistry()

    async def bad() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("child failed")

    @tools.tool(replay="idempotent")
    async def fetch() -> str:
        """Fan out; one child fails."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(bad())
            tg.create_task(asyncio.sleep(5))
        return "fetched"

    result, ends = await _run_to_end(tools)
    assert [e.stop_reason for e in ends] == [StopReason.agent_finished]
    assert "ExceptionGroup" in result.steps[0].observation


async def test_a_cancelled_error_a_tool_raises_itself_is_a_failed_step_not_a_cancellation() -> None:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def fetch() -> str:
        """Await a shared future that another component cancels."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, fut.cancel)
        return await fut

    result, ends = await _run_to_end(tools)
    assert [e.stop_reason for e in ends] == [StopReason.agent_finished]
    assert result.steps[0].action_status is ActionStatus.executed
    assert "CancelledError" in result.steps[0].observation


async def test_an_environment_call_that_cancels_itself_is_an_environment_error() -> None:
    """Any Environment, not only ToolEnvironment: the run was not cancelled, so the stop
    reason is ``env_error`` with the cause, never ``cancelled``."""

    class SelfCancelling(ToolEnvironment):
        async def execute(self, action: Any, ctx: Any) -> Any:
            fut = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(fut.cancel)
            return await fut

    result, ends = await _run_to_end(ToolRegistry(), SelfCancelling(ToolRegistry()))
    assert [e.stop_reason for e in ends] == [StopReason.env_error]
    assert result.stop_reason is StopReason.env_error
    assert "cancelled from within" in (result.stop_detail or "")
    step = result.steps[0]
    assert step.action_status is ActionStatus.env_error
    assert step.observation_synthetic and not step.completed


async def test_an_empty_registry_given_to_a_loop_is_the_one_it_uses() -> None:
    """Tools registered on it after the Loop was made are seen (an empty registry is falsy:
    it used to be replaced by a new one)."""
    tools = ToolRegistry()
    loop = Loop(FunctionModel(_fetch_then_answer), tools=tools)

    @tools.tool
    def fetch() -> str:
        """Registered after the Loop was made."""
        return "fetched"

    result = await loop.run("g")
    assert result.steps[0].action_status is ActionStatus.executed
    assert result.steps[0].observation == "fetched"
