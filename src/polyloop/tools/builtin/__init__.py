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

Paths are confined to the root (``..``, absolute paths and symlinks that lead out are refused
as ``not_executed``); ``writable_paths`` narrows where writes go; the shell has a timeout, an
output cap and a command policy. Every model-visible string is in :class:`BuiltinTexts`.

``extract_failures(output)`` reads a pytest or unittest report into a :class:`TestReport` of
:class:`~polyloop.types.Failure` values; the shell tool uses it to set ``Outcome.failures`` on
a test run that exits non-zero (the failure guard counts the first one's fingerprint).
``write_file`` and ``edit_file`` report their edits in ``Outcome.edits``, and flag the edits
of test files (``test_paths``, default :data:`DEFAULT_TEST_PATHS`); ``shell`` reports the test
files a command changed the same way, and, with ``writable_paths``, the files it changed
outside them (it cannot be prevented from writing them: they are reported, not undone).
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
