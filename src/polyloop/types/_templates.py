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

    version: str = "polyloop-3"
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
    tool_timeout: str = (
        "Error: {name!r} timed out after {seconds:g} s and was stopped; side effects may have "
        "happened."
    )
    """Placeholders: ``name``, ``seconds`` (the tool's ``timeout_s``, or the run's time budget's
    ``ToolContext.timeout_s`` when that is smaller)."""
    wrap_up: str = (
        "The {budget} is spent: no more tool calls. Give your best final answer now, as plain "
        "text, with what you have found so far."
    )
    """The message of the wrap-up call (``Loop(wrap_up=True)``). Placeholders: ``budget``
    (``step budget``, ``token budget``, ...)."""
    wrap_up_no_action: str = (
        "Not executed: the {budget} is spent and no more actions can run. This run is over."
    )
    """The observation of a wrap-up reply that called a tool anyway. Placeholders: ``budget``."""
    approval_denied: str = (
        "Not executed: a person denied this call to {name!r}. Their reason: {reason}"
    )
    """The observation of an action a person denied (``Loop.deny``). Placeholders: ``name``
    (the tool, or "the action"), ``reason``, ``by``."""
    malformed_arguments: str = (
        "Your call to {name!r} had arguments that are not valid JSON ({error}). "
        "Call the tool again with the arguments as one JSON object."
    )
    """Placeholders: ``name``, ``error``."""
    arguments_too_deep: str = (
        "Your call to {name!r} had arguments nested too deeply (more than {limit} levels); "
        "nothing was executed. Call the tool again with arguments that nest less deeply."
    )
    """Placeholders: ``name``, ``limit`` (``polyloop.types.MAX_NESTING``)."""
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
    budget_hint: str = "\n[step {step} of {max_steps}{actions}{failure}]"
    """Placeholders: ``step`` (1-based, the step just finished), ``max_steps``, ``actions``
    (``" · N actions left"`` when an action budget is set, else ""), ``failure``
    (:attr:`failure_hint` when the failure guard counted a failure at this step, else "")."""
    failure_hint: str = " · this failure seen {seen} of {limit} times"
    """Placeholders: ``seen`` (times the failure counted at this step has been seen),
    ``limit`` (``Limits.same_failure_limit``: the run stops when ``seen`` reaches it)."""

    # --- JsonTextInterpreter ----------------------------------------------------------------
    # Literal braces are doubled ({{ }}) because these are str.format templates. Every
    # feedback ends with ``{expected}``: ``json_expected`` filled in.
    json_expected: str = (
        'Reply with exactly one JSON object: either a tool call, like {{"tool": "read_file", '
        '"arguments": {{"path": "notes.txt"}}}}, or, when you are done, your final answer, '
        'like {{"{final_key}": "The notes say 42."}}.'
    )
    """Placeholders: ``final_key``."""
    json_no_object: str = "Your reply contains no JSON object; nothing was executed. {expected}"
    """Placeholders: ``expected``."""
    json_malformed: str = (
        "The JSON in your reply is not valid ({error}); nothing was executed. {expected}"
    )
    """Placeholders: ``error`` (the parser's message), ``expected``."""
    json_not_object: str = (
        "The JSON in your reply is {kind}, not an object; nothing was executed. {expected}"
    )
    """Placeholders: ``kind`` (e.g. "an array"), ``expected``."""
    json_no_decision: str = (
        'Your JSON object has neither a "tool" key (to call a tool) nor a "{final_key}" key '
        "(to give your final answer); its keys are: {keys}. Nothing was executed. {expected}"
    )
    """Placeholders: ``final_key``, ``keys`` (the object's keys as JSON strings), ``expected``."""
    json_conflicting_keys: str = (
        "Your JSON object has both {first} and {second}, which mean the same; use only one of "
        "them. Nothing was executed. {expected}"
    )
    """Placeholders: ``first``, ``second`` (the two keys as JSON strings), ``expected``."""
    json_call_and_final: str = (
        'Your JSON object is both a tool call and a final answer ("{final_key}"); send one or '
        "the other. Nothing was executed. {expected}"
    )
    """Placeholders: ``final_key``, ``expected``."""
    json_bad_tool: str = (
        'The "{key}" of your JSON object must be the name of a tool, as a non-empty string; '
        "it is {kind}. Nothing was executed. {expected}"
    )
    """Placeholders: ``key``, ``kind``, ``expected``."""
    json_bad_arguments: str = (
        'The "{key}" of your call to {name!r} must be a JSON object mapping argument names to '
        "values; it is {kind}. Nothing was executed. {expected}"
    )
    """Placeholders: ``key``, ``name``, ``kind``, ``expected``."""
    json_bad_final: str = (
        'The "{final_key}" of your JSON object must be your answer as a non-empty string; '
        "it is {kind}. {expected}"
    )
    """Placeholders: ``final_key``, ``kind``, ``expected``."""
    json_native_tool_calls: str = (
        "Tools are called by writing JSON in the text of your reply, not through native tool "
        "calls; your call to {names} was not executed. {expected}"
    )
    """Placeholders: ``names`` (the calls' names, quoted), ``expected``."""

    # --- CodeBlockInterpreter ---------------------------------------------------------------
    # Every feedback ends with ``{expected}``: ``code_block_expected`` filled in.
    code_block_expected: str = (
        "Reply with exactly one fenced code block: a line {fence}, then your code, then a "
        "line ```.{final}"
    )
    """Placeholders: ``fence`` (the opening fence, e.g. "```python"), ``final``
    (``code_block_final_line`` and/or ``code_block_submit`` when those forms are enabled)."""
    code_block_final_line: str = (
        ' When you are done, reply instead with a line starting with "FINAL ANSWER:" followed '
        "by your answer."
    )
    """No placeholders. Describes the default ``final_pattern``: change it when you change that."""
    code_block_submit: str = (
        " To finish, reply with a code block whose first line is {marker}; the lines after it "
        "are your final answer."
    )
    """Placeholders: ``marker``."""
    code_block_missing: str = (
        "Your reply contains no fenced code block and no final answer; nothing was executed. "
        "{expected}"
    )
    """Placeholders: ``expected``."""
    code_block_wrong_language: str = (
        "Only {fence} code blocks are run, and your reply has none (it has {found}); nothing "
        "was executed. {expected}"
    )
    """Placeholders: ``fence``, ``found`` (the opening fences found), ``expected``."""
    code_block_unclosed: str = (
        "Your code block is not closed (it needs a line ``` after the code; was your reply "
        "cut off?); nothing was executed. {expected}"
    )
    """Placeholders: ``expected``."""
    code_block_empty: str = "Your code block is empty; nothing was executed. {expected}"
    """Placeholders: ``expected``."""
    code_block_native_tool_calls: str = (
        "Code is read from a fenced code block in the text of your reply, not from native "
        "tool calls; your call to {names} was not executed. {expected}"
    )
    """Placeholders: ``names`` (the calls' names, quoted), ``expected``."""


DEFAULT_TEMPLATES = Templates()
