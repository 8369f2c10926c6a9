"""Rebuild a run from its journal records (durability.md, "Resume").

:func:`replay` walks the records once, in ``seq`` order, and returns the state the run was in:
the steps and counters, the context (rebuilt turn by turn, so the messages are byte-identical),
the failure ledger (folded from the steps' outcomes), the limits in force, the end record if
there is one, and — when the run stopped in the middle of a step — an :class:`Interrupted`
that says how far that step got.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..seams import Context
from ..types import (
    ActionIntent,
    ActionResult,
    ActionStatus,
    ActionUnknown,
    ApprovalDecided,
    ApprovalRequested,
    ApprovedActionStarted,
    AttemptLogprobs,
    EscalationReport,
    FailureKnown,
    FailureSeen,
    GuardVerdict,
    JournalError,
    Limits,
    LimitsChanged,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelReply,
    ModelResult,
    Outcome,
    PendingAction,
    Record,
    RunEnd,
    RunTotals,
    StepRecord,
    StepWritten,
    StopReason,
    TestEdit,
    Turn,
    Usage,
)
from . import stopping
from .ledger import Ledger, Observed

__all__ = ["Interrupted", "Replayed", "replay"]


@dataclass
class Interrupted:
    """How far the step after the last complete one got before the run stopped."""

    step_idx: int
    intent_id: str
    last_attempt: int
    failures: int = 0
    """Attempts of this step that failed and were to be retried, since it last fell back."""
    shown: bool = False
    """One of them showed partial output (``partial_shown``): the step stays with its model."""
    tier: int = 0
    """Which of a ``FallbackModel``'s models the step's next attempt asks (the count of its
    failed attempts that fell back)."""
    model: str | None = None
    """The model name of the step's last model intent (the one a result answers)."""
    wrap_up: StopReason | None = None
    """Set when the step is a wrap-up call: the budget that ends the run."""
    result: ModelResult | None = None
    failure: ModelFailure | None = None
    action_intent: ActionIntent | None = None
    action_result: ActionResult | None = None
    replaced: int = 0
    """Code points replaced in this step's text before its action result (the counts of its
    failed attempts, model result and action intent), for its ``replaced_chars``."""
    approval: ApprovalRequested | None = None
    """The action intent awaited a person's decision (the run parked on it)."""
    decision: ApprovalDecided | None = None
    """That decision, once made."""
    approved_started: bool = False
    """An execution began acting on the approval (``ApprovedActionStarted``): the action may
    have happened since."""
    unknown_reports: int = 0
    """Live executions of the action that reported its outcome unknown (``action_unknown``
    records): a resume continues the retry policy's bound from here."""
    unknown_path: str | None = None
    """The path the last of them took (``"replayed"`` or ``"reconciled"``), for the step."""


@dataclass
class Replayed:
    """The state of a run rebuilt from its records."""

    limits: Limits
    steps: list[StepRecord] = field(default_factory=list)
    actions_executed: int = 0
    consecutive_invalid: int = 0
    usage: Usage | None = None
    tokens: int = 0
    """Input plus output tokens over the run's model results (``Limits.max_tokens``)."""
    cost_usd: float = 0.0
    """US dollars over the run's model results (``Limits.max_cost``)."""
    usage_missing: int = 0
    """Model results with no usage (or, under ``max_cost``, no cost)."""
    active_s: float = 0.0
    """Seconds the run was active, as its last step (or end record) journaled it."""
    end: RunEnd | None = None
    interrupted: Interrupted | None = None
    steer_counts: dict[str, int] = field(default_factory=dict)
    """Steers per run-end guard, by guard name."""
    ledger: Ledger = field(default_factory=Ledger)
    """The failure ledger, rebuilt by folding the outcomes of the steps (see :mod:`.ledger`)."""

    logprobs: list[AttemptLogprobs] = field(default_factory=list)
    """The log-probabilities of the model results that carry them, in order (RunResult's)."""

    unmeasured: dict[str, str] = field(default_factory=dict)
    """Why a budget cannot be measured, by budget (``"max_tokens"``, ``"max_cost"``): said by
    the first model result it could not count (no usage; no cost and no price)."""

    def count_result(self, result: ModelResult, model: str | None = None) -> str | None:
        """Add a model result's usage and cost to the run's totals. ``model``: the name of
        the model that answered. Returns the warning when the result is the first that a
        budget of the run cannot count (once per budget, see :meth:`end_detail`), else None.
        Its log-probabilities, when the reply has them, are kept for the run's result."""
        reply = result.reply
        if reply.logprobs is not None:
            self.logprobs.append(AttemptLogprobs(result.step_idx, result.attempt, reply.logprobs))
        usage = reply.usage
        limits = self.limits
        if usage is None:
            self.usage_missing += 1
            if limits.max_tokens is None and limits.max_cost is None:
                return None
            return self._unmeasured(result, model, None)
        self.usage = usage if self.usage is None else self.usage + usage
        self.tokens += (usage.input_tokens or 0) + (usage.output_tokens or 0)
        if result.cost_usd is not None:
            self.cost_usd += result.cost_usd
        elif limits.max_cost is not None:
            self.usage_missing += 1
            if "max_cost" not in self.unmeasured:
                return self._unmeasured(result, model, usage)
        return None

    def _unmeasured(
        self, result: ModelResult, model: str | None, usage: Usage | None
    ) -> str | None:
        """Say why the budgets not yet said cannot count ``result`` (``usage``: its usage,
        None when it had none); the warning, or None when each was said already."""
        limits = self.limits
        where = f"step {result.step_idx} attempt {result.attempt}"
        named = f"model {model!r}" if model else "a model without a name"
        never = "(usage_missing), so this budget may never stop the run"
        said = []
        if usage is None:
            for budget, what in (("max_tokens", "tokens"), ("max_cost", "cost")):
                if getattr(limits, budget) is not None and budget not in self.unmeasured:
                    said.append(
                        f"{budget} cannot be measured: the reply of {named} to {where} "
                        f"reported no usage, so its {what} count 0 {never}"
                    )
                    self.unmeasured[budget] = said[-1]
        else:
            said.append(
                f"max_cost cannot be measured: {named} has no price and its reply to {where} "
                f"reported no cost, so its cost counts 0 {never}; give the model a Pricing "
                "(polyloop run: --price-in/--price-out), or install the price table, which "
                "may know it (pip install 'polyloop[prices]')"
            )
            self.unmeasured["max_cost"] = said[-1]
        return "; ".join(said) or None

    def end_detail(self, detail: str | None) -> str | None:
        """The end record's ``stop_detail``: ``detail`` (the stop reason's own, if any), then
        why each budget still in force could not be measured, ``"; "`` between them."""
        if not self.unmeasured:
            return detail
        limits = self.limits
        notes = [w for budget, w in self.unmeasured.items() if getattr(limits, budget) is not None]
        return "; ".join(p for p in (detail, *notes) if p) or None

    def totals(self, active_s: float) -> RunTotals:
        """The run's totals, with ``active_s`` seconds of activity."""
        return RunTotals(self.tokens, self.cost_usd, active_s, self.usage_missing)

    def end_record(
        self,
        reason: StopReason,
        detail: str | None,
        at: float,
        active_s: float,
        *,
        final_answer: str | None = None,
        pending: PendingAction | None = None,
        report: EscalationReport | None = None,
    ) -> RunEnd:
        """The end record of the run as it stands: ended at ``at`` (the clock's time) for
        ``reason``, its ``stop_detail`` ``detail`` with :meth:`end_detail`'s notes, the steps
        and actions so far and the totals after ``active_s`` seconds of activity."""
        steps, actions = len(self.steps), self.actions_executed
        detail = self.end_detail(detail)
        totals = self.totals(active_s)
        return RunEnd(reason, detail, final_answer, steps, actions, at, pending, report, totals)

    def turn(self, step: StepRecord, reply: ModelReply | None, cut: int, active_s: float) -> Turn:
        """What the context builder is given for ``step``, the last of ``steps`` (the same
        live and in replay, so a resumed run's context is the undisturbed run's)."""
        return Turn(
            step,
            reply,
            cut,
            len(self.steps),
            self.actions_executed,
            self.limits,
            failure_seen=self.ledger.seen_at(step.step_idx),
            totals=self.turn_totals(active_s),
        )

    def turn_totals(self, active_s: float) -> RunTotals | None:
        """The totals a step's ``Turn`` carries: None unless the run has a token, cost or time
        budget (the budget hint reads them only then; a step builds nothing for them)."""
        limits = self.limits
        if limits.max_tokens is None and limits.max_cost is None and limits.max_seconds is None:
            return None
        return RunTotals(self.tokens, self.cost_usd, active_s, self.usage_missing)

    def observe(self, step: StepRecord, outcome: Outcome) -> Observed:
        """Fold an action step's outcome into the ledger, as the run did after its completion
        check (which judged it unless it ended the run)."""
        judged = stopping.after_action(outcome) is None
        return self.ledger.observe(step.step_idx, outcome, step.action, self.limits, judged=judged)


def _out_of_order(run_id: str, seq: int, why: str) -> JournalError:
    return JournalError(
        f"run {run_id!r}: journal record {seq} is out of order ({why}); "
        "the journal is damaged and was not modified"
    )


def replay(
    run_id: str, limits: Limits, records: Sequence[Record], context: Context | None
) -> Replayed:
    """Rebuild the run. ``context`` (fresh from the builder) receives every step's turn.

    Raises:
        JournalError: the records are out of order or contradict each other.
    """
    st = Replayed(limits=limits)
    cur: Interrupted | None = None
    for seq, rec in enumerate(records, start=1):
        if st.end is not None:
            raise _out_of_order(run_id, seq, f"{rec.kind} after the end record")
        expected = len(st.steps)
        match rec:
            case ModelIntent():
                if rec.step_idx != expected:
                    raise _out_of_order(
                        run_id,
                        seq,
                        f"model intent for step {rec.step_idx}, expected step {expected}",
                    )
                if cur is None or cur.intent_id != rec.intent_id:
                    if cur is not None and (cur.result or cur.failure):
                        raise _out_of_order(run_id, seq, "a second model call for one step")
                    cur = Interrupted(
                        expected, rec.intent_id, rec.attempt, model=rec.model, wrap_up=rec.wrap_up
                    )
                elif cur.result is not None or cur.failure is not None:
                    raise _out_of_order(run_id, seq, "model intent after the step's result")
                else:
                    cur.last_attempt = rec.attempt
                    cur.model = rec.model
            case ModelResult() | ModelAttemptFailed() | ModelFailure():
                if cur is None or cur.intent_id != rec.intent_id or cur.step_idx != rec.step_idx:
                    raise _out_of_order(run_id, seq, f"{rec.kind} without its model intent")
                cur.replaced += rec.replaced_chars
                if isinstance(rec, ModelResult):
                    cur.result = rec
                    st.count_result(rec, cur.model)
                elif isinstance(rec, ModelFailure):
                    cur.failure = rec
                elif rec.fallback:
                    cur.tier += 1
                    cur.failures = 0
                else:
                    cur.failures += 1
                    cur.shown = cur.shown or rec.partial_shown
            case ActionIntent():
                if cur is None or cur.result is None or rec.step_idx != expected:
                    raise _out_of_order(run_id, seq, "action intent without a model result")
                cur.action_intent = rec
                cur.replaced += rec.replaced_chars
            case ActionResult():
                if cur is None or cur.action_intent is None or cur.action_intent.op_id != rec.op_id:
                    raise _out_of_order(run_id, seq, "action result without its action intent")
                cur.action_result = rec
            case ApprovalRequested() | ApprovalDecided() | ApprovedActionStarted():
                _approval(run_id, seq, rec, cur, st)
            case ActionUnknown():
                if (
                    cur is None
                    or cur.action_intent is None
                    or cur.action_intent.op_id != rec.op_id
                    or cur.action_result is not None
                ):
                    raise _out_of_order(run_id, seq, "action unknown without its action intent")
                cur.unknown_reports += 1
                cur.unknown_path = rec.path
            case StepWritten(step, active_s):
                if active_s is not None:
                    st.active_s = active_s
                if step.step_idx != expected:
                    raise _out_of_order(run_id, seq, f"step {step.step_idx}, expected {expected}")
                reply, cut = _turn_parts(step, cur)
                st.steps.append(step)
                if step.action_status is ActionStatus.executed:
                    st.actions_executed += 1
                if step.parse_ok:
                    st.consecutive_invalid = 0
                elif step.parse_error is not None:
                    st.consecutive_invalid += 1
                if cur is not None and cur.action_result is not None:
                    st.observe(step, cur.action_result.outcome)
                if context is not None:
                    context.add_step(st.turn(step, reply, cut, st.active_s))
                cur = None
            case RunEnd():
                st.end = rec
                if rec.totals is not None:
                    st.active_s = rec.totals.active_s
            case LimitsChanged(new):
                st.limits = new
            case GuardVerdict():
                if rec.steer:
                    st.steer_counts[rec.guard] = st.steer_counts.get(rec.guard, 0) + 1
            case FailureSeen() | FailureKnown() | TestEdit():
                pass  # what the ledger concluded: rebuilt above, from the outcomes
    st.interrupted = cur
    return st


def _approval(
    run_id: str,
    seq: int,
    rec: ApprovalRequested | ApprovalDecided | ApprovedActionStarted,
    cur: Interrupted | None,
    st: Replayed,
) -> None:
    """An approval record: it must follow its action intent, in order (requested, decided,
    started), before the action's result."""
    intent = None if cur is None else cur.action_intent
    if cur is None or intent is None or intent.op_id != rec.op_id or cur.action_result:
        raise _out_of_order(run_id, seq, f"{rec.kind} without its pending action intent")
    if isinstance(rec, ApprovalRequested):
        if cur.approval is not None:
            raise _out_of_order(run_id, seq, "a second approval request for one action")
        cur.approval = rec
        if rec.active_s is not None:
            st.active_s = rec.active_s
    elif isinstance(rec, ApprovalDecided):
        if cur.approval is None or cur.decision is not None:
            raise _out_of_order(run_id, seq, "a decision without a pending approval request")
        cur.decision = rec
    else:
        if cur.decision is None or not cur.decision.approved or cur.approved_started:
            raise _out_of_order(run_id, seq, "an approved action started without approval")
        cur.approved_started = True


def _turn_parts(step: StepRecord, cur: Interrupted | None) -> tuple[ModelReply | None, int]:
    """The reply and PolyLoop's observation cut of a step, from the records of its step."""
    reply = cur.result.reply if cur is not None and cur.result is not None else None
    if step.llm_call_id is not None and reply is None:
        raise JournalError(f"step {step.step_idx} has no model result in the journal")
    tool_cut = 0
    if cur is not None and cur.action_result is not None:
        tool_cut = cur.action_result.outcome.truncated_chars
    return reply, max(0, step.observation_truncated_chars - tool_cut)
