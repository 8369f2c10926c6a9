"""PolyLoop: the execution kernel of an AI agent.

One run is one bounded session around one goal: the model decides, the decision is
interpreted, an action executes in an environment, the observation goes back into history,
and this repeats until the run is done or a stop condition fires. ``import polyloop`` has no
side effects.
"""

from .loop import Loop, SystemClock
from .tools import ToolEnvironment, ToolRegistry
from .types import (
    DEFAULT_TEMPLATES,
    Action,
    ActionStatus,
    ConfigError,
    EnvironmentFailure,
    Failure,
    FinalAnswer,
    InvalidDecision,
    JournalError,
    LeaseLost,
    Limits,
    ModelCallError,
    ModelReply,
    ModelRequest,
    Outcome,
    OutcomeUnknown,
    PendingAction,
    PolyLoopError,
    ReplayPolicy,
    RetryPolicy,
    RunDetached,
    RunExists,
    RunLeased,
    RunNotFound,
    RunResult,
    StepRecord,
    StopReason,
    Templates,
    ToolCall,
    ToolContext,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TEMPLATES",
    "Action",
    "ActionStatus",
    "ConfigError",
    "EnvironmentFailure",
    "Failure",
    "FinalAnswer",
    "InvalidDecision",
    "JournalError",
    "LeaseLost",
    "Limits",
    "Loop",
    "ModelCallError",
    "ModelReply",
    "ModelRequest",
    "Outcome",
    "OutcomeUnknown",
    "PendingAction",
    "PolyLoopError",
    "ReplayPolicy",
    "RetryPolicy",
    "RunDetached",
    "RunExists",
    "RunLeased",
    "RunNotFound",
    "RunResult",
    "StepRecord",
    "StopReason",
    "SystemClock",
    "Templates",
    "ToolCall",
    "ToolContext",
    "ToolEnvironment",
    "ToolRegistry",
    "Usage",
]
