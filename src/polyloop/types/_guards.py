"""Run-end guards (kernel.md §10): conditions on the finished conversation. The failure guard's
records are in ``_ledger``, its escalation report in ``_report``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from ._errors import ConfigError, MalformedValue
from ._step import StepRecord

__all__ = [
    "Complete",
    "GuardCheck",
    "GuardContext",
    "GuardVerdict",
    "RunEndGuard",
    "Steer",
    "Verdict",
]


@dataclass(frozen=True, slots=True)
class Complete:
    """A run-end guard accepts the final answer."""


@dataclass(frozen=True, slots=True)
class Steer:
    """A run-end guard sends the run on: ``feedback`` goes to the model as the final-answer
    step's (synthetic) observation, and the run continues (it costs a step). ``feedback`` is
    a str, else ``MalformedValue``."""

    feedback: str

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, str):
            raise MalformedValue(f"Steer.feedback must be a str, got {self.feedback!r}")


Verdict: TypeAlias = Complete | Steer


@dataclass(frozen=True, slots=True)
class GuardContext:
    """What a run-end guard reads: the immutable history at the moment of a final answer.

    ``steps`` are the steps before the final answer; ``steers`` is how often this guard has
    steered this run so far.
    """

    run_id: str
    goal: str
    steps: tuple[StepRecord, ...]
    final_answer: str
    steers: int


GuardCheck: TypeAlias = Callable[[GuardContext], Verdict | Awaitable[Verdict]]


@dataclass(frozen=True, slots=True)
class RunEndGuard:
    """A condition on the finished conversation, checked when the model gives a final answer.

    Args:
        check: ``check(ctx) -> Complete() | Steer(feedback)`` (sync or async). It must not
            block; an exception it raises is a bug and propagates (the run stays resumable).
        name: names the guard in the journal (its steer count is rebuilt by name on resume).
        max_steers: after steering this many times in a run, the guard is skipped and the
            answer stands. ``Limits.max_steps`` stays the hard backstop.

    Guards check conditions on the conversation (e.g. "the answer cites a source"); they are
    not a second step, time or token budget: those are ``Limits``. They do not run when a
    completion-marker tool or the environment completed the run.
    """

    check: GuardCheck
    name: str = ""
    max_steers: int = 2

    def __post_init__(self) -> None:
        if not callable(self.check):
            raise ConfigError(f"RunEndGuard.check must be callable, got {self.check!r}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.check, "__name__", "guard"))
        if isinstance(self.max_steers, bool) or not isinstance(self.max_steers, int):
            raise ConfigError(f"RunEndGuard.max_steers must be an int, got {self.max_steers!r}")
        if self.max_steers < 1:
            raise ConfigError(f"RunEndGuard.max_steers must be >= 1, got {self.max_steers}")


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """Journal record: a run-end guard's verdict, written with the step it judged."""

    kind: ClassVar[str] = "guard_verdict"
    step_idx: int
    guard: str
    steer: bool
    feedback: str | None = None
