"""Context builders: the conversation of one run, built incrementally and measured in
characters (kernel.md §3 and §7)."""

from .chat import ChatContext, ChatContextBuilder, MessagesSnapshot

__all__ = ["ChatContext", "ChatContextBuilder", "MessagesSnapshot"]
