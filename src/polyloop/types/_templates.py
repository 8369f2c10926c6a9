"""Every model-visible string PolyLoop itself writes, in one overridable, versioned set.

In experiments this wording is part of the treatment, so its ``version`` is stored with each
run. Override by ``dataclasses.replace(DEFAULT_TEMPLATES, version="mine-1", ...)`` and pass the
result to ``Loop(templates=...)``; change ``version`` whenever you change a string.

Placeholders use ``str.format`` names listed next to each field.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_TEMPLATES", "Templates"]


@dataclass(frozen=True, slots=True)
class Templates:
    """The model-visible wording. Fields name their ``str.format`` placeholders."""

    version: str = "polyloop-1"
    system_prompt: str = (
        "You are an agent working toward a goal in an environment. Each turn, take exactly one "
        "action by calling one tool. When the goal is reached, reply with your final answer "
        "as plain text without calling a tool."
    )
    goal: str = "{goal}"
    """Placeholders: ``goal``."""
    unknown_tool: str = (
        "Error: there is no tool named {name!r}. Available tools: {available}. "
        "Call one of them by its exact name."
    )
    """Placeholders: ``name``, ``available`` (comma-separated names)."""
    invalid_arguments: str = (
        "Error: the arguments for {name!r} are invalid:\n{errors}\n"
        "Call {name!r} again with corrected arguments."
    )
    """Placeholders: ``name``, ``errors`` (one line per problem)."""
    tool_error: str = "Error: {name!r} raised {error_type}: {message}"
    """Placeholders: ``name``, ``error_type``, ``message``."""
    malformed_arguments: str = (
        "Your call to {name!r} had arguments that are not valid JSON ({error}). "
        "Call the tool again with the arguments as one JSON object."
    )
    """Placeholders: ``name``, ``error``."""
    several_tool_calls: str = (
        "You called {count} tools at once ({names}); call exactly one tool per turn. "
        "None of these calls was executed."
    )
    """Placeholders: ``count``, ``names``."""
    empty_reply: str = (
        "Your reply was empty. Call exactly one tool, or reply with your final answer as text."
    )
    text_without_tool_call: str = (
        "Your reply did not call a tool. Call exactly one tool to act; this reply was not executed."
    )
    observation_cut: str = "\n[... {cut} more characters not shown]"
    """Placeholders: ``cut``."""
    budget_hint: str = "\n[step {step} of {max_steps}{actions}]"
    """Placeholders: ``step`` (1-based, the step just finished), ``max_steps``, ``actions``
    (``" · N actions left"`` when an action budget is set, else "")."""


DEFAULT_TEMPLATES = Templates()
