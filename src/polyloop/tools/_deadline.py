"""Tools that end a call at ``ToolContext.timeout_s`` (the run's time budget) themselves.

The shell and MCP tools have a timeout of their own, enforced and reported their way (the
shell kills the command's process tree and reports its output so far; an MCP call is
cancelled on the server). Given a time budget, they end the call at the smaller of their own
timeout and ``ToolContext.timeout_s``, reported the same way; :class:`.ToolEnvironment` then
does not stop such a call itself (two stops at one instant would race, and its record would
lose what the tool reports). Every other tool is stopped by the environment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["keeps_own_deadline", "own_deadline", "within"]

_MARK = "_polyloop_own_deadline"
F = TypeVar("F", bound=Callable[..., Any])


def own_deadline(fn: F) -> F:
    """Mark ``fn`` (a tool's function) as ending its call at ``ToolContext.timeout_s``."""
    setattr(fn, _MARK, True)
    return fn


def keeps_own_deadline(fn: object) -> bool:
    return getattr(fn, _MARK, False) is True


def within(own: float | None, budget: float | None) -> float | None:
    """The smaller of a call's own timeout and the time budget's (None: no limit)."""
    if budget is None or (own is not None and own <= budget):
        return own
    return budget
