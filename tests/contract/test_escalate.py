"""Hand-over conditions end the run at once: ``Escalate`` from a tool, an environment or a
run-end guard records its step and ends the run ``escalated`` with a report."""

from __future__ import annotations

from typing import Any

import pytest

from polyloop import (
    ActionStatus,
    Complete,
    Escalate,
    GuardContext,
    Limits,
    Loop,
    MalformedValue,
    ModelReply,
    Outcome,
    RunEndGuard,
    StopReason,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel, ScriptedModel
from polyloop.types import Action, Escalation, GuardVerdict, ModelRequest, RunEnd, ToolContext
from tests.conftest import Crash, RecordingJournal, call
from tests.contract.test_fix_loop_ledger import A, B, Suite

EVIDENCE = {"needed": "STRIPE_API_KEY", "tried": ["env", ".env"]}


def payment_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def read_config(key: str) -> str:
        """Read a configuration value."""
        return f"{key}=1"

    @tools.tool(replay="idempotent")
    def charge(amount: int) -> str:
        """Charge a card."""
        raise Escalate("no payment credentials in this environment", evidence=EVIDENCE)

    return tools


def pay(request: ModelRequest) -> ModelReply:
    if request.step_idx == 0:
        return call("read_config", {"key": "mode"})
    return call("charge", {"amount": 5})


def handover_loop(journal: Any) -> Loop:
    """The crash-injection scenario (tests/durability/test_crash_injection.py): a tool hands
    the run over at its second step."""
    return Loop(FunctionModel(pay), tools=payment_tools(), journal=journal)


async def test_escalate_from_a_tool_records_the_step_and_ends_the_run_escalated() -> None:
    journal = RecordingJournal()
    r = await Loop(FunctionModel(pay), tools=payment_tools(), journal=journal).run(
        "pay", run_id="p"
    )
    assert r.stop_reason == StopReason.escalated and r.steps_used == 2
    step = r.steps[-1]
    assert step.action_status is ActionStatus.executed and step.tool_name == "charge"
    assert step.observation == "Escalate: no payment credentials in this environment"
    assert step.observation_synthetic
    assert r.stop_detail == "tool charge: no payment credentials in this environment"
    report = r.report
    assert report is not None and report.stop_reason == "escalated"
    assert report.escalation == Escalation(
        "no payment credentials in this environment", EVIDENCE, "tool charge"
    )
    assert (
        report.question == "tool charge needs a person: no payment credentials in this environment"
    )
    assert report.stopped_at_step == 1
    md = report.to_markdown()
    assert "**Handed over by** tool charge" in md and '"needed":"STRIPE_API_KEY"' in md
    # the step and the end record are one transaction; the outcome holds the escalation
    assert journal.kinds()[-1] == ["action_result", "step", "end"]
    assert journal.appends[-1][0].outcome.escalation is not None  # type: ignore[union-attr]
    rebuilt = await Loop(FunctionModel(pay), tools=payment_tools(), journal=journal.inner).resume(
        "p"
    )
    assert (rebuilt.stop_reason, rebuilt.report, rebuilt.stop_detail) == (
        r.stop_reason,
        r.report,
        r.stop_detail,
    )


async def test_an_environment_that_raises_escalate_or_returns_one_ends_escalated() -> None:
    class Vault:
        def __init__(self, *, returns: bool) -> None:
            self.returns = returns

        def tool_specs(self) -> list[dict[str, Any]]:
            return [{"type": "function", "function": {"name": "open", "parameters": {}}}]

        def replay_policy(self, action: Action) -> str:
            return "never"

        async def execute(self, action: Action, ctx: ToolContext) -> Outcome:
            if self.returns:  # completed too: the hand-over wins
                escalation = Escalation("production data needed", {"table": "orders"})
                return Outcome(ActionStatus.executed, "x", completed=True, escalation=escalation)
            raise Escalate("production data needed", evidence={"table": "orders"})

        async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None:
            return None

    for returns in (False, True):
        r = await Loop(ScriptedModel([call("open")]), environment=Vault(returns=returns)).run("g")
        assert r.stop_reason == StopReason.escalated, returns
        assert r.stop_detail == "tool open: production data needed"
        assert r.report is not None and r.report.escalation is not None
        assert r.report.escalation.evidence == {"table": "orders"}


async def test_escalate_from_a_run_end_guard_ends_the_run_escalated_with_its_step() -> None:
    def first(ctx: GuardContext) -> Complete:
        return Complete()

    def spec_check(ctx: GuardContext) -> Complete:
        raise Escalate("the spec says both 200 and 409", evidence=["spec.md:12", "spec.md:40"])

    journal = RecordingJournal()
    guards = [first, RunEndGuard(spec_check, name="spec")]
    r = await Loop(ScriptedModel(["Done."]), guards=guards, journal=journal).run("g", run_id="s")
    assert r.stop_reason == StopReason.escalated and r.final_answer is None
    assert r.steps_used == 1 and r.steps[0].parse_ok and r.steps[0].observation is None
    assert r.stop_detail == "guard spec: the spec says both 200 and 409"
    assert r.report is not None and r.report.escalation == Escalation(
        "the spec says both 200 and 409", ["spec.md:12", "spec.md:40"], "guard spec"
    )
    assert journal.kinds()[-1] == ["guard_verdict", "step", "end"]
    verdicts = [x for x in journal.inner.records("s") if isinstance(x, GuardVerdict)]
    assert [(v.guard, v.steer) for v in verdicts] == [("first", False)]


async def test_an_escalation_in_a_fix_loop_reports_its_ledger_too() -> None:
    suite = Suite([[A], [B]])

    @suite.tools.tool
    def deploy() -> str:
        """Deploy to production."""
        raise Escalate("deploying needs production access")

    def reply(request: ModelRequest) -> ModelReply:
        i = request.step_idx
        if i == 4:
            return call("deploy")
        return call("run_tests") if i % 2 else call("edit_file", {"path": "o.py"})

    limits = Limits(max_steps=20, same_failure_limit=3)
    r = await Loop(FunctionModel(reply), tools=suite.tools, limits=limits).run("fix")
    assert r.stop_reason == StopReason.escalated
    report = r.report
    assert report is not None and report.stop_reason == "escalated" and report.stopped_at_step == 4
    assert [x.round for x in report.rounds] == [1, 2] and len(report.fingerprints) == 2
    assert report.question == "tool deploy needs a person: deploying needs production access"


async def test_report_hook_adds_directions_to_a_hand_over_report() -> None:
    loop = Loop(FunctionModel(pay), tools=payment_tools(), report_hook=lambda r: ["Ask ops."])
    r = await loop.run("pay")
    assert r.report is not None and r.report.directions == ("Ask ops.",)


def test_escalate_needs_a_reason_and_json_ready_evidence() -> None:
    with pytest.raises(MalformedValue, match="reason must be a non-empty str"):
        Escalate("  ")
    with pytest.raises(MalformedValue, match="evidence must be JSON-ready"):
        Escalate("why", evidence={"at": object()})
    exc = Escalate("why", evidence=[1, "a"])
    assert (exc.reason, exc.evidence, str(exc)) == ("why", [1, "a"], "why")


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("where", ["tool", "guard"])
async def test_a_crash_around_any_write_resumes_to_the_same_hand_over(
    after: bool, where: str
) -> None:
    def spec_check(ctx: GuardContext) -> Complete:
        raise Escalate("contradictory spec", evidence={"lines": [12, 40]})

    def make(journal: Any) -> Loop:
        if where == "tool":
            return Loop(FunctionModel(pay), tools=payment_tools(), journal=journal)
        model = FunctionModel(
            lambda r: call("read_config", {"key": "a"}) if r.step_idx == 0 else ModelReply("done")
        )
        return Loop(model, tools=payment_tools(), guards=[spec_check], journal=journal)

    ref_journal = RecordingJournal()
    ref = await make(ref_journal).run("g", run_id="x")
    assert ref.stop_reason == StopReason.escalated
    for n in range(1, ref_journal.count + 1):
        inner = MemoryJournal()
        with pytest.raises(Crash):
            await make(RecordingJournal(inner, crash_at=n, crash_after=after)).run("g", run_id="x")
        r = await make(inner).resume("x")
        assert (r.stop_reason, r.report, r.stop_detail) == (
            ref.stop_reason,
            ref.report,
            ref.stop_detail,
        ), n
        assert sum(isinstance(x, RunEnd) for x in inner.records("x")) == 1, n
