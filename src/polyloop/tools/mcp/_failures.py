"""How a failure of an MCP call or connection is read: the exception inside an exception
group, the one-line reason a person or model is shown, and the executed failure it becomes."""

from __future__ import annotations

from mcp.shared.exceptions import MCPError

from polyloop.types import ActionStatus, Failure, Outcome

__all__ = ["Unreachable", "failed", "find", "reason"]


class Unreachable(Exception):
    """The HTTP server could not be connected to (nothing was sent)."""


def find(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> BaseException | None:
    """``exc`` or the first exception of ``kinds`` inside it (exception groups included)."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find(inner, kinds)
            if found is not None:
                return found
    return None


def failed(text: str, error_type: str, message: str) -> Outcome:
    return Outcome(
        ActionStatus.executed,
        text,
        synthetic=True,
        failure=Failure(error_type=error_type, message=message[:300]),
    )


def reason(exc: BaseException) -> str:
    if isinstance(exc, MCPError):
        return exc.error.message
    if isinstance(exc, Unreachable):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(reason(e) for e in exc.exceptions)
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
