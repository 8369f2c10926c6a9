"""durability.md "Resume": every journal state, against the in-memory journal.

The states are produced the honest way: by crashing a real run just before or just after one
of its journal writes (``Crash`` is a BaseException, like the process dying), then resuming
with a fresh ``Loop`` on the same journal.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import pytest

from polyloop import (
    Complete,
    GuardContext,
    JournalError,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    Outcome,
    OutcomeUnknown,
    ReplayPolicy,
    RunEndGuard,
    RunLeased,
    RunNotFound,
    StepRecord,
    StopReason,
    ToolContext,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import (
    ActionIntent,
    ActionStatus,
    LimitsChanged,
    ModelIntent,
    ModelRequest,
    ModelResult,
    RunEnd,
    StepWritten,
)
from tests.conftest import Crash, RecordingJournal, call, first_write


class World:
    """Side effects outside the run, which survive its crash."""

    def __init__(self) -> None:
        self.charged: list[str] = []  # a never-replay tool's effect
        self.stored: list[str] = []  # op_ids an idempotent tool saw
        self.reconciled: list[str] = []
        self.reconcile_answer: Any = None

    def tools(self, *, with_charge: bool = True) -> ToolRegistry:
        tools = ToolRegistry()

        @tools.tool(replay="idempotent")
        def store(key: str, ctx: ToolContext) -> str:
            """Upsert a record; ctx.op_id is the idempotency key."""
            self.stored.append(ctx.op_id)
            return f"stored {key}"

        if with_charge:

            @tools.tool  # replay="never"
            def charge(amount: int) -> str:
                """Charge a card: must never happen twice."""
                self.charged.append(str(amount))
                return f"charged {amount}"

        def hook(op_id: str, arguments: dict[str, Any]) -> Outcome | None:
            self.reconciled.append(op_id)
            if isinstance(self.reconcile_answer, Exception):
                raise self.reconcile_answer
            return self.reconcile_answer

        @tools.tool(replay="reconcile", reconcile=hook)
        def send(to: str) -> str:
            """Send a message (the mail server can tell whether op_id was sent)."""
            return f"sent to {to}"

        @tools.tool(completion_marker=True)
        def submit(answer: str) -> str:
            """Submit the final answer."""
            return "accepted"

        return tools


def script(request: ModelRequest) -> ModelReply:
    """Keyed by step and attempt, so a resumed run gets the same replies."""
    match request.step_idx:
        case 0:
            return call("store", {"key": "a"})
        case 1:
            return ModelReply("")  # an invalid decision
        case 2:
            if request.attempt == 1:
                raise ModelCallError("rate limited", retryable=True, kind="rate_limit")
            return call("charge", {"amount": 5})
        case 3:
            return call("store", {"key": "b"})
        case 4:
            return call("nope")  # unknown tool: not executed
        case _:
            return call("submit", {"answer": "ok"})


def new_loop(world: World, journal: Any, **kw: Any) -> Loop:
    return Loop(
        FunctionModel(script), tools=world.tools(), journal=journal, clock=FakeClock(), **kw
    )


def comparable(step: StepRecord) -> StepRecord:
    """Equal across two runs except timings and ids drawn per run (intent ids)."""
    call_id = None if step.llm_call_id is None else "id"
    return replace(step, step_wall_ms=0.0, llm_call_id=call_id)


async def reference() -> tuple[RecordingJournal, Any]:
    journal = RecordingJournal()
    result = await new_loop(World(), journal).run("pay", run_id="r")
    return journal, result


async def test_reference_run_shape() -> None:
    journal, r = await reference()
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 6
    # Six steps: the model result in one write with what acts on it (action intent or step);
    # a step that does not end the run in one write with the next step's first model intent
    # (only the first step's intent, and the retried attempt's, are written alone).
    assert journal.count == len(journal.appends) == 14
    assert journal.kinds() == [
        ["model_intent"],
        ["model_result", "action_intent"],
        ["action_result", "step", "model_intent"],
        ["model_result", "step", "model_intent"],
        ["model_attempt_failed"],
        ["model_intent"],
        ["model_result", "action_intent"],
        ["action_result", "step", "model_intent"],
        ["model_result", "action_intent"],
        ["action_result", "step", "model_intent"],
        ["model_result", "action_intent"],
        ["action_result", "step", "model_intent"],
        ["model_result", "action_intent"],
        ["action_result", "step", "end"],
    ]


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_around_any_write_resumes_to_the_same_run_or_says_it_cannot(
    after: bool,
) -> None:
    ref_journal, ref = await reference()
    total = ref_journal.count
    never_intents = {
        i: batch[-1]
        for i, batch in enumerate(ref_journal.appends, start=1)
        if isinstance(batch[-1], ActionIntent) and batch[-1].replay_policy == ReplayPolicy.never
    }
    assert {i.action.tool_name for i in never_intents.values()} == {"charge", "submit"}
    for n in range(1, total + 1):
        world = World()
        inner = MemoryJournal()
        with pytest.raises(Crash):
            await new_loop(world, RecordingJournal(inner, crash_at=n, crash_after=after)).run(
                "pay", run_id="r"
            )
        r = await new_loop(world, inner).resume("r")
        ends = [x for x in inner.records("r") if isinstance(x, RunEnd)]
        assert len(ends) == 1, n
        assert len(world.charged) <= 1, f"charged twice after a crash at write {n}"
        if len(world.stored) > 2:
            assert len(set(world.stored)) == 2, "an idempotent replay reuses its op_id"
        # The intent of the never-replay tool is durable but its result is not: unknown.
        unknown = never_intents.get(n if after else n - 1)
        if unknown is not None:
            assert r.stop_reason == StopReason.resume_state_unknown, n
            p = r.pending_action
            assert p is not None and p.tool_name == unknown.action.tool_name
            assert p.replay_policy == ReplayPolicy.never and p.step_idx == unknown.step_idx
            assert f"tool={p.tool_name}" in (r.stop_detail or "")
            assert "policy=never" in (r.stop_detail or "")
            k = unknown.step_idx
            assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]]
            continue
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert (r.steps_used, r.actions_executed) == (ref.steps_used, ref.actions_executed)
        assert world.charged == ["5"], n
        assert r.messages == ref.messages, n  # the context is rebuilt byte-identical


async def crash_at_kind(
    kind: str, tool: str | None = None, *, after: bool, world: World | None = None
) -> tuple[World, MemoryJournal]:
    """Crash a fresh run around its first write holding a record of ``kind`` (for an action
    intent, of ``tool``)."""
    ref_journal, _ = await reference()
    n = first_write(ref_journal, kind, tool)
    world = world or World()
    inner = MemoryJournal()
    with pytest.raises(Crash):
        await new_loop(world, RecordingJournal(inner, crash_at=n, crash_after=after)).run(
            "pay", run_id="r"
        )
    return world, inner


class CountingModel(FunctionModel):
    def __init__(self) -> None:
        super().__init__(script)


async def test_resume_of_an_ended_run_makes_no_model_or_environment_call() -> None:
    journal = MemoryJournal()
    world = World()
    first = await new_loop(world, journal).run("pay", run_id="r")
    model = CountingModel()
    calls_before = (list(world.charged), list(world.stored))
    r = await Loop(model, tools=world.tools(), journal=journal).resume("r")
    assert model.requests == [] and (world.charged, world.stored) == calls_before
    assert r.stop_reason == first.stop_reason and r.steps == first.steps
    assert r.messages == first.messages


async def test_resume_after_a_complete_step_continues_at_the_budget_check() -> None:
    world, journal = await crash_at_kind("model_intent", after=False)  # the very first write
    model = CountingModel()
    r = await Loop(model, tools=world.tools(), journal=journal).resume("r")
    assert r.stop_reason == StopReason.task_completed and r.steps_used == 6


async def test_resume_of_a_model_intent_without_result_calls_again_with_the_same_intent() -> None:
    world, journal = await crash_at_kind("model_intent", after=True)
    intent = next(x for x in journal.records("r") if isinstance(x, ModelIntent))
    model = CountingModel()
    await Loop(model, tools=world.tools(), journal=journal).resume("r")
    assert model.requests[0].attempt == 2 and model.requests[0].step_idx == 0
    again = [x for x in journal.records("r") if isinstance(x, ModelIntent) and x.step_idx == 0]
    assert [(x.intent_id, x.attempt) for x in again] == [
        (intent.intent_id, 1),
        (intent.intent_id, 2),
    ]


async def test_resume_of_a_model_failure_without_its_step_ends_llm_error_without_a_call() -> None:
    journal = MemoryJournal()

    def fail(request: ModelRequest) -> ModelReply:
        raise ModelCallError("invalid api key", kind="auth")

    inner = RecordingJournal(journal, crash_at=2, crash_after=True)  # after model_failure
    with pytest.raises(Crash):
        await Loop(FunctionModel(fail), journal=inner).run("g", run_id="f")
    model = CountingModel()
    r = await Loop(model, journal=journal).resume("f")
    assert model.requests == []
    assert r.stop_reason == StopReason.llm_error and r.steps[0].llm_call_id is None
    assert r.stop_detail == (
        "ModelCallError: invalid api key [kind=auth, retryable=False, attempts=1]"
    )


async def test_resume_of_a_model_result_without_a_step_reinterprets_without_a_call() -> None:
    """A final answer checked by a run-end guard: the model result is written alone before
    the guard runs (a guard may take long), so a crash then leaves a result without a step."""
    checked: list[str] = []

    def fine(ctx: GuardContext) -> Complete:
        checked.append(ctx.final_answer)
        return Complete()

    journal = MemoryJournal()
    rec = RecordingJournal(journal, crash_at=2, crash_after=True)  # after the model result
    with pytest.raises(Crash):
        await Loop(
            ScriptedModel(["the stored answer"]), journal=rec, guards=[RunEndGuard(fine)]
        ).run("g", run_id="m")
    assert rec.kinds() == [["model_intent"], ["model_result"]] and checked == []
    model = FunctionModel(lambda request: ModelReply("a DIFFERENT answer"))
    r = await Loop(model, journal=journal, guards=[RunEndGuard(fine)]).resume("m")
    assert model.requests == []  # the reply came from the journal
    assert r.final_answer == "the stored answer" and checked == ["the stored answer"]


async def test_an_interpreter_that_raises_leaves_the_model_result_in_the_journal() -> None:
    class Broken:
        def interpret(self, reply: ModelReply, tool_specs: Any) -> Any:
            raise RuntimeError("interpreter bug")

    journal = RecordingJournal()
    loop = Loop(ScriptedModel(["hello"]), journal=journal, interpreter=Broken())
    with pytest.raises(RuntimeError, match="interpreter bug"):
        await loop.run("g", run_id="b")
    assert journal.kinds() == [["model_intent"], ["model_result"]]


async def test_an_interpreter_returning_no_decision_fails_after_writing_the_model_result() -> None:
    class Odd:
        def interpret(self, reply: ModelReply, tool_specs: Any) -> Any:
            return "not a decision"

    journal = RecordingJournal()
    loop = Loop(ScriptedModel(["hello"]), journal=journal, interpreter=Odd())
    with pytest.raises(TypeError, match="not a Decision"):
        await loop.run("g", run_id="b")
    assert journal.kinds() == [["model_intent"], ["model_result"]]


async def test_resume_of_a_never_replay_intent_is_resume_state_unknown() -> None:
    world, journal = await crash_at_kind("action_intent", "charge", after=True)
    r = await new_loop(world, journal).resume("r")
    assert r.stop_reason == StopReason.resume_state_unknown
    assert world.charged == []
    p = r.pending_action
    assert p is not None and p.tool_name == "charge" and p.args_json == '{"amount":5}'
    assert r.stop_detail == f'op_id={p.op_id} tool=charge args={{"amount":5}} policy=never'
    assert r.steps_used == 2  # the unresolved action has no step


async def test_resume_of_an_idempotent_intent_executes_again_with_the_same_op_id() -> None:
    world, journal = await crash_at_kind("action_intent", "store", after=True)
    intent = next(x for x in journal.records("r") if isinstance(x, ActionIntent))
    assert world.stored == []  # crashed before the call
    r = await new_loop(world, journal).resume("r")
    assert world.stored[0] == intent.op_id
    assert r.stop_reason == StopReason.task_completed


@pytest.mark.parametrize("answer", ["happened", "did_not", "unknown"])
async def test_resume_of_a_reconcile_intent_asks_the_environment(answer: str) -> None:
    world = World()
    world_tools = world.tools

    def script_send(request: ModelRequest) -> ModelReply:
        return call("send", {"to": "bob"}) if request.step_idx == 0 else ModelReply("done")

    inner = MemoryJournal()
    with pytest.raises(Crash):
        await Loop(
            FunctionModel(script_send),
            tools=world_tools(),
            journal=RecordingJournal(inner, crash_at=2, crash_after=True),
        ).run("mail", run_id="m")  # write 2 is the model result with the action intent
    intent = [x for x in inner.records("m") if isinstance(x, ActionIntent)][-1]
    world.reconcile_answer = {
        "happened": Outcome(ActionStatus.executed, "sent earlier"),
        "did_not": None,
        "unknown": OutcomeUnknown("mail server does not know"),
    }[answer]
    r = await Loop(FunctionModel(script_send), tools=world_tools(), journal=inner).resume("m")
    assert world.reconciled == [intent.op_id]
    if answer == "happened":
        assert r.steps[0].observation == "sent earlier"
    elif answer == "did_not":
        assert r.steps[0].observation == "sent to bob"
    else:
        assert r.stop_reason == StopReason.resume_state_unknown
        assert "policy=reconcile" in (r.stop_detail or "")


async def test_resume_of_an_action_result_without_its_step_builds_it_without_rerunning() -> None:
    journal = MemoryJournal()
    world = World()

    class ResultThenCrash(RecordingJournal):
        async def append(self, lease: Any, records: Any) -> None:
            # Persist the action result alone, then die before the step is written.
            if records and records[0].kind == "action_result":
                await self.inner.append(lease, records[:1])
                raise Crash("between result and step")
            await super().append(lease, records)

    with pytest.raises(Crash):
        await new_loop(world, ResultThenCrash(journal)).run("pay", run_id="r")
    assert world.stored == [world.stored[0]]
    r = await new_loop(world, journal).resume("r")
    assert len(world.stored) == 2  # step 0 not executed again; step 3 ran once
    assert r.steps[0].observation == "stored a"
    assert r.stop_reason == StopReason.task_completed


async def test_a_tool_known_then_but_gone_at_resume_is_treated_as_never() -> None:
    world, journal = await crash_at_kind("action_intent", "store", after=True)
    tools = ToolRegistry()

    @tools.tool
    def other() -> str:
        """Something else."""
        return "x"

    r = await Loop(FunctionModel(script), tools=tools, journal=journal).resume("r")
    assert r.stop_reason == StopReason.resume_state_unknown
    assert world.stored == [] and "policy=never" in (r.stop_detail or "")


async def test_resume_limits_override_applies_and_is_journaled() -> None:
    world, journal = await crash_at_kind("model_intent", after=False)
    r = await new_loop(world, journal).resume("r", limits=Limits(max_steps=2))
    assert r.stop_reason == StopReason.step_budget and r.steps_used == 2
    changed = [x for x in journal.records("r") if isinstance(x, LimitsChanged)]
    assert changed == [LimitsChanged(Limits(max_steps=2))]


async def test_resume_rebuilds_counters_including_consecutive_invalid() -> None:
    def invalid_twice(request: ModelRequest) -> ModelReply:
        return ModelReply("") if request.step_idx < 5 else ModelReply("fin")

    journal = MemoryJournal()
    # An invalid step is one write (the result with the step and the next step's intent),
    # after the first step's intent written alone: crash after step 1's step.
    rec = RecordingJournal(journal, crash_at=3, crash_after=True)
    with pytest.raises(Crash):
        await Loop(
            FunctionModel(invalid_twice), journal=rec, limits=Limits(max_consecutive_invalid=3)
        ).run("g", run_id="i")
    assert [s.step_idx for s in rec.steps("i")] == [0, 1]
    r = await Loop(FunctionModel(invalid_twice), journal=journal).resume("i")
    assert r.stop_reason == StopReason.parse_failed_repeatedly and r.steps_used == 3


async def test_resume_of_a_run_with_a_live_lease_fails_fast_and_writes_nothing() -> None:
    journal = MemoryJournal()
    spec_loop = new_loop(World(), journal)
    # Hold the lease as a live execution would (another Loop in this process).
    from polyloop.types import RunSpec

    lease = await journal.create(RunSpec("held", "g", Limits(), 0.0), ttl_s=60)
    with pytest.raises(RunLeased) as info:
        await spec_loop.resume("held")
    assert info.value.owner == lease.owner and journal.records("held") == ()


async def test_resume_of_an_unknown_run_raises_run_not_found() -> None:
    with pytest.raises(RunNotFound, match="ghost"):
        await new_loop(World(), MemoryJournal()).resume("ghost")


async def test_out_of_order_records_fail_clearly_and_are_not_modified() -> None:
    world, journal = await crash_at_kind("action_intent", "charge", after=False)
    records = journal._runs["r"].records  # damage the journal: drop a step record
    idx = next(i for i, x in enumerate(records) if isinstance(x, StepWritten))
    del records[idx]
    before = list(records)
    with pytest.raises(JournalError, match="out of order"):
        await new_loop(world, journal).resume("r")
    assert list(journal.records("r")) == before


async def test_a_model_result_record_keeps_the_reply_for_the_accounts() -> None:
    journal = MemoryJournal()
    await new_loop(World(), journal).run("pay", run_id="r")
    results = [x for x in journal.records("r") if isinstance(x, ModelResult)]
    assert [x.step_idx for x in results] == [0, 1, 2, 3, 4, 5]
    assert results[2].attempt == 2  # the first attempt of step 2 was retried


async def test_a_journal_damaged_out_of_order_is_not_leased_or_written() -> None:
    world, journal = await crash_at_kind("action_intent", "charge", after=False)
    run = journal._runs["r"]
    records = run.records
    i = next(k for k, x in enumerate(records) if isinstance(x, StepWritten))
    records[i], records[i + 1] = records[i + 1], records[i]  # swap a step and the next record
    owner, expiry = run.owner, run.expires_at
    with pytest.raises(JournalError):
        await new_loop(world, journal).resume("r")
    assert (run.owner, run.expires_at) == (owner, expiry)  # no lease was taken


async def test_a_tool_unknown_then_but_registered_at_resume_is_not_executed() -> None:
    """The intent of an unknown tool was replay 'idempotent' because doing it again only says
    not_executed again; a tool registered under that name since must not run as its replay."""
    world, journal = await crash_at_kind("action_intent", "nope", after=True)
    intent = [x for x in journal.records("r") if isinstance(x, ActionIntent)][-1]
    assert not intent.known_tool and intent.replay_policy is ReplayPolicy.idempotent
    tools = world.tools()
    ran: list[str] = []

    @tools.tool  # replay="never"
    def nope() -> str:
        """Registered after the crash."""
        ran.append("nope")
        return "ran"

    r = await Loop(FunctionModel(script), tools=tools, journal=journal).resume("r")
    assert ran == []
    step = r.steps[intent.step_idx]
    assert step.action_status is ActionStatus.not_executed and step.observation_synthetic
    assert "not registered when this action was decided" in (step.observation or "")
    assert r.stop_reason == StopReason.task_completed  # and the run went on as before


async def test_a_reconciled_completion_marker_completes_the_task_as_the_call_would() -> None:
    ran: list[str] = []

    def hook(op_id: str, arguments: dict[str, Any]) -> Outcome | None:
        return Outcome(ActionStatus.executed, "accepted") if ran else None

    def tools() -> ToolRegistry:
        reg = ToolRegistry()

        @reg.tool(replay="reconcile", reconcile=hook, completion_marker=True)
        def grade(answer: str) -> str:
            """Submit for grading (the grader can tell whether op_id was submitted)."""
            ran.append(answer)
            return "accepted"

        return reg

    def script_grade(request: ModelRequest) -> ModelReply:
        return call("grade", {"answer": "42"}) if request.step_idx == 0 else ModelReply("done")

    class CrashAfterTheTool(RecordingJournal):
        async def append(self, lease: Any, records: Any) -> None:
            if records and records[0].kind == "action_result":
                raise Crash("died after the tool ran, before its result was durable")
            await super().append(lease, records)

    reference = await Loop(FunctionModel(script_grade), tools=tools()).run("g")
    ran.clear()
    inner = MemoryJournal()
    with pytest.raises(Crash):
        await Loop(
            FunctionModel(script_grade), tools=tools(), journal=CrashAfterTheTool(inner)
        ).run("g", run_id="r")
    assert ran == ["42"]
    r = await Loop(FunctionModel(script_grade), tools=tools(), journal=inner).resume("r")
    assert ran == ["42"]  # reconciled, not run again
    assert reference.stop_reason is r.stop_reason is StopReason.task_completed
    assert r.steps_used == reference.steps_used == 1


async def test_cancelling_a_resume_while_it_reconciles_names_the_unresolved_action() -> None:
    entered, gate = asyncio.Event(), asyncio.Event()

    async def slow_hook(op_id: str, arguments: dict[str, Any]) -> Outcome | None:
        entered.set()
        await gate.wait()  # the mail server is slow to answer
        return None

    def tools() -> ToolRegistry:
        reg = ToolRegistry()

        @reg.tool(replay="reconcile", reconcile=slow_hook)
        def send(to: str) -> str:
            """Send a message."""
            return f"sent to {to}"

        return reg

    def script_send(request: ModelRequest) -> ModelReply:
        return call("send", {"to": "bob"}) if request.step_idx == 0 else ModelReply("done")

    inner = MemoryJournal()
    with pytest.raises(Crash):  # write 2 is the model result with the action intent
        await Loop(
            FunctionModel(script_send),
            tools=tools(),
            journal=RecordingJournal(inner, crash_at=2, crash_after=True),
        ).run("mail", run_id="m")
    intent = [x for x in inner.records("m") if isinstance(x, ActionIntent)][-1]
    loop = Loop(FunctionModel(script_send), tools=tools(), journal=inner, cancel_grace_s=0.05)
    task = asyncio.ensure_future(loop.resume("m"))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    ends = [x for x in inner.records("m") if isinstance(x, RunEnd)]
    assert [e.stop_reason for e in ends] == [StopReason.cancelled]
    detail = ends[0].stop_detail or ""
    assert intent.op_id in detail and "outcome unknown" in detail


async def test_a_never_tool_registered_during_the_run_is_never_replayed_as_unknown() -> None:
    """The kernel's tool list is taken when the run starts; the environment's registry is
    live. A tool registered during the run runs (the environment knows it, with its own
    policy) though the intent says ``known_tool=False``: after a crash its policy decides."""
    charged: list[str] = []
    reg = ToolRegistry()

    def register_charge() -> None:
        @reg.tool  # replay="never"
        def charge(amount: int) -> str:
            """Charge a card."""
            charged.append(str(amount))
            return f"charged {amount}"

    def script_charge(request: ModelRequest) -> ModelReply:
        if request.step_idx == 0:
            register_charge()  # a plugin loaded while the run goes on
            return call("charge", {"amount": 5})
        return ModelReply("done")

    class CrashAfterTheTool(RecordingJournal):
        async def append(self, lease: Any, records: Any) -> None:
            if records and records[0].kind == "action_result":
                raise Crash("died after the tool ran, before its result was durable")
            await super().append(lease, records)

    inner = MemoryJournal()
    with pytest.raises(Crash):
        await Loop(FunctionModel(script_charge), tools=reg, journal=CrashAfterTheTool(inner)).run(
            "pay", run_id="r"
        )
    intent = [x for x in inner.records("r") if isinstance(x, ActionIntent)][-1]
    assert charged == ["5"] and not intent.known_tool
    assert intent.replay_policy is ReplayPolicy.never
    r = await Loop(FunctionModel(script_charge), tools=reg, journal=inner).resume("r")
    assert r.stop_reason is StopReason.resume_state_unknown and charged == ["5"]


def test_a_process_stopping_in_a_tool_leaves_the_run_resumable() -> None:
    """A tool raising SystemExit (or KeyboardInterrupt): asyncio lets it out of the event
    loop, whose shutdown cancels the run; nobody cancelled the run itself, so no end record is
    written and the run resumes later."""
    journal = MemoryJournal()
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def boom(x: int) -> str:
        """Stop the process."""
        raise SystemExit(3)

    def script_boom(request: ModelRequest) -> ModelReply:
        return call("boom", {"x": 1}) if request.step_idx == 0 else ModelReply("done")

    raised: list[BaseException] = []

    def process() -> None:  # an asyncio.run of its own, as a program's main would be
        try:
            asyncio.run(Loop(FunctionModel(script_boom), tools=tools, journal=journal).run(
                "g", run_id="r"))  # fmt: skip
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=process)
    worker.start()
    worker.join(30)
    assert [type(e) for e in raised] == [SystemExit]
    assert not [x for x in journal.records("r") if isinstance(x, RunEnd)]
    fixed = ToolRegistry()

    @fixed.tool(name="boom", replay="idempotent")
    async def boom_fixed(x: int) -> str:
        """Fixed."""
        return "ok"

    loop = Loop(FunctionModel(script_boom), tools=fixed, journal=journal)
    r = asyncio.run(loop.resume("r"))  # the idempotent action runs again
    assert r.stop_reason is StopReason.agent_finished
    assert r.steps[0].observation == "ok"


async def test_resume_with_another_system_prompt_than_the_history_says_which_builder_to_use() -> (
    None
):
    from polyloop.context import ChatContextBuilder

    journal = MemoryJournal()
    history = [{"role": "system", "content": "You are the planner."}]
    first = Loop(ScriptedModel(["done"]), journal=journal)
    result = await first.run("g", run_id="r", history=history)
    assert result.stop_reason == StopReason.agent_finished
    other = Loop(
        ScriptedModel([]), journal=journal, context=ChatContextBuilder(system_prompt="Other.")
    )
    with pytest.raises(JournalError, match=r"context builder \(and system prompt\) it was started"):
        await other.resume("r")
    again = await Loop(ScriptedModel([]), journal=journal).resume("r")
    assert again.stop_reason == StopReason.agent_finished
