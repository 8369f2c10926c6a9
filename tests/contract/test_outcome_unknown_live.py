"""A live tool may raise ``OutcomeUnknown``: it cannot tell whether its action happened (a
payment whose HTTP call timed out after the request was sent). The kernel applies the rule a
resume applies to an action intent without a result, by the tool's replay policy, journals
each report (``action_unknown``) before it takes the path, and the step says which path."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    Loop,
    ModelReply,
    OutcomeUnknown,
    RetryPolicy,
    StopReason,
    ToolContext,
    ToolRegistry,
)
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import (
    ActionIntent,
    ActionStatus,
    ActionUnknown,
    ModelRequest,
    Outcome,
    RunEnd,
    record_from_dict,
    record_to_dict,
)
from tests.conftest import Crash, RecordingJournal, call

LOST = "HTTP timeout after the request was sent"


class Bank:
    """A payment service: ``charge`` raises ``OutcomeUnknown`` on the calls listed in
    ``unknown`` (1-based, over all calls, across resumes), after it did (``lost_after``) or did
    not do the payment; ``paid`` holds the op_ids of the payments made."""

    def __init__(self, unknown: set[int], *, lost_after: bool = False) -> None:
        self.unknown = unknown
        self.lost_after = lost_after
        self.calls: list[str] = []
        self.paid: list[str] = []
        self.checks: list[str] = []
        self.check_answers: list[str] = []  # "unknown" or "ask" (tell from self.paid)

    def tools(self, replay: str, *, sync: bool = False) -> ToolRegistry:
        tools = ToolRegistry()

        def pay(amount: int, ctx: ToolContext) -> str:
            self.calls.append(ctx.op_id)
            if len(self.calls) in self.unknown:
                if self.lost_after:
                    self.paid.append(ctx.op_id)
                raise OutcomeUnknown(LOST)
            self.paid.append(ctx.op_id)
            return f"paid {amount}"

        async def apay(amount: int, ctx: ToolContext) -> str:
            await asyncio.sleep(0)
            return pay(amount, ctx)

        def check(op_id: str, arguments: Mapping[str, Any]) -> Outcome | None:
            self.checks.append(op_id)
            answer = self.check_answers.pop(0) if self.check_answers else "ask"
            if answer == "unknown":
                raise OutcomeUnknown("the bank's ledger is down")
            if op_id in self.paid:
                return Outcome(ActionStatus.executed, f"paid {arguments['amount']} (ledger)")
            return None

        fn = pay if sync else apay
        fn.__name__ = "charge"
        fn.__doc__ = "Charge the customer's card."
        if replay == "reconcile":
            tools.tool(replay="reconcile", reconcile=check)(fn)
        else:
            tools.tool(replay=replay)(fn)  # type: ignore[arg-type]
        return tools


def loop_of(bank: Bank, replay: str, journal: object, *, sync: bool = False, **kw: Any) -> Loop:
    def answer(request: ModelRequest) -> ModelReply:  # by step: the same after a resume
        return call("charge", {"amount": 5}) if request.step_idx == 0 else ModelReply("done")

    model = FunctionModel(answer)
    kw.setdefault("clock", FakeClock())
    kw.setdefault("retry", RetryPolicy(max_attempts=3, initial_backoff_s=0.25, jitter=0.0))
    return Loop(model, tools=bank.tools(replay, sync=sync), journal=journal, **kw)  # type: ignore[arg-type]


def unknowns(journal: RecordingJournal, run_id: str = "r") -> list[tuple[str, int, str]]:
    return [
        (r.path, r.attempt, r.detail)
        for r in journal.inner.records(run_id)
        if isinstance(r, ActionUnknown)
    ]


def kinds(journal: RecordingJournal, run_id: str = "r") -> list[str]:
    return [r.kind for r in journal.inner.records(run_id)]


# --- each policy, live ---------------------------------------------------------------------


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_never_ends_resume_state_unknown_naming_the_action_and_the_report(
    sync: bool,
) -> None:
    bank = Bank({1})
    journal = RecordingJournal()
    r = await loop_of(bank, "never", journal, sync=sync).run("pay", run_id="r")
    assert r.stop_reason == StopReason.resume_state_unknown
    assert r.steps_used == 0  # no step for the action, as on resume
    pending = r.pending_action
    assert pending is not None and pending.tool_name == "charge"
    assert pending.op_id == bank.calls[0] and pending.args_json == '{"amount":5}'
    assert r.stop_detail == f"{pending.describe()} reported={json.dumps(LOST)}"
    assert len(bank.calls) == 1  # never executed again
    assert unknowns(journal) == [("ended", 1, LOST)]
    # Written with the end record, in one transaction.
    assert journal.kinds()[-1] == ["action_unknown", "end"]


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_idempotent_executes_again_with_the_same_op_id_after_the_backoff(
    sync: bool,
) -> None:
    bank = Bank({1, 2})
    journal = RecordingJournal()
    clock = FakeClock()
    r = await loop_of(bank, "idempotent", journal, sync=sync, clock=clock).run("pay", run_id="r")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "done"
    assert len(bank.calls) == 3 and len(set(bank.calls)) == 1  # one op_id, three executions
    assert bank.paid == bank.calls[2:]
    assert clock.sleeps == [0.25, 0.5]  # the retry policy's backoff after executions 1 and 2
    (step, _) = r.steps
    assert step.action_status == ActionStatus.executed and step.observation == "paid 5"
    assert step.outcome_unknown == "replayed"
    assert r.steps[1].outcome_unknown is None
    assert unknowns(journal) == [("replayed", 1, LOST), ("replayed", 2, LOST)]
    assert kinds(journal)[:6] == [
        "model_intent",
        "model_result",
        "action_intent",
        "action_unknown",
        "action_unknown",
        "action_result",
    ]


async def test_idempotent_ends_when_the_last_allowed_execution_still_reports_unknown() -> None:
    bank = Bank({1, 2, 3})
    journal = RecordingJournal()
    r = await loop_of(bank, "idempotent", journal).run("pay", run_id="r")
    assert r.stop_reason == StopReason.resume_state_unknown and r.steps_used == 0
    assert len(bank.calls) == 3  # retry.max_attempts executions in all
    assert r.pending_action is not None
    assert r.stop_detail == (
        f"{r.pending_action.describe()} reported={json.dumps(LOST)}; "
        "outcome unknown after 3 executions (retry max_attempts=3)"
    )
    assert unknowns(journal) == [("replayed", 1, LOST), ("replayed", 2, LOST), ("ended", 3, LOST)]


async def test_reconcile_takes_the_environments_outcome_as_the_result() -> None:
    bank = Bank({1}, lost_after=True)  # the payment went through; its answer was lost
    journal = RecordingJournal()
    r = await loop_of(bank, "reconcile", journal).run("pay", run_id="r")
    assert r.stop_reason == StopReason.agent_finished
    assert len(bank.calls) == 1 and bank.checks == bank.calls  # asked, not executed again
    assert r.steps[0].observation == "paid 5 (ledger)"
    assert r.steps[0].outcome_unknown == "reconciled"
    assert unknowns(journal) == [("reconciled", 1, LOST)]


async def test_reconcile_none_means_it_did_not_happen_and_it_is_executed_again() -> None:
    bank = Bank({1})  # the payment did not go through
    clock = FakeClock()
    r = await loop_of(bank, "reconcile", RecordingJournal(), clock=clock).run("pay", run_id="r")
    assert r.stop_reason == StopReason.agent_finished
    assert len(bank.calls) == 2 and bank.paid == [bank.calls[0]]
    assert r.steps[0].observation == "paid 5" and r.steps[0].outcome_unknown == "reconciled"
    assert clock.sleeps == []  # the environment said it did not happen: no backoff


async def test_reconcile_that_cannot_tell_ends_resume_state_unknown() -> None:
    bank = Bank({1})
    bank.check_answers = ["unknown"]
    journal = RecordingJournal()
    r = await loop_of(bank, "reconcile", journal).run("pay", run_id="r")
    assert r.stop_reason == StopReason.resume_state_unknown and r.steps_used == 0
    assert r.pending_action is not None and r.pending_action.replay_policy.value == "reconcile"
    assert r.stop_detail == (
        f"{r.pending_action.describe()} reported={json.dumps(LOST)}; "
        f"reconcile: {json.dumps('the bank' + chr(39) + 's ledger is down')}"
    )
    assert unknowns(journal) == [("reconciled", 1, LOST)]


async def test_reconcile_none_each_time_is_bounded_by_the_retry_policy() -> None:
    bank = Bank({1, 2})
    r = await loop_of(bank, "reconcile", RecordingJournal(), retry=RetryPolicy(2)).run("pay")
    assert r.stop_reason == StopReason.resume_state_unknown
    assert len(bank.calls) == 2 and len(bank.checks) == 2
    assert r.stop_detail is not None
    assert r.stop_detail.endswith("outcome unknown after 2 executions (retry max_attempts=2)")


def test_the_record_reads_back_from_its_json_form() -> None:
    rec = ActionUnknown(3, "op", LOST, "replayed", 2)
    assert record_to_dict(rec) == {
        "kind": "action_unknown",
        "step_idx": 3,
        "op_id": "op",
        "detail": LOST,
        "path": "replayed",
        "attempt": 2,
    }
    assert record_from_dict(record_to_dict(rec)) == rec


async def test_an_action_unknown_without_its_intent_is_refused_on_resume() -> None:
    bank = Bank({1, 2})
    journal = RecordingJournal()
    await loop_of(bank, "idempotent", journal).run("pay", run_id="r")
    records = list(journal.inner.records("r"))
    at = next(i for i, rec in enumerate(records) if isinstance(rec, ActionIntent))
    from polyloop.kernel.replay import replay
    from polyloop.types import JournalError, Limits

    with pytest.raises(JournalError, match="action unknown without its action intent"):
        replay("r", Limits(), records[:at] + records[at + 1 :], None)


async def test_sql_on_the_steps_table_finds_the_path(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path) as journal:
        await loop_of(Bank({1}), "idempotent", journal).run("pay", run_id="a")
        await loop_of(Bank({1}), "reconcile", journal).run("pay", run_id="b")
        await loop_of(Bank(set()), "idempotent", journal).run("pay", run_id="c")
    db = sqlite3.connect(path)
    rows = db.execute(
        "SELECT run_id, step_idx, outcome_unknown FROM steps ORDER BY run_id, step_idx"
    ).fetchall()
    assert rows == [
        ("a", 0, "replayed"),
        ("a", 1, None),
        ("b", 0, "reconciled"),
        ("b", 1, None),
        ("c", 0, None),
        ("c", 1, None),
    ]
    reports = db.execute(
        "SELECT run_id, json_extract(body, '$.path'), json_extract(body, '$.attempt') "
        "FROM journal WHERE kind = 'action_unknown' ORDER BY run_id, seq"
    ).fetchall()
    assert reports == [("a", "replayed", 1), ("b", "reconciled", 1)]


# --- a crash at every write of the handling ------------------------------------------------


def handling_writes(journal: RecordingJournal) -> list[int]:
    """The 1-based writes from the first action_unknown to the action's result or the end."""
    first = next(n for n, b in enumerate(journal.appends, 1) if b[0].kind == "action_unknown")
    last = next(
        n
        for n, b in enumerate(journal.appends, 1)
        if n >= first and any(r.kind in ("action_result", "end") for r in b)
    )
    return list(range(first, last + 1))


CASES = {
    # policy, the calls that report unknown, whether the lost call paid, the end
    "never": ("never", {1}, False, StopReason.resume_state_unknown),
    "idempotent": ("idempotent", {1, 2}, False, StopReason.agent_finished),
    # it never tells: whichever reports were durable, the bound is reached
    "idempotent bound": ("idempotent", set(range(1, 9)), False, StopReason.resume_state_unknown),
    "reconcile": ("reconcile", {1}, True, StopReason.agent_finished),
    "reconcile none": ("reconcile", {1}, False, StopReason.agent_finished),
}


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("case", list(CASES))
async def test_a_crash_at_every_write_of_the_handling_resumes_into_the_right_end(
    case: str, after: bool
) -> None:
    replay, unknown, lost_after, end = CASES[case]
    ref_journal = RecordingJournal()
    ref = await loop_of(Bank(unknown, lost_after=lost_after), replay, ref_journal).run(
        "pay", run_id="r"
    )
    assert ref.stop_reason == end
    for n in handling_writes(ref_journal):
        bank = Bank(unknown, lost_after=lost_after)
        journal = RecordingJournal(crash_at=n, crash_after=after)
        with pytest.raises(Crash):
            await loop_of(bank, replay, journal).run("pay", run_id="r")
        r = await loop_of(bank, replay, RecordingJournal(journal.inner)).resume("r")
        assert r.stop_reason == end, (n, r.stop_detail)
        assert r.steps_used == ref.steps_used, n
        assert len(set(bank.calls)) == 1, n  # one op_id whatever happened
        # The bound counts executions across resumes: at most max_attempts, plus the one a
        # crash may have cut off before its report was durable.
        assert len(bank.calls) <= 3 + (0 if after else 1), n
        assert len(bank.paid) <= 1 or replay == "idempotent", n
        if end == StopReason.agent_finished:
            assert r.steps[0].observation in ("paid 5", "paid 5 (ledger)"), n
            reports = unknowns(RecordingJournal(journal.inner))
            if reports:
                assert r.steps[0].outcome_unknown == reports[-1][0], n
        else:
            assert r.pending_action is not None and r.pending_action.op_id == bank.calls[0], n
        ends = [x for x in journal.inner.records("r") if isinstance(x, RunEnd)]
        assert len(ends) == 1, n


async def test_a_resume_continues_the_bound_of_the_live_reports() -> None:
    # Executions 1 and 2 report unknown, the crash comes after the second report is durable:
    # the resume may execute it once more (the third of max_attempts=3), not three times.
    bank = Bank({1, 2, 3, 4, 5})
    ref = RecordingJournal()
    await loop_of(Bank({1, 2, 3}), "idempotent", ref).run("pay", run_id="r")
    second = [n for n, b in enumerate(ref.appends, 1) if b[0].kind == "action_unknown"][1]
    journal = RecordingJournal(crash_at=second, crash_after=True)
    with pytest.raises(Crash):
        await loop_of(bank, "idempotent", journal).run("pay", run_id="r")
    assert len(bank.calls) == 2
    r = await loop_of(bank, "idempotent", RecordingJournal(journal.inner)).resume("r")
    assert r.stop_reason == StopReason.resume_state_unknown
    assert len(bank.calls) == 3
    assert [a for _, a, _ in unknowns(RecordingJournal(journal.inner))] == [1, 2, 3]
    assert r.stop_detail is not None and "after 3 executions" in r.stop_detail


# --- the crash-injection harness's scenario (tests/durability) -----------------------------

_SEEN: dict[str, int] = {}  # executions per op_id in this process


def unknown_loop(journal: object) -> Loop:
    """The crash-injection harness's ``unknown`` scenario: an idempotent ``transfer`` whose
    first two executions of an op in each process raise ``OutcomeUnknown`` (the third
    answers), then the final answer. ``retry.max_attempts=10`` leaves room for a crashed
    process's executions plus a resumed one's, so every crash point ends ``agent_finished``
    with the step's ``outcome_unknown`` ``"replayed"``."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def transfer(amount: int, ctx: ToolContext) -> str:
        """Transfer money (idempotent by op_id at the bank)."""
        _SEEN[ctx.op_id] = _SEEN.get(ctx.op_id, 0) + 1
        if _SEEN[ctx.op_id] <= 2:
            raise OutcomeUnknown(LOST)
        return f"transferred {amount}"

    def answer(request: ModelRequest) -> ModelReply:
        if request.step_idx == 0:
            return call("transfer", {"amount": 7})
        return ModelReply("done")

    return Loop(
        FunctionModel(answer),
        tools=tools,
        journal=journal,  # type: ignore[arg-type]
        clock=FakeClock(),
        retry=RetryPolicy(max_attempts=10),
    )


async def test_the_unknown_scenario_replays_twice_then_finishes() -> None:
    journal = RecordingJournal()
    r = await unknown_loop(journal).run("go", run_id="u")
    assert r.stop_reason == StopReason.agent_finished and r.steps[0].observation == "transferred 7"
    assert r.steps[0].outcome_unknown == "replayed"
    assert [(p, a) for p, a, _ in unknowns(journal, "u")] == [("replayed", 1), ("replayed", 2)]
