"""Every model-visible string PolyLoop writes about MCP calls, in one overridable, versioned set.

Like :class:`polyloop.types.Templates`, this wording is part of an experiment's treatment:
override with ``dataclasses.replace(DEFAULT_MCP_TEXTS, version="mine-1", ...)``, pass it to
``MCPServer(..., texts=...)``, and change ``version`` whenever you change a string (the
registry records it, and ``Loop`` stores it with each run).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MCP_TEXTS", "MCPTexts"]


@dataclass(frozen=True, slots=True)
class MCPTexts:
    """The wording of what PolyLoop says about an MCP call. Fields name their placeholders:
    ``tool`` (the name the model called), ``server`` (the command line or URL), and those
    listed."""

    version: str = "polyloop-mcp-2"

    not_sent: str = (
        "Error: the MCP server {server} could not be reached ({reason}); the call to {tool!r} "
        "was not sent, so it had no effect. You may try again later."
    )
    """Placeholders: ``reason``."""
    lost: str = (
        "Error: the call to {tool!r} was sent to the MCP server {server}, but {reason} before "
        "it answered; the tool may or may not have acted. Check its effect before repeating "
        "it."
    )
    """Placeholders: ``reason``."""
    timed_out: str = (
        "Error: the MCP tool {tool!r} did not answer within {timeout_s:g} s; the call was "
        "cancelled, and it may or may not have acted. Check its effect before repeating it."
    )
    """Placeholders: ``timeout_s``."""
    refused: str = "Error: the MCP server refused the call to {tool!r}: {message}"
    """The server answered with a JSON-RPC error saying the call was not run (an unknown tool,
    invalid parameters). Placeholders: ``message``."""
    failed: str = "Error: the MCP server answered the call to {tool!r} with an error: {message}"
    """Any other JSON-RPC error (the tool may have run). Placeholders: ``message``."""
    empty_error: str = "Error: the MCP tool {tool!r} failed and gave no message"
    """An ``isError`` result with no text."""
    omitted: str = "\n[... {omitted} characters of output omitted ...]\n"
    """Put between the first and the last half of an answer longer than the server's
    ``max_output_chars``. Placeholders: ``omitted`` (the characters cut)."""


DEFAULT_MCP_TEXTS = MCPTexts()
