"""Every model-visible string the workspace tools write, in one overridable, versioned set.

The tool descriptions (and their ``Args:`` sections, which become the parameter descriptions
of the schema) and every refusal or note the tools produce live here. Like
:class:`polyloop.types.Templates`, this wording is part of an experiment's treatment: override
with ``dataclasses.replace(DEFAULT_BUILTIN_TEXTS, version="mine-1", ...)``, pass the result to
``workspace_tools(texts=...)``, and change ``version`` whenever you change a string.

Placeholders use ``str.format`` names listed next to each field. Paths are shown as the model
wrote them (``{path!r}``), listings and matches relative to the workspace root.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_BUILTIN_TEXTS", "BuiltinTexts"]


@dataclass(frozen=True, slots=True)
class BuiltinTexts:
    """The model-visible wording of the workspace tools. Fields name their placeholders."""

    version: str = "polyloop-builtin-2"

    # --- tool descriptions (the docstrings the registry turns into specs) ---------------------

    read_file_doc: str = (
        "Read a UTF-8 text file in the workspace and return its text exactly as stored (no "
        "line numbers are added). Output longer than {max_output_chars} characters is cut at "
        "a line boundary, with a note giving the offset to continue from.\n"
        "\n"
        "Args:\n"
        "    path: the file's path, relative to the workspace root.\n"
        "    offset: the number of lines to skip before reading (0 starts at line 1, 99 at "
        "line 100).\n"
        "    limit: the most lines to return; omit it to read to the end of the file.\n"
    )
    """Placeholders: ``max_output_chars``."""
    write_file_doc: str = (
        "Create a text file in the workspace, or replace all of an existing file's text, with "
        "exactly `content` (UTF-8); missing parent directories are created. To change part of "
        "an existing file, use edit_file instead.{writable}\n"
        "\n"
        "Args:\n"
        "    path: the file's path, relative to the workspace root.\n"
        "    content: the complete new text of the file.\n"
    )
    """Placeholders: ``writable`` (:attr:`writable_note` or "")."""
    edit_file_doc: str = (
        "Replace one exact piece of text in a file of the workspace. `old` must occur exactly "
        "once in the file: copy it from read_file's output character for character (including "
        "indentation and line breaks), with enough surrounding lines to make it unique. If it "
        "occurs zero times or several times, nothing is changed. Files larger than "
        "{max_file_mib} MiB are refused.{writable}\n"
        "\n"
        "Args:\n"
        "    path: the file's path, relative to the workspace root.\n"
        "    old: the exact text to replace; it must occur exactly once in the file.\n"
        "    new: the text to put in its place (empty to delete `old`).\n"
    )
    """Placeholders: ``writable`` (:attr:`writable_note` or ""), ``max_file_mib``."""
    list_files_doc: str = (
        "List the files under a directory of the workspace, recursively: one path per line, "
        "relative to the workspace root, sorted. `.git` directories are skipped; symbolic "
        "links are shown as `link -> target` and not followed. Output longer than "
        "{max_output_chars} characters is cut.\n"
        "\n"
        "Args:\n"
        "    path: the directory to list (or a single file), relative to the workspace root.\n"
        '    pattern: only list files matching this glob, e.g. "*.py". A pattern without "/" '
        'matches file names; one with "/" matches the path below `path`. "*" and "?" never '
        'match "/"; "**" matches any number of directories.\n'
    )
    """Placeholders: ``max_output_chars``."""
    grep_doc: str = (
        "Search the text files under a path of the workspace for a regular expression (Python "
        "`re` syntax), line by line. Each match is printed as `path:line_number:line` (paths "
        "relative to the workspace root, sorted; lines are numbered from 1 and long lines are "
        "shortened). Binary files, files larger than {max_file_mib} MiB and `.git` directories "
        "are skipped. Output longer than {max_output_chars} characters is cut.\n"
        "\n"
        "Args:\n"
        "    pattern: the regular expression to search each line for.\n"
        "    path: a directory to search recursively, or one file, relative to the workspace "
        "root.\n"
        '    glob: only search files matching this glob, e.g. "*.py" (the same rules as '
        "list_files' pattern).\n"
    )
    """Placeholders: ``max_output_chars``, ``max_file_mib``."""
    shell_doc: str = (
        "Run a command with {shell} in the workspace root directory and return its combined "
        "stdout and stderr, followed by its exit code. The command is killed, with every "
        "process it started, after {timeout_s:g} seconds, and background processes it leaves "
        "behind are killed when it returns: do not start servers or interactive programs (stdin "
        "is empty). Of output longer than {max_output_chars} characters, only the beginning "
        "and the end are shown. The workspace may refuse some commands or ask a person to "
        "approve them.\n"
        "\n"
        "Args:\n"
        '    command: the command line to run, e.g. "python -m pytest -q tests".\n'
    )
    """Placeholders: ``shell`` ("bash" or "sh"), ``timeout_s``, ``max_output_chars``."""
    writable_note: str = " Only these paths may be written: {paths}."
    """Appended to the write tools' descriptions when ``writable_paths`` is set.
    Placeholders: ``paths`` (comma-separated)."""
    nothing_writable: str = "none (the workspace is read-only)"
    """What ``paths`` says when ``writable_paths`` is empty."""

    # --- paths ----------------------------------------------------------------------------

    path_nul: str = (
        "Error: the path {path!r} contains a NUL character, which no file name can contain; "
        "nothing was done. Use a plain path relative to the workspace root."
    )
    """Placeholders: ``path``."""
    path_parent: str = (
        "Error: the path {path!r} leads outside the workspace (through '..'); nothing was "
        "done. Only files inside the workspace can be used: give a path relative to the "
        "workspace root, e.g. 'src/app.py'."
    )
    """Placeholders: ``path``."""
    path_absolute: str = (
        "Error: the absolute path {path!r} is outside the workspace; nothing was done. Only "
        "files inside the workspace can be used: give a path relative to the workspace root, "
        "e.g. 'src/app.py'."
    )
    """Placeholders: ``path``."""
    path_symlink: str = (
        "Error: the path {path!r} goes through a symbolic link that points outside the "
        "workspace; nothing was done. Only files inside the workspace can be used."
    )
    """Placeholders: ``path``."""
    path_links: str = (
        "Error: the path {path!r} goes through too many symbolic links (more than 40: a "
        "loop?); nothing was done."
    )
    """Placeholders: ``path``."""
    path_changed: str = (
        "Error: {path!r} was replaced while it was being used (something is renaming files "
        "in the workspace); nothing was done. Try again."
    )
    """Placeholders: ``path``."""
    not_writable: str = (
        "Error: writing to {path!r} is not allowed; nothing was done. Only these paths may be "
        "written: {paths}. Keep your changes inside them."
    )
    """Placeholders: ``path``, ``paths`` (comma-separated, or :attr:`nothing_writable`)."""
    shell_outside_writable: str = (
        "Note: this command changed files outside the paths that may be written ({paths}): "
        "{files}. They were not undone. Restore them if you can, and change only files "
        "inside those paths."
    )
    """Appended to a shell command's output when it created, changed or deleted files outside
    ``writable_paths``. Placeholders: ``paths`` (as in :attr:`not_writable`), ``files`` (the
    first 10 paths, comma-separated, then ``and N more``)."""
    not_found: str = (
        "Error: there is no file or directory {path!r} in the workspace; nothing was done. "
        "Use list_files to see which files exist."
    )
    """Placeholders: ``path``."""
    is_directory: str = (
        "Error: {path!r} is a directory, not a file; nothing was done. Use list_files to see "
        "the files in it."
    )
    """Placeholders: ``path``."""
    not_regular: str = (
        "Error: {path!r} is not a regular file (it is a device, a pipe or a socket); nothing "
        "was done."
    )
    """Placeholders: ``path``."""
    parent_not_directory: str = (
        "Error: cannot create {path!r}: a part of its parent path is a file, not a directory; "
        "nothing was done."
    )
    """Placeholders: ``path``."""
    os_error: str = "Error: cannot access {path!r}: {reason}; nothing was done."
    """Placeholders: ``path``, ``reason`` (the operating system's words)."""

    # --- read_file ------------------------------------------------------------------------

    binary_file: str = (
        "Error: {path!r} is a binary file ({size} bytes), not text; read_file shows UTF-8 "
        "text only. Nothing was read."
    )
    """Placeholders: ``path``, ``size`` (bytes)."""
    not_utf8: str = (
        "Error: {path!r} is not UTF-8 text ({size} bytes; the first invalid byte is at byte "
        "offset {position}); read_file shows UTF-8 text only. Nothing was read."
    )
    """Placeholders: ``path``, ``size`` (bytes), ``position`` (0-based byte offset)."""
    empty_file: str = "[{path!r} is an empty file]"
    """Placeholders: ``path``."""
    past_end: str = (
        "Error: offset={offset} is past the end of {path!r}, which has {lines} lines; "
        "nothing was read. Use an offset below {lines}."
    )
    """Placeholders: ``offset``, ``path``, ``lines``."""
    read_cut: str = (
        "[... {cut} more characters not shown. To read on, call read_file with "
        "offset={next_offset}.]"
    )
    """Placeholders: ``cut``, ``next_offset``."""
    read_cut_long_line: str = (
        "[... {cut} more characters not shown. The line at offset={line} is longer than "
        "{max_output_chars} characters and was cut; use grep to find text in it. To read on, "
        "call read_file with offset={next_offset}.]"
    )
    """Placeholders: ``cut``, ``line`` (the offset of the line that was cut),
    ``max_output_chars``, ``next_offset``."""

    # --- write_file and edit_file ------------------------------------------------------------

    bad_unicode: str = (
        "Error: the text for {path!r} cannot be written as UTF-8 ({reason}); nothing was "
        "written. Send plain Unicode text."
    )
    """Placeholders: ``path``, ``reason``."""
    created: str = "Created {path!r}: {chars} characters in {lines} line(s)."
    """Placeholders: ``path``, ``chars``, ``lines``."""
    overwritten: str = "Replaced all of {path!r}: now {chars} characters in {lines} line(s)."
    """Placeholders: ``path``, ``chars``, ``lines``."""
    edit_binary: str = (
        "Error: {path!r} is not UTF-8 text ({size} bytes); edit_file changes text files "
        "only. Nothing was changed."
    )
    """Placeholders: ``path``, ``size``."""
    edit_too_large: str = (
        "Error: {path!r} is {size} bytes; edit_file changes files of up to {max_mib} MiB. "
        "Nothing was changed. Change a file this large with a command (e.g. sed) if you have "
        "a shell."
    )
    """Placeholders: ``path``, ``size`` (bytes), ``max_mib``."""
    edit_empty_old: str = (
        "Error: `old` is empty; nothing was changed. Give the exact text to replace, or use "
        "write_file to write a whole file."
    )
    edit_not_found: str = (
        "Error: `old` does not occur in {path!r}; nothing was changed. Read the file again "
        "and copy the text exactly, including whitespace, indentation and line breaks.{hint}"
    )
    """Placeholders: ``path``, ``hint`` (:attr:`edit_crlf_hint` or "")."""
    edit_crlf_hint: str = " The file uses Windows line endings (\\r\\n); `old` must use them too."
    edit_ambiguous: str = (
        "Error: `old` occurs {count} times in {path!r} (starting at lines {lines}); nothing "
        "was changed. Include more of the surrounding lines in `old` so that it occurs "
        "exactly once."
    )
    """Placeholders: ``count``, ``path``, ``lines`` (1-based, comma-separated)."""
    edit_unchanged: str = (
        "Error: `old` and `new` are the same text; nothing was changed. Put the changed text "
        "in `new`."
    )
    edited: str = (
        "Edited {path!r}: the text starting at line {line} ({old_lines} line(s)) was replaced "
        "by {new_lines} line(s)."
    )
    """Placeholders: ``path``, ``line`` (1-based), ``old_lines``, ``new_lines``."""

    # --- list_files and grep -----------------------------------------------------------------

    list_empty: str = "[no files under {path!r}]"
    """Placeholders: ``path``."""
    list_empty_pattern: str = "[no files matching {pattern!r} under {path!r}]"
    """Placeholders: ``pattern``, ``path``."""
    list_cut: str = (
        "[... {more} more entries ({cut} characters) not shown. Narrow the listing with path "
        "or pattern.]"
    )
    """Placeholders: ``more``, ``cut``."""
    bad_regex: str = (
        "Error: {pattern!r} is not a valid regular expression ({reason}); nothing was searched. "
        "Use Python `re` syntax and escape special characters such as ( [ . * with a backslash."
    )
    """Placeholders: ``pattern``, ``reason``."""
    grep_none: str = (
        "[no matches for {pattern!r} under {path!r}: {files} files searched, {binary} binary "
        "files skipped]"
    )
    """Placeholders: ``pattern``, ``path``, ``files``, ``binary``."""
    grep_cut: str = (
        "[... {more} more matching lines ({cut} characters) not shown. Narrow the search with "
        "path, glob or a more specific pattern.]"
    )
    """Placeholders: ``more``, ``cut``."""
    grep_line_cut: str = "…"
    """Marks a matching line shortened to fit."""
    grep_too_large: str = (
        "Error: {path!r} is {size} bytes; grep searches files of up to {max_mib} MiB. "
        "Nothing was searched. Search it with a command (e.g. grep -n) if you have a shell, "
        "or read parts of it with read_file's offset and limit."
    )
    """Placeholders: ``path``, ``size`` (bytes), ``max_mib``."""
    grep_skipped_large: str = (
        "[{count} file(s) larger than {max_mib} MiB not searched: {names}. Search them with a "
        "command (e.g. grep -n) if you have a shell.]"
    )
    """Placeholders: ``count``, ``max_mib``, ``names`` (comma-separated, at most five, then
    "...")."""
    names_not_utf8: str = (
        "[names shown with \ufffd contain bytes that are not UTF-8 (one \ufffd for each); "
        "the file tools cannot open them by the name shown]"
    )
    """Added once to a listing or search that shows such a name."""

    # --- shell ----------------------------------------------------------------------------

    shell_empty: str = "Error: the command is empty; nothing was run. Give a command line."
    shell_nul: str = (
        "Error: the command contains a NUL character, which a command line cannot contain; "
        "nothing was run."
    )
    shell_forbidden: str = (
        "Error: the command was not run: the workspace forbids it ({rule}).{reason} Do not "
        "retry it; use another command."
    )
    """Placeholders: ``rule`` (:attr:`policy_rule` or :attr:`policy_default`), ``reason``
    (" " + the rule's reason, or "")."""
    shell_no_approver: str = (
        "Error: the command was not run: it needs a person's approval ({rule}) and nobody is "
        "available to approve it.{reason} Use another command."
    )
    """Placeholders: ``rule``, ``reason``."""
    shell_declined: str = (
        "Error: the command was not run: it needs a person's approval ({rule}) and was "
        "declined.{reason} Use another command."
    )
    """Placeholders: ``rule``, ``reason``."""
    shell_approval_failed: str = (
        "Error: the command was not run: it needs a person's approval ({rule}) and asking for "
        "it failed ({error}). Use another command."
    )
    """Placeholders: ``rule``, ``error``."""
    policy_rule: str = "rule `{pattern}`: {decision}"
    """How a matching rule is named. Placeholders: ``pattern``, ``decision``."""
    policy_default: str = "no rule matched; the default is {decision}"
    """How the policy's default is named. Placeholders: ``decision``."""
    shell_no_output: str = "[no output]"
    shell_omitted: str = "\n[... {omitted} characters of output omitted ...]\n"
    """Placeholders: ``omitted``."""
    shell_exit: str = "[exit code {code}]"
    """Placeholders: ``code``."""
    shell_signal: str = "[killed by signal {signal}]"
    """Placeholders: ``signal`` (its number)."""
    shell_timeout: str = (
        "[timed out after {timeout_s:g} seconds; killed {processes}: the command and every "
        "process it started that was still running]"
    )
    """Placeholders: ``timeout_s``, ``processes`` (:attr:`shell_process_one` or
    :attr:`shell_process_many`)."""
    shell_timeout_partial: str = (
        "[timed out after {timeout_s:g} seconds; killed {processes}; {unkillable} the command "
        "started could not be killed (not permitted) and may still run]"
    )
    """The timeout when some processes changed user (e.g. through ``sudo``) and could not be
    killed. Placeholders: ``timeout_s``, ``processes``, ``unkillable`` (like ``processes``)."""
    shell_timeout_group: str = (
        "[timed out after {timeout_s:g} seconds; killed the command and its process group "
        "(processes that left the group may still run)]"
    )
    """The timeout on a system where the shell finds only the command's process group (not
    Linux). Placeholders: ``timeout_s``."""
    shell_leftovers: str = "[killed {processes} the command left running in the background]"
    """After ``shell_exit`` or ``shell_signal``, when the command returned and left processes
    running. Placeholders: ``processes``."""
    shell_unkillable: str = (
        "[{processes} the command left running could not be killed (not permitted) and may "
        "still run]"
    )
    """After ``shell_leftovers`` (or the exit code), for processes that changed user (e.g.
    through ``sudo``). Placeholders: ``processes``."""
    shell_process_one: str = "1 process"
    shell_process_many: str = "{count} processes"
    """Placeholders: ``count`` (2 or more)."""


DEFAULT_BUILTIN_TEXTS = BuiltinTexts()
