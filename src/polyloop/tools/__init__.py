"""Tools: the registry (one source of truth for specs, validation and dispatch) and the
``ToolEnvironment`` that serves it to the kernel (tools.md)."""

from .environment import ToolEnvironment
from .registry import ExternalCall, InvalidArguments, ReconcileHook, Tool, ToolRegistry

__all__ = [
    "ExternalCall",
    "InvalidArguments",
    "ReconcileHook",
    "Tool",
    "ToolEnvironment",
    "ToolRegistry",
]
