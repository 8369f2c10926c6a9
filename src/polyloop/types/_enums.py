"""The public enumerations: stop reasons, action statuses, replay policies."""

from __future__ import annotations

import enum

__all__ = ["ActionStatus", "ReplayPolicy", "StopReason"]


class StopReason(enum.StrEnum):
    """Why a run stopped. These strings are public data: downstream SQL matches them exactly.

    The enum is **append-only**: a value is never renamed or removed, and new values are added at
    the end. Adding one is a compatible change for PolyLoop but a soft break for code that matches
    exhaustively, so consumers must handle unknown values defensively (the CLI maps an unknown
    value to its own exit code). Foreseen growth points: a final-output validation failure, "a
    context compaction happened", and an intervention callback that asked the run to stop.

    ``StrEnum`` makes ``str(x) == f"{x}" == x.value`` (a ``str, Enum`` mix-in would print
    ``StopReason.step_budget`` in an f-string and silently break SQL).

    The ``cancelled`` asymmetry: when the caller's task is cancelled, ``asyncio.CancelledError``
    is re-raised and ``Loop.run`` returns **no** result (structured concurrency stays intact).
    A cancel *request* (``Loop.cancel(run_id)``, ``polyloop cancel``, from any process) cancelled
    no caller, so there ``run``/``resume`` return the result with ``stop_reason == cancelled``.
    Otherwise ``cancelled`` appears only in the journal's end record and in the result that
    ``Loop.resume`` rebuilds for a cancelled run.
    """

    task_completed = "task_completed"
    """After an executed action the environment reported ``completed=True``, or a
    completion-marker tool returned normally."""
    step_budget = "step_budget"
    """The step budget (``Limits.max_steps``) was exhausted; also when both budgets are."""
    parse_failed_repeatedly = "parse_failed_repeatedly"
    """``Limits.max_consecutive_invalid`` consecutive steps produced an invalid decision."""
    context_overflow = "context_overflow"
    """The assembled prompt exceeded ``Limits.max_prompt_chars`` (no step was written for it)."""
    env_error = "env_error"
    """The environment reported ``env_error`` (including failure to query completion)."""
    llm_error = "llm_error"
    """The model call failed unrecoverably after the retry policy (a provider's own
    context-length error included)."""
    agent_finished = "agent_finished"
    """The model gave a final answer."""
    action_budget = "action_budget"
    """The executed-action budget (``Limits.max_actions``) was exhausted."""
    cancelled = "cancelled"
    """External cancellation: of the caller's task (then only in the journal and in results
    rebuilt by ``resume``), or a cancel request (``Loop.cancel``: ``run`` returns it)."""
    resume_state_unknown = "resume_state_unknown"
    """Resume found an action intent without a result that may not be replayed."""
    repeated_failure = "repeated_failure"
    """(v1.1, appended) A stop signal of the failure guard fired — one failure fingerprint
    seen ``Limits.same_failure_limit`` times, ``no_progress_rounds`` rounds without fewer
    failing checks, or ``spreading_rounds`` rounds of spreading edits: the loop is going in
    circles; ``RunResult.report`` says how, for a human to decide."""
    token_budget = "token_budget"
    """(appended) The run's model calls used ``Limits.max_tokens`` input plus output tokens, as
    the providers reported them."""
    cost_budget = "cost_budget"
    """(appended) The run's model calls cost ``Limits.max_cost`` US dollars or more."""
    time_budget = "time_budget"
    """(appended) The run was active ``Limits.max_seconds`` seconds or more (summed over its
    executions; parked and detached time does not count)."""
    stopped = "stopped"
    """(appended) ``Loop.stop(run_id, reason)`` / ``polyloop stop`` ended the run at a step
    boundary; ``stop_detail`` is the reason given."""
    escalated = "escalated"
    """(appended) A tool or a run-end guard raised ``Escalate``: the run needs a person (missing
    credentials, contradictory requirements, production data); ``RunResult.report`` carries
    the reason and evidence."""


class ActionStatus(enum.StrEnum):
    """What the environment did with an action. Public data, like :class:`StopReason`."""

    executed = "executed"
    """The action ran (its side effects may have happened), also when the tool raised."""
    not_executed = "not_executed"
    """Nothing touched the environment: unknown tool, invalid arguments, refused by policy."""
    env_error = "env_error"
    """The environment itself is broken (or could not say whether the goal is reached)."""


class ReplayPolicy(enum.StrEnum):
    """May an action whose outcome was lost in a crash be executed again on resume?

    * ``never`` (the default): no. Resume ends the run ``resume_state_unknown`` and names the
      action, because it may or may not have happened and there is no way to know which.
    * ``idempotent``: yes, with the **same** ``op_id`` (the tool's idempotency key), because
      doing it twice has the effect of doing it once.
    * ``reconcile``: ask the environment (``Environment.reconcile``) whether it happened: an
      ``Outcome`` means it did (that outcome is used), ``None`` means it did not (it is executed),
      ``OutcomeUnknown`` means it cannot tell (``resume_state_unknown``).
    """

    never = "never"
    idempotent = "idempotent"
    reconcile = "reconcile"
