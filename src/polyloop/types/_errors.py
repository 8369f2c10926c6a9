"""Exceptions. Stop reasons are results, never exceptions; these are for misuse and breakage.

::

    PolyLoopError                 base of everything PolyLoop raises on purpose
    ├── ConfigError (ValueError)  a bad argument or limit, raised where it was given
    ├── RunExists                 run() with a run id the journal already holds
    ├── RunNotFound               resume() of a run id the journal does not hold
    ├── RunLeased                 another live execution holds the run's lease
    ├── LeaseLost                 this execution lost the lease while advancing the run
    ├── RunDetached               the run was detached (paused) and stays resumable
    │   └── ApprovalRequired      the run is parked until a person decides on an action
    ├── AlreadyDecided            approve/deny of an action someone decided first
    ├── NotAwaitingApproval       approve/deny of an action that awaits no decision
    ├── JournalError              the journal is damaged, foreign, or of an unknown version
    ├── MalformedValue (TypeError, ValueError)
    │                             a value type built with a field that breaks its contract
    ├── ModelCallError            one model call failed (retryable or not); raised by models
    ├── EnvironmentFailure        the environment itself is broken -> ``env_error``
    ├── OutcomeUnknown            a tool or reconcile cannot tell whether an action happened
    └── Escalate                  a tool or a run-end guard hands the run to a human
                                  -> ``escalated`` (a stop, not a failure of PolyLoop's)
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "AlreadyDecided",
    "ApprovalRequired",
    "ConfigError",
    "EnvironmentFailure",
    "Escalate",
    "JournalError",
    "LeaseLost",
    "MalformedValue",
    "ModelCallError",
    "NotAwaitingApproval",
    "OutcomeUnknown",
    "PolyLoopError",
    "RunDetached",
    "RunExists",
    "RunLeased",
    "RunNotFound",
]


class PolyLoopError(Exception):
    """Base class of the exceptions PolyLoop raises on purpose."""


class ConfigError(PolyLoopError, ValueError):
    """A configuration value is invalid (e.g. a limit <= 0). Raised at construction."""


class RunExists(PolyLoopError):
    """``Loop.run`` was given a run id that the journal already holds. Nothing was written.

    A run row created ahead of time (by a batch, say) is started with ``Loop.resume``.
    """

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id!r} already exists in the journal; "
            "use Loop.resume(run_id) to continue it, or pick another run id"
        )
        self.run_id = run_id


class RunNotFound(PolyLoopError):
    """``Loop.resume`` was given a run id the journal does not hold. Nothing was written."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} is not in the journal")
        self.run_id = run_id


class RunLeased(PolyLoopError):
    """Another live execution holds the run's lease. Nothing was written.

    Attributes:
        owner: the identity of the execution that holds it.
        expires_at: the lease's expiry, in seconds since the epoch.
    """

    def __init__(self, run_id: str, owner: str, expires_at: float) -> None:
        super().__init__(
            f"run {run_id!r} is being advanced by {owner} (lease expires at epoch "
            f"{expires_at:.3f}); wait for it to end or for the lease to expire"
        )
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at


class LeaseLost(PolyLoopError):
    """A journal write was refused because this execution no longer holds the run's lease.

    Another worker took the run over (the lease expired). This execution must stop without
    writing anything more; the run belongs to the new owner.
    """


class RunDetached(PolyLoopError):
    """The run was detached at a step boundary: no end record, lease released, resumable.

    Raised by ``Loop.run``/``Loop.resume`` after ``Loop.detach(run_id)``.
    """

    def __init__(self, run_id: str, steps_used: int) -> None:
        super().__init__(
            f"run {run_id!r} was detached after {steps_used} steps; "
            f"continue it with Loop.resume({run_id!r})"
        )
        self.run_id = run_id
        self.steps_used = steps_used


class ApprovalRequired(RunDetached):
    """The run is parked until a person approves or denies an action (a tool declared with
    ``approval=``): its action intent is durable, no end record, no lease held,
    ``runs.status = 'awaiting_approval'``. Raised by ``Loop.run``/``Loop.resume`` when the run
    parks, and by ``Loop.resume`` of a parked run with no decision yet (which calls nothing).

    Decide with ``Loop.approve(run_id, op_id)`` / ``Loop.deny(run_id, op_id, reason=...)``
    (or ``polyloop approve`` / ``polyloop deny``) from any process, then ``Loop.resume``.

    Attributes: ``run_id``, ``steps_used``, ``step_idx``, ``op_id``, ``tool_name``,
    ``arguments`` (the validated call's arguments as a dict, or None for an action that is not
    a tool call), ``args_json`` (their canonical JSON), ``expires_at``.
    """

    def __init__(
        self,
        run_id: str,
        steps_used: int,
        *,
        step_idx: int,
        op_id: str,
        tool_name: str | None,
        arguments: dict[str, object] | None,
        args_json: str | None,
        expires_at: float | None = None,
    ) -> None:
        PolyLoopError.__init__(
            self,
            f"run {run_id!r} awaits approval of {tool_name or 'an action'} {args_json or ''} "
            f"(op_id={op_id}, step {step_idx}); approve or deny it with Loop.approve/Loop.deny "
            f"or `polyloop approve {run_id} {op_id}`, then resume it",
        )
        self.run_id = run_id
        self.steps_used = steps_used
        self.step_idx = step_idx
        self.op_id = op_id
        self.tool_name = tool_name
        self.arguments = arguments
        self.args_json = args_json
        self.expires_at = expires_at


class AlreadyDecided(PolyLoopError):
    """``Loop.approve``/``Loop.deny`` on an action that has its decision already: nothing was
    written. ``decision`` is the one that stands (who decided, when, what)."""

    def __init__(self, run_id: str, decision: object) -> None:
        describe = getattr(decision, "describe", None)
        said = describe() if callable(describe) else repr(decision)
        super().__init__(f"run {run_id!r}: the action was already {said}; nothing was written")
        self.run_id = run_id
        self.decision = decision


class NotAwaitingApproval(PolyLoopError):
    """``Loop.approve``/``Loop.deny`` named an action that does not await approval (the run
    ended, never parked, or parked on another action): nothing was written."""


class JournalError(PolyLoopError):
    """The journal cannot be read safely: damaged, out of order, foreign, or an unknown version.

    PolyLoop never modifies data it raised this about.
    """


class MalformedValue(PolyLoopError, TypeError, ValueError):
    """A value type that crosses a seam (``Outcome``, ``Action``, ``ModelReply``, ...) was
    built with a field that breaks its contract: the message names the type, the field, what
    it must be and what it got. Raised at construction.

    The kernel tells an environment that breaks the ``Outcome`` contract by this error (raised
    while its ``execute`` or ``reconcile`` built the Outcome) or by a returned value that is not
    an ``Outcome``: that step ends ``env_error`` with the message, instead of the run crashing
    after the action. It is a ``TypeError`` (a wrong type) and a ``ValueError`` (a value out of
    range, such as a negative count), so code that caught either before still does.
    """


class ModelCallError(PolyLoopError):
    """One model call failed. Raised by ``Model.complete``.

    Args:
        message: what went wrong, for the stop detail.
        retryable: the retry policy may try again (rate limits, timeouts, 5xx).
        retry_after: seconds the provider asked to wait before the next attempt, if it said.
        kind: a short machine-readable category, e.g. ``rate_limit``, ``timeout``,
            ``connection``, ``server``, ``auth``, ``bad_request``, ``context_length``.

    Any other exception raised by a model counts as non-retryable (kind ``error``).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        kind: str = "error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after
        self.kind = kind


class EnvironmentFailure(PolyLoopError):
    """The environment itself is broken (not the action): the step is ``env_error``, the run
    stops ``env_error``. A tool that raises this does not produce an ordinary tool error."""


class OutcomeUnknown(PolyLoopError):
    """Raised by a reconcile hook, or by a tool (or an environment's ``execute``) during a live
    run, that cannot tell whether an action happened (a payment whose HTTP call timed out after
    the request was sent). Live, the kernel applies the action's replay policy as a resume
    does for an action intent without a result: ``never`` ends the run
    ``resume_state_unknown``, ``idempotent`` executes it again with the same ``op_id`` (at
    most ``RetryPolicy.max_attempts`` executions), ``reconcile`` asks the environment. Its
    message is the detail journaled (``action_unknown``) and named in ``stop_detail``."""


class Escalate(PolyLoopError):
    """Raised by a tool (or an environment's ``execute``) or a run-end guard when the run
    needs a person before it can go on: credentials are missing, requirements contradict each
    other, production data would be needed. The step is recorded (a tool's as ``executed``,
    its observation naming the reason; a guard's as the final-answer step it judged), and the
    run ends at once with ``escalated`` and an escalation report carrying ``reason`` and
    ``evidence``.

    Args:
        reason: one line saying what a person must decide or provide.
        evidence: JSON-ready data backing it (a dict, list, str, number, or None), stored in
            the report.

    Raises:
        MalformedValue: ``reason`` is not a non-empty str, or ``evidence`` is not JSON-ready.
    """

    def __init__(self, reason: str, *, evidence: Any = None) -> None:
        if not isinstance(reason, str) or not reason.strip():
            raise MalformedValue(f"Escalate.reason must be a non-empty str, got {reason!r}")
        try:
            json.dumps(evidence, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise MalformedValue(f"Escalate.evidence must be JSON-ready: {exc}") from None
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence
