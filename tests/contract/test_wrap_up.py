"""Loop(wrap_up=True): when a budget ends a run, one more model call with tools withheld asks
for the best final answer; the stop reason stays the budget's, the step says wrap_up, nothing
is executed, and a crash anywhere around it resumes into the same end."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from polyloop import (
    FallbackModel,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    Pricing,
    RetryPolicy,
    StopReason,
    ToolRegistry,
)
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import DEFAULT_TEMPLATES, ModelIntent, ModelRequest, Usage
from tests.conftest import Crash, RecordingJournal, call, make_tools, prompt_size

WRAP = DEFAULT_TEMPLATES.wrap_up.format(budget="step budget")


def loop_of(model: ScriptedModel, journal: object, log: list[str] | None = None, **kw: object):  # type: ignore[no-untyped-def]
    kw.setdefault("limits", Limits(max_steps=2))
    kw.setdefault("clock", FakeClock())
    return Loop(
        model,
        tools=make_tools(log),
        journal=journal,
        wrap_up=True,
        **kw,  # type: ignore[arg-type]
    )


async def test_a_spent_step_budget_gets_one_tool_free_call_and_its_answer() -> None:
    model = ScriptedModel([call("noop"), call("noop"), "The answer is 42."])
    r = await loop_of(model, RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.step_budget  # the budget's, as without wrap-up
    assert r.final_answer == "The answer is 42."
    assert r.steps_used == 3 and [s.wrap_up for s in r.steps] == [False, False, True]
    last = model.requests[-1]
    # The tools are withheld by the tool choice, not by leaving out their definitions.
    assert last.tool_choice == "none" and last.tool_specs == model.requests[0].tool_specs
    assert last.tool_specs and model.requests[0].tool_choice is None
    assert last.messages[-1] == {"role": "user", "content": WRAP}
    # The second noop turn (its call and its result), then the ask.
    assert len(last.messages) == len(model.requests[-2].messages) + 3
    # prompt_chars is what was sent, for the wrap-up step too (kernel.md §7, from scratch).
    assert [s.prompt_chars for s in r.steps] == [prompt_size(q) for q in model.requests]
    assert r.messages[-1] == {"role": "assistant", "content": "The answer is 42."}


async def test_every_budget_wraps_up_and_names_itself_in_the_message() -> None:
    reply = ModelReply(tool_calls=call("noop").tool_calls, usage=Usage(10, 10))
    model = ScriptedModel([reply, "best guess"])
    r = await loop_of(model, RecordingJournal(), limits=Limits(max_tokens=20)).run("go")
    assert r.stop_reason == StopReason.token_budget and r.final_answer == "best guess"
    assert "token budget" in model.requests[-1].messages[-1]["content"]
    model = ScriptedModel([call("noop"), "after one action"])
    r = await loop_of(model, RecordingJournal(), limits=Limits(max_actions=1)).run("go")
    assert r.stop_reason == StopReason.action_budget and r.final_answer == "after one action"


async def test_a_wrap_up_reply_that_calls_a_tool_executes_nothing() -> None:
    log: list[str] = []
    model = ScriptedModel([call("noop"), call("noop"), call("noop")])
    r = await loop_of(model, RecordingJournal(), log).run("go")
    assert r.stop_reason == StopReason.step_budget and r.final_answer is None
    assert log == ["noop", "noop"] and r.actions_executed == 2
    last = r.steps[-1]
    assert last.wrap_up and last.action_status == "not_executed" and last.observation_synthetic
    assert last.observation == DEFAULT_TEMPLATES.wrap_up_no_action.format(budget="step budget")


async def test_a_failed_wrap_up_call_keeps_the_budgets_stop_and_says_why() -> None:
    bad = ModelCallError("bad key", kind="auth")
    model = ScriptedModel([call("noop"), call("noop"), bad])
    r = await loop_of(model, RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.step_budget and r.final_answer is None
    assert r.stop_detail == (
        "the wrap-up call failed: ModelCallError: bad key [kind=auth, retryable=False, attempts=1]"
    )
    assert r.steps[-1].wrap_up and r.steps[-1].llm_call_id is None


async def test_off_by_default_and_never_after_a_completion() -> None:
    model = ScriptedModel([call("noop"), call("noop"), "unused"])
    r = await Loop(model, tools=make_tools(), limits=Limits(max_steps=2)).run("go")
    assert r.stop_reason == StopReason.step_budget and model.remaining == 1
    model = ScriptedModel([call("noop"), call("done", {"answer": "x"}), "unused"])
    r = await loop_of(model, RecordingJournal()).run("go")
    assert r.stop_reason == StopReason.task_completed and model.remaining == 1


async def test_no_wrap_up_when_its_message_would_overflow_the_prompt_limit() -> None:
    model = ScriptedModel([call("noop"), "unused"])
    first = ScriptedModel([call("noop")])
    r0 = await Loop(first, tools=make_tools(), limits=Limits(max_steps=1)).run("go")
    room = r0.steps[0].prompt_chars + 50  # enough for the first step, not for the ask
    limits = Limits(max_steps=1, max_prompt_chars=room)
    r = await loop_of(model, RecordingJournal(), limits=limits).run("go")
    assert r.stop_reason == StopReason.step_budget and model.remaining == 1


def writes(journal: RecordingJournal) -> list[tuple[str, ...]]:
    return [tuple(r.kind for r in batch) for batch in journal.appends]


async def wrap_up_writes() -> tuple[int, int]:
    """(the wrap-up intent's write, the write after it) in an undisturbed run."""
    ref = RecordingJournal()
    await loop_of(ScriptedModel([call("noop"), call("noop"), "42"]), ref).run("go", run_id="r")
    for n, batch in enumerate(ref.appends, start=1):
        if any(isinstance(r, ModelIntent) and r.wrap_up is not None for r in batch):
            return n, n + 1
    raise AssertionError("no wrap-up intent")


@pytest.mark.parametrize("where", ["before its intent", "after its intent"])
async def test_a_crash_around_the_wrap_up_intent_resumes_into_the_same_end(where: str) -> None:
    intent, _ = await wrap_up_writes()
    journal = RecordingJournal(crash_at=intent, crash_after=where == "after its intent")
    with pytest.raises(Crash):
        await loop_of(ScriptedModel([call("noop"), call("noop")]), journal).run("go", run_id="r")
    model = ScriptedModel(["42"])
    r = await loop_of(model, RecordingJournal(journal.inner)).resume("r")
    assert r.stop_reason == StopReason.step_budget and r.final_answer == "42"
    assert r.steps_used == 3 and r.steps[-1].wrap_up
    assert model.requests[0].tool_choice == "none"
    assert model.requests[0].messages[-1]["content"] == WRAP
    # After its intent, the call is made again as the next attempt of the same intent.
    assert model.requests[0].attempt == (2 if where == "after its intent" else 1)


async def test_a_wrap_up_interrupted_after_its_intent_ends_with_its_budget_even_if_raised() -> None:
    intent, _ = await wrap_up_writes()
    journal = RecordingJournal(crash_at=intent, crash_after=True)
    with pytest.raises(Crash):
        await loop_of(ScriptedModel([call("noop"), call("noop")]), journal).run("go", run_id="r")
    r = await loop_of(ScriptedModel(["42"]), RecordingJournal(journal.inner)).resume(
        "r", limits=Limits(max_steps=10)
    )
    # The journal said "wrap up for step_budget": that is how the run ends.
    assert r.stop_reason == StopReason.step_budget and r.final_answer == "42"


async def test_a_crash_after_the_wrap_up_calls_failure_ends_with_the_budget() -> None:
    bad = ModelCallError("bad key", kind="auth")
    ref = RecordingJournal()
    await loop_of(ScriptedModel([call("noop"), call("noop"), bad]), ref).run("go", run_id="r")
    n = next(i for i, kinds in enumerate(writes(ref), start=1) if "model_failure" in kinds)
    journal = RecordingJournal(crash_at=n, crash_after=True)
    with pytest.raises(Crash):
        await loop_of(ScriptedModel([call("noop"), call("noop"), bad]), journal).run(
            "go", run_id="r"
        )
    model = ScriptedModel([])
    r = await loop_of(model, RecordingJournal(journal.inner)).resume("r")
    assert r.stop_reason == StopReason.step_budget and r.steps[-1].wrap_up
    assert r.stop_detail is not None and "wrap-up call failed" in r.stop_detail
    assert model.requests == []  # no second call


async def test_sql_tells_the_wrap_up_step_apart(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as journal:
        model = ScriptedModel([call("noop"), call("noop"), "42"])
        await loop_of(model, journal).run("go", run_id="r")
    rows = sqlite3.connect(path).execute(
        "SELECT step_idx, wrap_up FROM steps WHERE run_id = 'r' ORDER BY step_idx"
    )
    assert rows.fetchall() == [(0, 0), (1, 0), (2, 1)]


# --- every write of a run that falls back, prices its calls, spends its tokens, wraps up ----

DOWN = ModelCallError("503", retryable=True, kind="server")
PRICES = Pricing(2.0, 10.0)


def spending_loop(journal: object) -> Loop:
    """Step 0: the primary fails, the backup answers (a fallback); each answer reports usage
    and is priced; the token budget runs out after step 2; the wrap-up answers."""

    def primary(request: ModelRequest) -> ModelReply:
        if request.step_idx == 0:
            raise DOWN
        if request.messages[-1].get("content", "").startswith("The token budget is spent"):
            return ModelReply("final: ok", usage=Usage(5, 5))
        return ModelReply(tool_calls=call("look").tool_calls, usage=Usage(40, 10))

    def backup(request: ModelRequest) -> ModelReply:
        return ModelReply(tool_calls=call("look").tool_calls, usage=Usage(40, 10))

    model = FallbackModel(
        FunctionModel(primary, name="p", pricing=PRICES),
        FunctionModel(backup, name="b", pricing=PRICES),
    )
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def look() -> str:
        """Look around (no side effect: replayed after a crash)."""
        return "nothing new"

    return Loop(
        model,
        tools=tools,
        journal=journal,  # type: ignore[arg-type]
        clock=FakeClock(),
        retry=RetryPolicy(max_attempts=1),
        limits=Limits(max_tokens=150),
        wrap_up=True,
    )


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_around_any_write_of_a_spending_run_resumes_to_the_same_end(
    after: bool,
) -> None:
    ref_journal = RecordingJournal()
    ref = await spending_loop(ref_journal).run("go", run_id="r")
    assert ref.stop_reason == StopReason.token_budget and ref.final_answer == "final: ok"
    assert [s.model for s in ref.steps] == ["b", "p", "p", "p"] and ref.steps[-1].wrap_up
    assert ref.totals.tokens == 160 and ref.totals.cost_usd == pytest.approx(
        3 * (40 * 2 + 10 * 10) / 1e6 + (5 * 2 + 5 * 10) / 1e6
    )
    for n in range(1, ref_journal.count + 1):
        journal = RecordingJournal(crash_at=n, crash_after=after)
        with pytest.raises(Crash):
            await spending_loop(journal).run("go", run_id="r")
        r = await spending_loop(RecordingJournal(journal.inner)).resume("r")
        assert (r.stop_reason, r.final_answer) == (ref.stop_reason, ref.final_answer), n
        assert [(s.model, s.wrap_up, s.action) for s in r.steps] == [
            (s.model, s.wrap_up, s.action) for s in ref.steps
        ], n
        # A call whose result was lost in the crash is made again and counted once: only
        # journaled results count.
        assert r.totals.tokens == ref.totals.tokens, n
        assert r.totals.cost_usd == pytest.approx(ref.totals.cost_usd), n


async def test_a_wrap_up_a_crash_interrupted_is_finished_by_a_loop_without_wrap_up() -> None:
    intent, _ = await wrap_up_writes()
    journal = RecordingJournal(crash_at=intent, crash_after=True)
    with pytest.raises(Crash):
        await loop_of(ScriptedModel([call("noop"), call("noop")]), journal).run("go", run_id="r")
    plain = Loop(
        ScriptedModel(["42"]),
        tools=make_tools(),
        journal=RecordingJournal(journal.inner),  # type: ignore[arg-type]
        limits=Limits(max_steps=2),
        clock=FakeClock(),
    )
    r = await plain.resume("r")  # the journal says a wrap-up began: it is finished
    assert r.stop_reason == StopReason.step_budget and r.final_answer == "42"
    assert r.steps[-1].wrap_up


async def test_a_wrap_up_reply_the_interpreter_cannot_read_is_journaled_first() -> None:
    class Breaks:
        def __init__(self) -> None:
            self.calls = 0

        def interpret(self, reply: ModelReply, tool_specs: object) -> object:
            from polyloop.interpreters import NativeToolCallInterpreter

            if not tool_specs:  # the wrap-up reply is read as if there were no tools
                self.calls += 1
                if self.calls == 1:
                    raise RuntimeError("interpreter bug")
            return NativeToolCallInterpreter().interpret(reply, tool_specs)  # type: ignore[arg-type]

    inner = RecordingJournal()
    model = ScriptedModel([call("noop"), call("noop"), "42"])
    with pytest.raises(RuntimeError, match="interpreter bug"):
        await loop_of(model, inner, interpreter=Breaks()).run("go", run_id="r")
    kinds = [r.kind for batch in inner.appends for r in batch]
    assert kinds[-1] == "model_result"  # the wrap-up reply is durable
    again = ScriptedModel([])  # resume re-interprets it: no second call
    r = await loop_of(again, RecordingJournal(inner.inner)).resume("r")
    assert r.final_answer == "42" and again.requests == []


def budget_loop(journal: object) -> Loop:
    """The crash-injection harness's budget scenario (tests/durability): three steps of an
    idempotent tool at 20 tokens each spend ``max_tokens=60``; rule A then stops the run
    ``token_budget`` and the wrap-up call answers "best guess". The model is keyed by the
    request (a resumed run asks the same), priced so the run has a cost."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def note(n: int) -> str:
        """Note a number."""
        return f"noted {n}"

    def fn(request: ModelRequest) -> ModelReply:
        if request.tool_choice == "none":
            return ModelReply("best guess", usage=Usage(7, 3))
        return ModelReply(
            tool_calls=call("note", {"n": request.step_idx}).tool_calls, usage=Usage(15, 5)
        )

    model = FunctionModel(fn, name="f:priced", pricing=Pricing(1.0, 2.0))
    return Loop(
        model,
        tools=tools,
        journal=journal,  # type: ignore[arg-type]
        limits=Limits(max_steps=10, max_tokens=60),
        clock=FakeClock(),
        wrap_up=True,
    )


async def test_the_budget_scenario_wraps_up_a_token_budget() -> None:
    r = await budget_loop(RecordingJournal()).run("go")
    assert (r.stop_reason, r.final_answer, r.steps_used) == (
        StopReason.token_budget,
        "best guess",
        4,
    )
    assert [s.wrap_up for s in r.steps] == [False, False, False, True]
    assert r.totals.tokens == 70 and r.totals.usage_missing == 0
    assert r.totals.cost_usd == pytest.approx((3 * (15 + 2 * 5) + 7 + 2 * 3) / 1e6)
