"""Events delivered to observers (kernel.md §9).

Observers are plain callables ``observer(event) -> None``. They run synchronously on the
event loop, so they must not block; an observer that raises is logged and never changes the
run. Events are only built when at least one observer is registered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from ._enums import ActionStatus, StopReason
from ._step import StepRecord

__all__ = [
    "ActionFinished",
    "ActionStarted",
    "Event",
    "ModelCallFinished",
    "ModelCallStarted",
    "ModelDelta",
    "Observer",
    "RunEnded",
    "RunStarted",
    "StepAppended",
]


@dataclass(frozen=True, slots=True)
class RunStarted:
    """A run began (``resumed`` is True when ``Loop.resume`` continued it)."""

    run_id: str
    goal: str
    resumed: bool
    steps_used: int


@dataclass(frozen=True, slots=True)
class ModelCallStarted:
    """A model-call attempt is about to be made (its intent is durable)."""

    run_id: str
    step_idx: int
    intent_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ModelCallFinished:
    """A model-call attempt returned (``error`` is None) or failed."""

    run_id: str
    step_idx: int
    intent_id: str
    attempt: int
    llm_call_id: str | None
    latency_ms: float
    error: str | None


@dataclass(frozen=True, slots=True)
class ModelDelta:
    """A piece of a streamed reply as it arrived, for display (an adapter built with
    ``stream=True``). ``kind`` is ``"text"``, ``"reasoning"`` or ``"tool_call"`` (a fragment of
    a call's arguments). Deltas are never journaled: the attempt's complete reply is, once the
    stream has ended; a stream cut off mid-way makes the attempt a failed one, and the deltas
    already delivered belong to no reply (the next attempt's ``ModelCallStarted`` says so)."""

    run_id: str
    step_idx: int
    intent_id: str
    attempt: int
    kind: str
    text: str


@dataclass(frozen=True, slots=True)
class ActionStarted:
    """An action is about to be executed (its intent is durable)."""

    run_id: str
    step_idx: int
    op_id: str
    tool_name: str | None
    action: str


@dataclass(frozen=True, slots=True)
class ActionFinished:
    """An action's outcome arrived."""

    run_id: str
    step_idx: int
    op_id: str
    tool_name: str | None
    status: ActionStatus
    latency_ms: float


@dataclass(frozen=True, slots=True)
class StepAppended:
    """A step record is durable."""

    run_id: str
    step: StepRecord


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The end record is durable (also for ``cancelled``, before the re-raise)."""

    run_id: str
    stop_reason: StopReason
    stop_detail: str | None
    steps_used: int
    actions_executed: int


Event: TypeAlias = (
    RunStarted
    | ModelCallStarted
    | ModelDelta
    | ModelCallFinished
    | ActionStarted
    | ActionFinished
    | StepAppended
    | RunEnded
)
Observer: TypeAlias = Callable[[Event], None]
