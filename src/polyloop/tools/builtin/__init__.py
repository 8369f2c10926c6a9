"""General workspace tools: read, write, edit and list files, grep, and a shell, bound to one
workspace root (tools.md, "General tools"). Optional: the kernel never imports this package.

::

    from polyloop.tools.builtin import CommandPolicy, Rule, workspace_tools

    tools = workspace_tools(
        "/path/to/checkout",
        writable_paths=["src", "tests"],
        command_policy=CommandPolicy(
            [Rule(r"\\bgit\\s+push\\b", "prompt"), Rule(r"\\brm\\s+-[a-z]*r", "forbid")]
        ),
        approve=lambda command: input(f"run {command!r}? [y/N] ") == "y",
    )
    loop = polyloop.Loop(model, tools=tools)

What the tools confine and what they report (paths, writes, the shell's changes, test edits
and failures): :func:`workspace_tools`. Every model-visible string is in :class:`BuiltinTexts`;
``extract_failures(output)`` reads a pytest or unittest report into a :class:`TestReport` of
:class:`~polyloop.types.Failure` values (:mod:`._test_reports` lists what it recognises).
"""

from ._policy import Approver, CommandPolicy, PolicyDecision, Rule, Verdict
from ._test_edits import DEFAULT_TEST_PATHS
from ._test_reports import TestReport, extract_failures
from ._texts import DEFAULT_BUILTIN_TEXTS, BuiltinTexts
from ._workspace import TOOL_NAMES, workspace_tools

__all__ = [
    "DEFAULT_BUILTIN_TEXTS",
    "DEFAULT_TEST_PATHS",
    "TOOL_NAMES",
    "Approver",
    "BuiltinTexts",
    "CommandPolicy",
    "PolicyDecision",
    "Rule",
    "TestReport",
    "Verdict",
    "extract_failures",
    "workspace_tools",
]
