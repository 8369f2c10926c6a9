"""What a tool is handed for one call (:class:`ToolContext`)."""

from __future__ import annotations

from dataclasses import dataclass

from ._fast import fast_init

__all__ = ["ToolContext"]


@fast_init
@dataclass(frozen=True, slots=True)
class ToolContext:
    """Handed to a tool that asks for it. ``op_id`` is allocated and journaled before the call
    and stays the same if the call is replayed on resume: use it as an idempotency key."""

    run_id: str
    step_idx: int
    op_id: str
    approved_by: str | None = None
    """Who approved this action, when it needed approval (a tool declared with ``approval=``)
    and a person approved it (``Loop.approve``); None otherwise."""
    timeout_s: float | None = None
    """Seconds this call may take by the run's time budget (``Limits.max_seconds``): what was
    left of it when the call began plus the Loop's ``time_budget_grace_s``, never below 0.
    None: the run has no time budget. ``ToolEnvironment`` stops a Python tool at the smaller
    of this and the tool's own ``timeout_s`` and records it as that timeout; the shell and
    MCP tools end their call at it the way they end it at their own timeout. A custom
    ``Environment`` should do the same: the kernel does not interrupt an action."""
