"""Exceptions. Stop reasons are results, never exceptions; these are for misuse and breakage.

::

    PolyLoopError                 base of everything PolyLoop raises on purpose
    ├── ConfigError (ValueError)  a bad argument or limit, raised where it was given
    ├── RunExists                 run() with a run id the journal already holds
    ├── RunNotFound               resume() of a run id the journal does not hold
    ├── RunLeased                 another live execution holds the run's lease
    ├── LeaseLost                 this execution lost the lease while advancing the run
    ├── RunDetached               the run was detached (paused) and stays resumable
    ├── JournalError              the journal is damaged, foreign, or of an unknown version
    ├── MalformedValue (TypeError, ValueError)
    │                             a value type built with a field that breaks its contract
    ├── ModelCallError            one model call failed (retryable or not); raised by models
    ├── EnvironmentFailure        the environment itself is broken -> ``env_error``
    └── OutcomeUnknown            reconcile cannot tell whether an action happened
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EnvironmentFailure",
    "JournalError",
    "LeaseLost",
    "MalformedValue",
    "ModelCallError",
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
    """Raised by a reconcile hook that cannot tell whether an action happened."""
