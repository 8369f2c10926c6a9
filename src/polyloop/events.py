"""The events observers receive (kernel.md §9); see ``polyloop.types._events``."""

from .types import (
    ActionFinished,
    ActionStarted,
    Event,
    ModelCallFinished,
    ModelCallStarted,
    ModelDelta,
    Observer,
    RunEnded,
    RunStarted,
    StepAppended,
)

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
