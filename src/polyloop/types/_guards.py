"""Run-end guards (kernel.md §10): conditions on the finished conversation. The failure guard's
records are in ``_ledger``, its escalation report in ``_report``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeAlias

from ._errors import ConfigError, MalformedValue
from ._step import StepRecord

__all__ = [
    "Complete",
    "CompletionKind",
    "GuardCheck",
    "GuardContext",
    "GuardVerdict",
    "RunEndGuard",
    "Steer",
    "Verdict",
]


@dataclass(frozen=True, slots=True)
class Complete:
    """A run-end guard accepts the final answer (or the completion by an action)."""


@dataclass(frozen=True, slots=True)
class Steer:
    """A run-end guard sends the run on: ``feedback`` goes to the model as the final-answer
    step's (synthetic) observation, and the run continues (it costs a step). On a completion
    by an action (a guard with ``on_task_completed``) the completion is not accepted: the
    step stays ``executed`` and its observation is ``feedback``, a blank line, then the tool's
    text. ``feedback`` is a str, else ``MalformedValue``."""

    feedback: str

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, str):
            raise MalformedValue(f"Steer.feedback must be a str, got {self.feedback!r}")


Verdict: TypeAlias = Complete | Steer


CompletionKind: TypeAlias = Literal["final_answer", "marker", "environment"]
"""How the run would end (:attr:`GuardContext.completion`): ``final_answer``, the model
answered without acting (``agent_finished``); ``marker``, it called a completion-marker tool
(``task_completed``); ``environment``, the environment reported the goal reached
(``Outcome.completed``, ``task_completed``). A marker tool whose outcome is also
``completed`` is ``marker``."""


@dataclass(frozen=True, slots=True)
class GuardContext:
    """What a run-end guard reads: the immutable history at the moment the run would end.

    ``steps``: for a final answer, the steps before it; for a completion by an action, the
    steps up to and including the completing one (``steps[-1]``, executed, with the tool's
    observation). ``final_answer``: the answer's text; for an action, the visible text of the
    reply that made it ("" when it only called the tool). ``steers``: how often this guard has
    steered this run so far (final answers and completions together). ``completion``: how the
    run would end (:data:`CompletionKind`); only guards with ``on_task_completed`` see
    anything but ``"final_answer"``. ``tool_name`` and ``arguments``: the completing action's
    tool and its arguments as the tool received them (the marker tool's, or the tool whose
    outcome reported completion); None for a final answer and for an action that is not a
    tool call.
    """

    run_id: str
    goal: str
    steps: tuple[StepRecord, ...]
    final_answer: str
    steers: int
    completion: CompletionKind = "final_answer"
    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = None


GuardCheck: TypeAlias = Callable[[GuardContext], Verdict | Awaitable[Verdict]]


@dataclass(frozen=True, slots=True)
class RunEndGuard:
    """A condition on the finished conversation, checked when the model gives a final answer
    (and, with ``on_task_completed``, when an action completed the run).

    Args:
        check: ``check(ctx) -> Complete() | Steer(feedback)`` (sync or async). It must not
            block; an exception it raises is a bug and propagates (the run stays resumable).
        name: names the guard in the journal (its steer count is rebuilt by name on resume).
        max_steers: after steering this many times in a run, the guard is skipped and the
            answer (or completion) stands. ``Limits.max_steps`` stays the hard backstop.
        on_task_completed: also check a completion by an action, the run's ``task_completed``
            end: a completion-marker tool's or the environment's (``ctx.completion`` says
            which). False (the default): the guard sees final answers only, and such a
            completion ends the run unchecked.

    Guards check conditions on the conversation (e.g. "the answer cites a source", "the files
    the phase must produce exist before ``submit`` counts"); they are not a second step, time
    or token budget: those are ``Limits``. A steer on a completion by an action leaves the
    action executed (it counts in ``actions_executed``), puts the feedback before the tool's
    text in the step's observation, journals the verdict with the step, and the run goes on
    (on the last allowed step: ``step_budget``). ``Escalate`` from such a check ends the run
    ``escalated``. The action's result is journaled before such guards run: a crash while
    they run never executes the action again (a resume asks the guards again); a run cancelled
    while they run ends ``cancelled`` with the step as the tool left it (unjudged).
    """

    check: GuardCheck
    name: str = ""
    max_steers: int = 2
    on_task_completed: bool = False

    def __post_init__(self) -> None:
        if not callable(self.check):
            raise ConfigError(f"RunEndGuard.check must be callable, got {self.check!r}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.check, "__name__", "guard"))
        if isinstance(self.max_steers, bool) or not isinstance(self.max_steers, int):
            raise ConfigError(f"RunEndGuard.max_steers must be an int, got {self.max_steers!r}")
        if self.max_steers < 1:
            raise ConfigError(f"RunEndGuard.max_steers must be >= 1, got {self.max_steers}")
        if type(self.on_task_completed) is not bool:
            raise ConfigError(
                f"RunEndGuard.on_task_completed must be True or False, "
                f"got {self.on_task_completed!r}"
            )


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """Journal record: a run-end guard's verdict, written with the step it judged."""

    kind: ClassVar[str] = "guard_verdict"
    step_idx: int
    guard: str
    steer: bool
    feedback: str | None = None
