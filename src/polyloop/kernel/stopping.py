"""The stop decision (kernel.md §6): the only place that decides why a run stops.

Each iteration asks, in this order:

* Before A, at the start of every iteration (and before a detach takes effect):
  :func:`requested` — a request to end the run (``Loop.stop`` / ``Loop.cancel``, from any
  process) that its owner has received ends it at this step boundary, so the step in progress
  when it arrived was recorded first. A run resumed with a request stored ends at once,
  before the step a crash interrupted is finished.
* A. :func:`admit` — budgets settle at the *start* of an iteration, never at the end of the
  previous one, so a run that completes on its last allowed step is ``task_completed``:
  steps, actions, tokens, cost, active time, in that order.
* B. :func:`context_overflows` — no step and no intent are written for this stop.
* C. :func:`after_model_failure` — a step whose model call failed after the retry policy is
  ``llm_error`` (:data:`MODEL_FAILED`) when it makes ``max_consecutive_model_failures``
  such steps in a row (1 by default: every one); below that the run goes back to A.
* D. :func:`after_invalid` — this branch skips the completion check.
* E. a final answer is ``agent_finished`` (:data:`FINAL_ANSWER`), or ``escalated``
  (:data:`HANDED_OVER`) when a run-end guard raised ``Escalate``.
* F, on resume or when a live execution raised ``OutcomeUnknown``: an action whose outcome is
  not known and that its replay policy forbids running (again) is ``resume_state_unknown``
  (:data:`OUTCOME_UNKNOWN`).
* F/G. :func:`after_action` — ``env_error`` first, then a tool's ``Escalate``, then
  completion; ``not_executed`` never completes, and ``completed=False`` forever is normal;
  then :func:`failure_repeated`, the
  failure guard (its signals: :func:`failure_signals`), so a completed run is never stopped
  by it.
* Any time: a cancellation of the task driving the run ends it ``cancelled``
  (:data:`CANCELLED`, kernel.md §8), once an action in flight had its grace.

The other kernel modules carry an end out (write the step and the end record); none of them
names a reason itself (tests/unit/test_kernel_stop_reasons.py holds them to it).
"""

from __future__ import annotations

from ..types import ActionStatus, EndRequest, Limits, Outcome, StopReason

__all__ = [
    "CANCELLED",
    "FINAL_ANSWER",
    "HANDED_OVER",
    "MODEL_FAILED",
    "OUTCOME_UNKNOWN",
    "REPEATED_FAILURE",
    "admit",
    "after_action",
    "after_invalid",
    "after_model_failure",
    "context_overflows",
    "failure_repeated",
    "failure_signals",
    "overflow_detail",
    "requested",
]

MODEL_FAILED = StopReason.llm_error
FINAL_ANSWER = StopReason.agent_finished
HANDED_OVER = StopReason.escalated
OUTCOME_UNKNOWN = StopReason.resume_state_unknown
CANCELLED = StopReason.cancelled
REPEATED_FAILURE = StopReason.repeated_failure


def requested(request: EndRequest | None) -> StopReason | None:
    """Before A. A stop request ends the run ``stopped``; a cancel request that reaches a step
    boundary (its cancellation of the run's task did not end it first) ``cancelled``."""
    if request is None:
        return None
    return StopReason.cancelled if request.kind == "cancel" else StopReason.stopped


def admit(
    limits: Limits,
    steps_used: int,
    actions_executed: int,
    tokens: int = 0,
    cost_usd: float = 0.0,
    active_s: float = 0.0,
) -> StopReason | None:
    """A. The budgets, in this fixed order when several are exhausted at once:
    ``step_budget``, ``action_budget`` (both at once is ``step_budget``, a compatibility
    choice), then ``token_budget``, ``cost_budget``, ``time_budget``."""
    if steps_used >= limits.max_steps:
        return StopReason.step_budget
    if limits.max_actions is not None and actions_executed >= limits.max_actions:
        return StopReason.action_budget
    if limits.max_tokens is not None and tokens >= limits.max_tokens:
        return StopReason.token_budget
    if limits.max_cost is not None and cost_usd >= limits.max_cost:
        return StopReason.cost_budget
    if limits.max_seconds is not None and active_s >= limits.max_seconds:
        return StopReason.time_budget
    return None


def context_overflows(limits: Limits, prompt_chars: int) -> StopReason | None:
    """B. The prompt is never truncated silently: too large ends the run."""
    if limits.max_prompt_chars is not None and prompt_chars > limits.max_prompt_chars:
        return StopReason.context_overflow
    return None


def overflow_detail(limits: Limits, prompt_chars: int) -> str:
    """The ``stop_detail`` of a ``context_overflow``: the prompt's size and the limit."""
    return f"the prompt is {prompt_chars} chars, over max_prompt_chars={limits.max_prompt_chars}"


def after_model_failure(limits: Limits, failed_in_a_row: int) -> StopReason | None:
    """C. ``failed_in_a_row`` counts this step and the model-failure steps right before it."""
    if failed_in_a_row >= limits.max_consecutive_model_failures:
        return MODEL_FAILED
    return None


def after_invalid(limits: Limits, consecutive_invalid: int) -> StopReason | None:
    """D. ``consecutive_invalid`` counts this step."""
    if consecutive_invalid >= limits.max_consecutive_invalid:
        return StopReason.parse_failed_repeatedly
    return None


def after_action(outcome: Outcome) -> StopReason | None:
    """G. The completion check, after the step was appended: ``env_error``, then a hand-over
    (``escalated``: a person is needed, whatever else the outcome says), then completion."""
    if outcome.status is ActionStatus.env_error:
        return StopReason.env_error
    if outcome.escalation is not None:
        return StopReason.escalated
    if outcome.status is ActionStatus.executed and (outcome.completed or outcome.marker):
        return StopReason.task_completed
    return None


def failure_signals(
    limits: Limits, times_seen: int, stale_rounds: int, spreading_rounds: int
) -> tuple[str, ...]:
    """G, after the completion check: the failure guard's stop signals that fire on this
    step's round (see :mod:`.ledger`), in this order: ``same_failure`` (the fingerprint counted
    has been seen ``same_failure_limit`` times), ``no_progress`` (``no_progress_rounds``
    rounds without fewer failing checks), ``spreading`` (``spreading_rounds`` rounds that each
    changed a new file). Any of them ends the run ``repeated_failure``."""
    fired = []
    if limits.same_failure_limit is not None and times_seen >= limits.same_failure_limit:
        fired.append("same_failure")
    if limits.no_progress_rounds is not None and stale_rounds >= limits.no_progress_rounds:
        fired.append("no_progress")
    if limits.spreading_rounds is not None and spreading_rounds >= limits.spreading_rounds:
        fired.append("spreading")
    return tuple(fired)


def failure_repeated(signals: tuple[str, ...]) -> StopReason | None:
    """G: a failure signal fired (:func:`failure_signals`)."""
    return REPEATED_FAILURE if signals else None
