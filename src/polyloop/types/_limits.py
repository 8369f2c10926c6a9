"""The budgets and caps of a run (``Limits``) and how its model calls are retried
(``RetryPolicy``): settings, checked at construction (``ConfigError``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ._checks import check_amount, check_limit, check_number
from ._errors import ConfigError

__all__ = ["Limits", "RetryPolicy"]


def _check_limit(name: str, value: object, *, optional: bool) -> None:
    check_limit(f"Limits.{name}", value, optional=optional)


def _check_amount(name: str, value: object) -> None:
    check_amount(f"Limits.{name}", value)


_ADDED_LIMITS = (
    "no_progress_rounds",
    "spreading_rounds",
    "known_failures",
    "baseline",
    "max_tokens",
    "max_cost",
    "max_seconds",
    "max_consecutive_model_failures",
)


@dataclass(frozen=True, slots=True)
class Limits:
    """The budgets and caps of one run (kernel.md §5). Stored with the run.

    ``max_steps`` is always a positive int (the hard backstop); the others may be None
    (unbounded, never ``inf``). Any value <= 0, a bool, NaN or ``inf`` raises
    :class:`ConfigError` here, at construction; but ``max_consecutive_model_failures=0`` is
    taken as 1 (see there).
    """

    max_steps: int = 30
    """Step records appended (invalid, model-failure and env-error steps included)."""
    max_actions: int | None = None
    """Times the environment returned ``executed``."""
    max_consecutive_invalid: int = 3
    """Consecutive invalid decisions that end the run ``parse_failed_repeatedly``."""
    max_prompt_chars: int | None = None
    """Largest prompt (``prompt_chars``, in code points) the model may be sent."""
    max_observation_chars: int | None = None
    """Characters of an observation the model sees; the step keeps the full text."""
    same_failure_limit: int | None = None
    """Stop ``repeated_failure`` when one failure fingerprint has been seen this many times
    (kernel.md §10); None (the default) turns this signal off. 2 is a good start."""
    no_progress_rounds: int | None = None
    """Stop ``repeated_failure`` when the number of failing checks has not gone below its
    fewest for this many rounds in a row (no net progress); None turns it off."""
    spreading_rounds: int | None = None
    """Stop ``repeated_failure`` when the files changed so far grew in this many rounds in a
    row (each fix opens a new front); None turns it off."""
    known_failures: tuple[str, ...] = ()
    """Failures unrelated to the goal: a check (``tests/test_x.py::test_y``), a fingerprint, or
    the ``error_type`` of failures naming no check (``MCPToolError``). They never count toward
    ``same_failure_limit``; the escalation report lists them apart."""
    baseline: bool = False
    """Take the failures the run sees before its first reported edit (its first test run)
    as known too, each until an edit is seen to affect it (see :mod:`polyloop.kernel.ledger`)."""
    max_tokens: int | None = None
    """Input plus output tokens over every model-call attempt of the run, as the providers
    reported them (``token_budget``). An attempt with no usage, or a usage that cannot be
    believed (see :class:`Usage`), counts 0 (``usage_missing``): a report can never lower the
    total, and then only ``max_steps`` and the other budgets bound the run. The first attempt
    a budget cannot count is warned about once (``polyloop`` logger), and the run's
    ``stop_detail`` ends with ``"max_tokens cannot be measured: ..."`` (after its own detail)."""
    max_cost: float | None = None
    """US dollars over every attempt: the provider's reported cost, else the tokens at the
    model's ``Pricing``, else at its price in :mod:`polyloop.models.prices` (``cost_budget``).
    An attempt with no price, or a refused usage, counts 0 (``usage_missing``), warned about as
    for ``max_tokens`` (``"max_cost cannot be measured: ..."``). A finite number > 0, or None."""
    max_seconds: float | None = None
    """Seconds the run was active: wall time while a process drove it, summed over its
    executions and resumes (``time_budget``). Parked or detached time does not count; of a
    crashed execution, the time after its last journaled step does not either. A finite
    number > 0, or None."""
    max_consecutive_model_failures: int = 1
    """Steps in a row whose model call failed after the retry policy that end the run
    ``llm_error``. 1 (the default): the first such step does (kernel.md §6 C). With N > 1, a
    failed step is recorded (a model-failure step: ``llm_call_id`` None) and the next iteration
    calls the model again, from A, so ``max_steps`` still bounds it; a step whose model call
    succeeded resets the count. A failed step adds nothing to the conversation: the next call
    is sent the same messages. Resume counts the model-failure steps at the end of the
    trajectory. 0 is taken as 1 (the seed's rule: a ceiling of zero is tightened to one, so a
    failing model never turns into a run that does not end); a negative number, a bool or a
    non-int is a ``ConfigError``."""

    def __post_init__(self) -> None:
        _check_limit("max_steps", self.max_steps, optional=False)
        _check_limit("max_actions", self.max_actions, optional=True)
        _check_limit("max_consecutive_invalid", self.max_consecutive_invalid, optional=False)
        _check_limit("max_prompt_chars", self.max_prompt_chars, optional=True)
        _check_limit("max_observation_chars", self.max_observation_chars, optional=True)
        _check_limit("same_failure_limit", self.same_failure_limit, optional=True)
        _check_limit("max_tokens", self.max_tokens, optional=True)
        _check_amount("max_cost", self.max_cost)
        _check_amount("max_seconds", self.max_seconds)
        _check_limit("no_progress_rounds", self.no_progress_rounds, optional=True)
        _check_limit("spreading_rounds", self.spreading_rounds, optional=True)
        if type(self.max_consecutive_model_failures) is int and (
            self.max_consecutive_model_failures == 0
        ):
            object.__setattr__(self, "max_consecutive_model_failures", 1)  # tightened to one
        _check_limit(
            "max_consecutive_model_failures", self.max_consecutive_model_failures, optional=False
        )
        known = self.known_failures
        if type(known) is not tuple:
            if isinstance(known, str) or not isinstance(known, Sequence):
                raise ConfigError(
                    f"Limits.known_failures must be a list of checks or fingerprints, got {known!r}"
                )
            known = tuple(known)
            object.__setattr__(self, "known_failures", known)
        for item in known:
            if not isinstance(item, str) or not item:
                raise ConfigError(
                    f"Limits.known_failures holds {item!r}: each must be a non-empty str (a "
                    "failing check or a fingerprint)"
                )
        if type(self.baseline) is not bool:
            raise ConfigError(f"Limits.baseline must be a bool, got {self.baseline!r}")

    @property
    def failure_guard(self) -> bool:
        """Any of the failure guard's stop signals is on (its ledger is kept)."""
        return bool(self.same_failure_limit or self.no_progress_rounds or self.spreading_rounds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the limits: the first six always, those added since (the
        failure guard's, the token, cost and time budgets, ``max_consecutive_model_failures``)
        only when not their default, so a run that sets none of them stores what older
        readers read."""
        d: dict[str, Any] = {
            name: getattr(self, name) for name in self.__slots__ if name not in _ADDED_LIMITS
        }
        for name in _ADDED_LIMITS:
            value = getattr(self, name)
            if value != _ADDED_DEFAULTS[name]:
                d[name] = list(value) if isinstance(value, tuple) else value
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        """Read :meth:`to_dict` output; unknown keys are an error (they mean a newer writer).
        An infinite ``max_cost`` or ``max_seconds``, which older versions took for no limit,
        is read as None (what it meant)."""
        unknown = set(data) - set(cls.__slots__)
        if unknown:
            raise ConfigError(f"unknown limits {sorted(unknown)}")
        inf = [k for k in ("max_cost", "max_seconds") if data.get(k) == math.inf]
        return cls(**{**data, **dict.fromkeys(inf)}) if inf else cls(**data)


_ADDED_DEFAULTS = {f.name: f.default for f in fields(Limits) if f.name in _ADDED_LIMITS}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How model calls are retried. Only ``ModelCallError(retryable=True)`` is retried.

    The wait before attempt ``n + 1`` is ``initial_backoff_s * multiplier ** (n - 1)``, capped
    at ``max_backoff_s``, spread by ``±jitter`` (a fraction), and never shorter than the
    provider's ``retry_after``. A provider that asks to wait longer than ``max_retry_after_s``
    is not waited for: that failure is final (``llm_error``), so a rollout never sleeps for
    a day on one ``Retry-After`` header (None: no such cap).

    Every field is a finite number (``jitter`` in [0, 1), the others >= 0), never a bool;
    anything else is a ``ConfigError`` here, at construction.
    """

    max_attempts: int = 3
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.1
    max_retry_after_s: float | None = 300.0
    """None: wait as long as any provider asks."""

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"RetryPolicy.max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("initial_backoff_s", "max_backoff_s", "multiplier"):
            check_number(f"RetryPolicy.{name}", getattr(self, name))
        check_number("RetryPolicy.max_retry_after_s", self.max_retry_after_s, none="no cap")
        check_number("RetryPolicy.jitter", self.jitter, below=1)

    def allows_retry(self, failures: int, retry_after: float | None) -> bool:
        """May a retryable failure be retried, after ``failures`` failed attempts?"""
        if failures >= self.max_attempts:
            return False
        cap = self.max_retry_after_s
        return retry_after is None or cap is None or retry_after <= cap

    def backoff_s(self, attempt: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait after failed ``attempt`` (1-based); ``rand`` is uniform in [0, 1)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        base *= 1 + self.jitter * (2 * rand - 1)
        return max(base, retry_after or 0.0)
