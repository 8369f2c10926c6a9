"""``workspace_tools``: the general file and shell tools, bound to one workspace root."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import pydantic

from polyloop.types import (
    ActionStatus,
    ConfigError,
    Failure,
    FileEdit,
    Outcome,
    ToolContext,
    check_number,
)

from .._deadline import own_deadline, within
from .._output import DEFAULT_MAX_OUTPUT_CHARS, check_max_output_chars
from .._threads import in_thread
from ..registry import ToolRegistry
from ._files import MAX_FILE_MIB, Files
from ._paths import Refused, Workspace
from ._policy import Approver, CommandPolicy, Verdict
from ._shell import ShellResult, default_shell, run_shell
from ._test_edits import DEFAULT_TEST_PATHS, TestPaths
from ._test_reports import extract_failures
from ._texts import DEFAULT_BUILTIN_TEXTS, BuiltinTexts
from ._watch import ShellWatch

__all__ = ["TOOL_NAMES", "workspace_tools"]

TOOL_NAMES = ("read_file", "write_file", "edit_file", "list_files", "grep", "shell")
"""The names ``workspace_tools`` registers, in order (``shell`` only with ``shell=True``)."""

_OUTSIDE_SHOWN = 10  # files named in the note on a command's writes outside writable_paths

# Put where the output cap cut a test report: it ends a pytest section and a unittest block, so
# the tail's half-entry is not read as the end of the head's last entry.
_CUT = "\n" + "=" * 70 + "\n= output omitted =\n"

# Module level, so that the registry can resolve the annotations of the tool functions.
Offset = Annotated[int, pydantic.Field(ge=0)]
Limit = Annotated[int, pydantic.Field(ge=1)]


def workspace_tools(
    root: str | os.PathLike[str],
    *,
    writable_paths: Sequence[str | os.PathLike[str]] | None = None,
    shell: bool = True,
    shell_timeout_s: float = 30.0,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    command_policy: CommandPolicy | None = None,
    approve: Approver | None = None,
    registry: ToolRegistry | None = None,
    texts: BuiltinTexts = DEFAULT_BUILTIN_TEXTS,
    test_paths: Sequence[str] = DEFAULT_TEST_PATHS,
) -> ToolRegistry:
    """Register the workspace tools on a registry and return it.

    The tools: ``read_file``, ``write_file``, ``edit_file``, ``list_files``, ``grep`` (sync,
    run in a worker thread) and, with ``shell=True``, ``shell`` (async). Reads are declared
    ``replay="idempotent"``, writes and the shell ``"never"``.

    Every path argument is resolved inside ``root``: ``..``, absolute paths and symbolic links
    that lead outside it, and paths containing NUL, are refused as ``not_executed`` with a
    synthetic observation, before anything is touched. So are calls that cannot be carried
    out as given (a missing file, a directory where a file is needed, a binary or non-UTF-8
    file to read or edit, an ``old`` text that does not occur exactly once, an invalid
    regular expression, a command the policy refuses): they cost a step, not an action, and
    their observation says what to do instead. The shell is *not* confined to the root by
    these rules (its working directory is the root, nothing more): confine it with
    ``command_policy`` and an operating-system sandbox. POSIX only.

    ``writable_paths`` cannot confine the shell either (no portable mechanism stops a process
    from writing): a command runs with the rights of the process. What it changed is
    detected afterwards instead: the workspace's test files and, with ``writable_paths``,
    its files outside them are compared before and after each command (a stat walk of the
    workspace; see ``Outcome.edits`` below). Files it created, changed or deleted outside
    ``writable_paths`` are named in the observation (the model is told they were not
    allowed) and reported in ``Outcome.edits``; they are **not** undone. For a guarantee,
    pass ``shell=False`` or run the process in an operating-system sandbox. Not looked into:
    folders whose name starts with "." (``.git``, ``.venv``, caches), ``node_modules``,
    ``__pycache__``, ``site-packages`` and virtual environments; a change another process
    makes in the workspace while a command runs is reported as the command's.

    The file tools are confined by construction: every path is walked one component at a time
    from an open descriptor of the root, never following a symlink (one inside the root is
    read and followed only while its target stays inside), and writes rename a temporary file
    over the name in the same directory. A directory or file swapped for a symlink while a
    call runs makes the call fail, never reach outside. ``read_file`` reads only what it
    shows; ``edit_file`` and ``grep`` handle files of up to 10 MiB. File names that are not
    UTF-8 are shown with U+FFFD for each undecodable byte.

    ``write_file`` and ``edit_file`` report what they changed in ``Outcome.edits`` (a
    :class:`~polyloop.types.FileEdit`): the failure guard reads it, and an edit of a test file
    (``test_paths``) is flagged with what it did to the tests in it (a test or an assertion
    deleted, an assertion changed, a skip marker added) and journaled as a ``test_edit``
    record. ``shell`` reports the test files a command changed the same way (``sed -i``,
    ``echo >``, ``rm``: the whole file before against the whole file after), and, with
    ``writable_paths``, the files it changed outside them (``FileEdit(path)``); other files
    a command changes are not reported. A test file is read again only when its size, times
    or inode changed; each command costs two walks of the workspace (measured in
    ``bench/shell_watch.py``); ``test_paths=[]`` without ``writable_paths`` turns the watch
    off. To forbid test edits instead, leave test files out of
    ``writable_paths`` (e.g. ``["!tests/**", "!**/test_*.py"]``). A failing ``pytest`` or
    ``unittest`` run through ``shell`` reports its failing tests in ``Outcome.failures`` (the
    first as ``failure``).

    Args:
        root: the workspace directory (it must exist); its real path is the root.
        writable_paths: paths or globs relative to the root (``"src"``, ``"docs/*.md"``,
            ``"**/*.py"``; ``*`` and ``?`` never match "/", ``**`` matches any number of
            directories) under which ``write_file`` and ``edit_file`` may write; a path is
            writable if it or one of its parent directories matches an entry. An entry
            starting with "!" excludes what it matches, whatever else allows it (with only
            such entries, everything else is writable). None (the default) allows writes
            anywhere in the root; ``[]`` makes the workspace read-only. A write elsewhere is
            ``not_executed`` (nothing is written; the observation names the path and the
            writable paths); a shell command's writes elsewhere are reported, not prevented
            (above).
        shell: register the ``shell`` tool.
        shell_timeout_s: seconds before a command is killed with every process it started.
        max_output_chars: the most characters of content any one call shows; what is cut is
            reported in ``Outcome.truncated_chars``.
        command_policy: which commands may run; default ``CommandPolicy()``, which allows
            every command (see :class:`CommandPolicy` and :meth:`CommandPolicy.strict`).
        approve: ``approve(command) -> bool`` (sync or async), asked about commands the policy
            says to ``prompt`` for. Only ``True`` approves; if it raises, the command is
            refused. Without it, such a command waits for a person's decision through the
            journal: the ``shell`` tool needs approval for it (``@tool(approval=...)``), so the
            run parks (``ApprovalRequired``) until ``Loop.approve`` / ``polyloop approve``;
            called directly, outside a run's approval, such a command is refused.
        registry: register on this registry instead of a new one.
        texts: the model-visible wording (tool descriptions, refusals, notes).
        test_paths: globs of test files (default :data:`DEFAULT_TEST_PATHS`: ``tests/**``,
            ``test_*.py``, ``*_test.py``, ``*_spec.*``). One with "/" is matched against the
            path from the root, one without against the file name in any folder; ``[]``
            flags no file.

    Returns:
        The registry the tools were registered on.

    Raises:
        ConfigError: ``root`` is not a directory; a ``writable_paths`` entry lies outside it
            (or ``writable_paths`` is a single string); ``shell_timeout_s`` or
            ``max_output_chars`` is not positive (the latter must be at least 100); a
            ``test_paths`` entry is empty (or ``test_paths`` is a single string); a tool name
            is already taken in ``registry`` (nothing is registered then); ``shell=True`` on a
            system without process groups; a system without ``O_NOFOLLOW`` and ``dir_fd``
            (the file tools could not confine paths).
    """
    check_number(
        "workspace_tools: shell_timeout_s", shell_timeout_s, above=True, unit=" of seconds"
    )
    check_max_output_chars("workspace_tools", max_output_chars)
    if shell and not hasattr(os, "killpg"):
        raise ConfigError(
            "workspace_tools: the shell tool needs POSIX process groups; pass shell=False"
        )
    workspace = Workspace(root, writable_paths, texts)
    tests = TestPaths(test_paths)
    registry = ToolRegistry() if registry is None else registry
    names = TOOL_NAMES if shell else TOOL_NAMES[:-1]
    taken = [name for name in names if name in registry]
    if taken:
        raise ConfigError(
            f"workspace_tools: the registry already has tools named {taken}; register the "
            "workspace tools on another registry"
        )
    registry.add_wording_version(texts.version)
    runner = (
        _Shell(
            workspace,
            texts,
            ShellWatch(workspace, tests),
            timeout_s=float(shell_timeout_s),
            max_chars=max_output_chars,
            policy=CommandPolicy() if command_policy is None else command_policy,
            approve=approve,
        )
        if shell
        else None
    )
    files = Files(workspace, texts, max_output_chars, tests)
    writable = workspace.writable_names
    note = "" if writable is None else texts.writable_note.format(paths=writable)

    def read_file(path: str, offset: Offset = 0, limit: Limit | None = None) -> str | Outcome:
        return _refusable(files.read, path, offset, limit)

    def write_file(path: str, content: str) -> str | Outcome:
        return _refusable(files.write, path, content)

    def edit_file(path: str, old: str, new: str) -> str | Outcome:
        return _refusable(files.edit, path, old, new)

    def list_files(path: str = ".", pattern: str | None = None) -> str | Outcome:
        return _refusable(files.listing, path, pattern)

    def grep(pattern: str, path: str = ".", glob: str | None = None) -> str | Outcome:
        return _refusable(files.grep, pattern, path, glob)

    read_file.__doc__ = texts.read_file_doc.format(max_output_chars=max_output_chars)
    write_file.__doc__ = texts.write_file_doc.format(writable=note)
    edit_file.__doc__ = texts.edit_file_doc.format(writable=note, max_file_mib=MAX_FILE_MIB)
    list_files.__doc__ = texts.list_files_doc.format(max_output_chars=max_output_chars)
    grep.__doc__ = texts.grep_doc.format(
        max_output_chars=max_output_chars, max_file_mib=MAX_FILE_MIB
    )
    registry.register(read_file, replay="idempotent")
    registry.register(write_file, replay="never")
    registry.register(edit_file, replay="never")
    registry.register(list_files, replay="idempotent")
    registry.register(grep, replay="idempotent")
    if runner is not None:
        shell_runner = runner  # bound for the closure, with its narrowed type

        @own_deadline  # ends the command at the run's time budget as at its own timeout
        async def shell_tool(command: str, ctx: ToolContext) -> str | Outcome:
            return await shell_runner(command, ctx.approved_by, ctx.timeout_s)

        shell_tool.__doc__ = texts.shell_doc.format(
            shell=shell_runner.shell_name,
            timeout_s=shell_timeout_s,
            max_output_chars=max_output_chars,
        )
        # A command the policy says to prompt for, with no approver to ask here, parks the run
        # for a person's decision (Loop.approve / polyloop approve): durable human approval.
        registry.register(
            shell_tool,
            name="shell",
            replay="never",
            approval=lambda args: shell_runner.needs_person(str(args.get("command", ""))),
        )
    return registry


def _refusable(work: Callable[..., str | Outcome], *args: Any) -> str | Outcome:
    try:
        return work(*args)
    except Refused as refused:
        return refused.outcome()


class _Shell:
    """The ``shell`` tool: the policy, the approval, then the command."""

    def __init__(
        self,
        workspace: Workspace,
        texts: BuiltinTexts,
        watch: ShellWatch,
        *,
        timeout_s: float,
        max_chars: int,
        policy: CommandPolicy,
        approve: Approver | None,
    ) -> None:
        if not isinstance(policy, CommandPolicy):
            raise ConfigError(
                f"workspace_tools: command_policy must be a CommandPolicy, got {policy!r}"
            )
        if approve is not None and not callable(approve):
            raise ConfigError(f"workspace_tools: approve must be callable, got {approve!r}")
        self._cwd = str(workspace.root)
        self._writable = workspace.writable_names
        self._watch = watch
        self._texts = texts
        self._timeout_s = timeout_s
        self._max_chars = max_chars
        self._policy = policy
        self._approve = approve
        self._program, self.shell_name = default_shell()

    def needs_person(self, command: str) -> bool:
        """The policy says ``prompt`` for ``command`` and there is no approver to ask: the
        call waits for a person's decision through the journal (the run parks)."""
        return self._approve is None and self._policy.decide(command).decision == "prompt"

    async def __call__(
        self, command: str, approved_by: str | None = None, budget_s: float | None = None
    ) -> str | Outcome:
        """Run ``command`` (``budget_s``: the run's time budget, ``ToolContext.timeout_s``:
        the command is killed at the smaller of it and the shell's timeout, reported alike)."""
        t = self._texts
        if not command.strip():
            return Refused(t.shell_empty).outcome()
        if "\x00" in command:
            return Refused(t.shell_nul).outcome()
        verdict = self._policy.decide(command)
        refusal = await self._check(verdict, command, approved_by)
        if refusal is not None:
            return Refused(refusal).outcome()
        timeout_s = within(self._timeout_s, budget_s)
        assert timeout_s is not None
        watch = self._watch
        before = await in_thread(watch.snapshot) if watch.active else None
        result = await run_shell(
            command,
            program=self._program,
            cwd=self._cwd,
            timeout_s=timeout_s,
            max_chars=self._max_chars,
        )
        if before is None:
            return self._observation(result, timeout_s, (), ())
        edits, outside = await in_thread(watch.changes, before)
        return self._observation(result, timeout_s, edits, outside)

    async def _check(self, verdict: Verdict, command: str, approved_by: str | None) -> str | None:
        """None if the command may run, else the refusal (``approved_by``: a person approved
        this very call through the journal)."""
        if verdict.decision == "allow":
            return None
        t = self._texts
        rule = verdict.rule
        if rule is None:
            named = t.policy_default.format(decision=verdict.decision)
            reason = ""
        else:
            named = t.policy_rule.format(pattern=rule.pattern, decision=rule.decision)
            reason = f" {rule.reason}" if rule.reason else ""
        if verdict.decision == "forbid":
            return t.shell_forbidden.format(rule=named, reason=reason)
        if self._approve is None:
            if approved_by is not None:
                return None
            return t.shell_no_approver.format(rule=named, reason=reason)
        try:
            approved = await _ask(self._approve, command)
        except Exception as exc:
            return t.shell_approval_failed.format(rule=named, error=f"{type(exc).__name__}: {exc}")
        if approved is not True:
            return t.shell_declined.format(rule=named, reason=reason)
        return None

    def _observation(
        self,
        result: ShellResult,
        timeout_s: float,
        edits: tuple[FileEdit, ...],
        outside: tuple[str, ...],
    ) -> str | Outcome:
        t = self._texts
        body = result.head
        if result.omitted:
            body += t.shell_omitted.format(omitted=result.omitted)
        body += result.tail
        if not body:
            body = t.shell_no_output
        count = self._processes
        if result.timed_out and not result.whole_tree:
            status = t.shell_timeout_group.format(timeout_s=timeout_s)
        elif result.timed_out and result.unkillable:
            status = t.shell_timeout_partial.format(
                timeout_s=timeout_s,
                processes=count(result.killed),
                unkillable=count(result.unkillable),
            )
        elif result.timed_out:
            status = t.shell_timeout.format(timeout_s=timeout_s, processes=count(result.killed))
        else:
            if result.returncode is not None and result.returncode < 0:
                status = t.shell_signal.format(signal=-result.returncode)
            else:
                status = t.shell_exit.format(code=result.returncode)
            if result.killed:
                status += "\n" + t.shell_leftovers.format(processes=count(result.killed))
            if result.unkillable:
                status += "\n" + t.shell_unkillable.format(processes=count(result.unkillable))
        text = body + ("" if body.endswith("\n") else "\n") + status
        if outside:
            more = len(outside) - _OUTSIDE_SHOWN
            files = ", ".join(outside[:_OUTSIDE_SHOWN]) + (f" and {more} more" if more > 0 else "")
            text += "\n" + t.shell_outside_writable.format(paths=self._writable, files=files)
        failures = _test_failures(result)
        if result.omitted or failures or edits:
            return Outcome(
                ActionStatus.executed,
                text,
                truncated_chars=result.omitted,
                failures=failures,
                edits=edits,
            )
        return text

    def _processes(self, count: int) -> str:
        t = self._texts
        return t.shell_process_one if count == 1 else t.shell_process_many.format(count=count)


def _test_failures(result: ShellResult) -> tuple[Failure, ...]:
    """The failures for the failure guard (kernel.md §10): the failing tests of a command
    that exited non-zero and printed a pytest or unittest report (the first is the one it
    counts), else ().

    Other failing commands get none, on purpose: a ``Failure`` has no field for the command, so
    one made from an exit code or the last line of output would give ``make lint`` and
    ``make build`` (any two commands that end "Error 2") one fingerprint, and the guard would
    stop a run that is making progress. A timeout or a signal ends a test run before its
    report, so those get none either."""
    if result.timed_out or result.returncode is None or result.returncode <= 0:
        return ()
    output = result.head + (_CUT if result.omitted else "") + result.tail
    report = extract_failures(output)
    return () if report is None else report.failures


async def _ask(approve: Approver, command: str) -> object:
    if inspect.iscoroutinefunction(approve):
        return await approve(command)
    return await in_thread(approve, command)
