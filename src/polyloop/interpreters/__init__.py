"""Interpreters: the decision seam. Each turns one model reply into exactly one ``Action``,
``FinalAnswer`` or ``InvalidDecision`` (tools.md, "Interpreters")."""

from .native import NativeToolCallInterpreter

__all__ = ["NativeToolCallInterpreter"]
