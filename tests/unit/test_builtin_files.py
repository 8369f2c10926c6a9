"""Workspace tools: read_file, write_file, edit_file, list_files and grep."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from polyloop import Loop, ModelReply, StopReason, ToolCall
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from polyloop.tools import ToolEnvironment, ToolRegistry
from polyloop.tools.builtin import TOOL_NAMES, workspace_tools
from polyloop.types import (
    Action,
    ActionStatus,
    ConfigError,
    FileEdit,
    Outcome,
    ReplayPolicy,
    ToolContext,
)

CTX = ToolContext("run-1", 0, "op-1")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    (r / "src" / "pkg").mkdir(parents=True)
    (r / "src" / "app.py").write_text("import os\n\ndef main():\n    return os.getcwd()\n")
    (r / "src" / "pkg" / "util.py").write_text("def helper():\n    return 42\n")
    (r / "README.md").write_text("# Demo\nRun main().\n")
    return r


@pytest.fixture
def env(root: Path) -> ToolEnvironment:
    return ToolEnvironment(workspace_tools(root, shell=False))


async def call(env: ToolEnvironment, tool: str, **args: Any) -> Outcome:
    return await env.execute(Action(f"{tool}(...)", tool, args), CTX)


def refused(outcome: Outcome, *fragments: str) -> None:
    assert outcome.status is ActionStatus.not_executed, outcome.observation
    assert outcome.synthetic
    for fragment in fragments:
        assert fragment in outcome.observation


# --- replay policies and registration --------------------------------------------------------


def test_replay_policies_are_declared_honestly(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root))
    args = {
        "read_file": {"path": "README.md"},
        "write_file": {"path": "x", "content": ""},
        "edit_file": {"path": "x", "old": "a", "new": "b"},
        "list_files": {},
        "grep": {"pattern": "x"},
        "shell": {"command": "true"},
    }
    policies = {
        name: env.replay_policy(Action(name, name, args[name])) for name in env.registry.names()
    }
    assert policies == {
        "read_file": ReplayPolicy.idempotent,
        "write_file": ReplayPolicy.never,
        "edit_file": ReplayPolicy.never,
        "list_files": ReplayPolicy.idempotent,
        "grep": ReplayPolicy.idempotent,
        "shell": ReplayPolicy.never,
    }


def test_tools_are_registered_in_order_on_a_given_registry(root: Path) -> None:
    registry = ToolRegistry()

    @registry.tool
    def submit(answer: str) -> str:
        """Submit the answer."""
        return answer

    assert workspace_tools(root, registry=registry) is registry
    assert registry.names() == ("submit", *TOOL_NAMES)
    assert workspace_tools(root, shell=False).names() == TOOL_NAMES[:-1]


def test_a_name_clash_registers_nothing(root: Path) -> None:
    registry = workspace_tools(root, shell=False)
    with pytest.raises(ConfigError, match="already has tools named"):
        workspace_tools(root, registry=registry)
    assert registry.names() == TOOL_NAMES[:-1]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_output_chars": 0},
        {"max_output_chars": 99},
        {"max_output_chars": 1.5e4},
        {"shell_timeout_s": 0},
        {"shell_timeout_s": -1.0},
        {"shell_timeout_s": float("inf")},
        {"shell_timeout_s": True},
    ],
)
def test_bad_limits_are_config_errors(root: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        workspace_tools(root, **kwargs)


# --- read_file --------------------------------------------------------------------------------


async def test_read_file_returns_the_text_exactly(root: Path, env: ToolEnvironment) -> None:
    (root / "crlf.txt").write_bytes("naïve\r\nline two\r\nno newline at end".encode())
    outcome = await call(env, "read_file", path="crlf.txt")
    assert outcome == Outcome(
        ActionStatus.executed, "naïve\r\nline two\r\nno newline at end", synthetic=False
    )


async def test_read_file_offset_and_limit_count_lines(root: Path, env: ToolEnvironment) -> None:
    (root / "n.txt").write_text("".join(f"line {i}\n" for i in range(10)))
    outcome = await call(env, "read_file", path="n.txt", offset=3, limit=2)
    assert outcome.observation == "line 3\nline 4\n"
    outcome = await call(env, "read_file", path="n.txt", offset=8)
    assert outcome.observation == "line 8\nline 9\n"
    outcome = await call(env, "read_file", path="n.txt", offset=9, limit=100)
    assert outcome.observation == "line 9\n"


async def test_read_file_past_the_end_says_how_many_lines(root: Path, env: ToolEnvironment) -> None:
    (root / "n.txt").write_text("a\nb\nc")
    refused(
        await call(env, "read_file", path="n.txt", offset=3),
        "offset=3 is past the end of 'n.txt', which has 3 lines",
    )


async def test_read_file_of_an_empty_file_says_so(root: Path, env: ToolEnvironment) -> None:
    (root / "empty.txt").write_text("")
    outcome = await call(env, "read_file", path="empty.txt")
    assert outcome == Outcome(ActionStatus.executed, "['empty.txt' is an empty file]")


async def test_read_file_of_missing_files_and_directories_is_refused(
    env: ToolEnvironment,
) -> None:
    refused(await call(env, "read_file", path="nope.py"), "no file or directory 'nope.py'")
    refused(await call(env, "read_file", path="README.md/x"), "no file or directory")
    refused(await call(env, "read_file", path="src"), "'src' is a directory", "list_files")
    refused(await call(env, "read_file", path=""), "'' is a directory")


async def test_read_file_of_a_fifo_is_refused_without_blocking(
    root: Path, env: ToolEnvironment
) -> None:
    os.mkfifo(root / "pipe")
    refused(await call(env, "read_file", path="pipe"), "not a regular file")
    refused(await call(env, "edit_file", path="pipe", old="a", new="b"), "not a regular file")
    refused(await call(env, "write_file", path="pipe", content=""), "not a regular file")
    outcome = await call(env, "grep", pattern="x")  # skips it
    assert outcome.status is ActionStatus.executed


async def test_binary_file_is_described_with_its_size_not_read(
    root: Path, env: ToolEnvironment
) -> None:
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    outcome = await call(env, "read_file", path="logo.png")
    assert outcome == Outcome(
        ActionStatus.not_executed,
        "Error: 'logo.png' is a binary file (272 bytes), not text; read_file shows UTF-8 text "
        "only. Nothing was read.",
        synthetic=True,
    )


async def test_non_utf8_file_is_described_with_the_bad_byte(
    root: Path, env: ToolEnvironment
) -> None:
    (root / "latin1.txt").write_bytes("line one\ncafé au lait\n".encode("latin-1"))
    outcome = await call(env, "read_file", path="latin1.txt")
    refused(
        outcome,
        "'latin1.txt' is not UTF-8 text (22 bytes; the first invalid byte is at byte offset 12)",
    )
    # a multi-byte character cut at the very end of the file
    (root / "cut.txt").write_bytes(b"ok " + "é".encode()[:1])
    refused(await call(env, "read_file", path="cut.txt"), "byte offset 3")
    # a bad byte far beyond the first chunk, in the lines asked for
    (root / "late.txt").write_bytes(b"a\n" * 100_000 + b"\xff\n")
    refused(await call(env, "read_file", path="late.txt", offset=100_000), "byte offset 200000")


async def test_an_enormous_file_is_cut_on_a_line_boundary_and_counted(
    root: Path, env: ToolEnvironment
) -> None:
    lines = [f"line {i:07d}\n" for i in range(200_000)]  # 13 characters each
    (root / "big.log").write_text("".join(lines))
    outcome = await call(env, "read_file", path="big.log")
    shown = 20_000 // 13  # whole lines that fit
    content = "".join(lines[:shown])
    assert outcome.status is ActionStatus.executed
    assert not outcome.synthetic
    assert outcome.truncated_chars == 200_000 * 13 - len(content)
    assert outcome.observation == (
        content + f"[... {outcome.truncated_chars} more characters not shown. To read on, call "
        f"read_file with offset={shown}.]"
    )
    following = await call(env, "read_file", path="big.log", offset=shown, limit=2)
    assert following.observation == lines[shown] + lines[shown + 1]
    # with a limit, only the selected lines count as cut
    limited = await call(env, "read_file", path="big.log", offset=10, limit=2000)
    assert limited.truncated_chars == 2000 * 13 - len("".join(lines[10 : 10 + shown]))


async def test_an_enormous_line_is_cut_inside_and_counted(root: Path, env: ToolEnvironment) -> None:
    (root / "min.js").write_text("é" * 1_000_000 + "\nsecond\n")
    outcome = await call(env, "read_file", path="min.js")
    # the rest was never read, so it is counted in bytes: 2 for each "é"
    assert outcome.truncated_chars == 2_000_000 + 1 + 7 - 2 * 20_000
    assert outcome.observation == "é" * 20_000 + (
        f"\n[... {outcome.truncated_chars} more characters not shown. The line at offset=0 is "
        "longer than 20000 characters and was cut; use grep to find text in it. To read on, "
        "call read_file with offset=1.]"
    )
    assert (await call(env, "read_file", path="min.js", offset=1)).observation == "second\n"


async def test_max_output_chars_applies(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root, shell=False, max_output_chars=100))
    (root / "t.txt").write_text("0123456789\n" * 20)
    outcome = await call(env, "read_file", path="t.txt")
    assert outcome.truncated_chars == 220 - 99
    assert outcome.observation.startswith("0123456789\n" * 9 + "[... 121 more characters")


# --- write_file -------------------------------------------------------------------------------


async def test_write_file_creates_parents_and_writes_exactly(
    root: Path, env: ToolEnvironment
) -> None:
    outcome = await call(env, "write_file", path="docs/guide/intro.md", content="a\r\nb\n")
    assert outcome == Outcome(
        ActionStatus.executed,
        "Created 'docs/guide/intro.md': 5 characters in 2 line(s).",
        edits=(FileEdit("docs/guide/intro.md"),),
    )
    assert (root / "docs" / "guide" / "intro.md").read_bytes() == b"a\r\nb\n"
    outcome = await call(env, "write_file", path="README.md", content="ünï")
    assert outcome.observation == "Replaced all of 'README.md': now 3 characters in 1 line(s)."
    assert (root / "README.md").read_text(encoding="utf-8") == "ünï"


async def test_write_file_refuses_directories_and_file_parents(
    root: Path, env: ToolEnvironment
) -> None:
    refused(await call(env, "write_file", path="src", content="x"), "'src' is a directory")
    refused(
        await call(env, "write_file", path="README.md/x.txt", content="x"),
        "a part of its parent path is a file",
    )
    assert (root / "README.md").read_text() == "# Demo\nRun main().\n"


async def test_write_file_with_unencodable_text_leaves_the_file_alone(
    root: Path, env: ToolEnvironment
) -> None:
    refused(
        await call(env, "write_file", path="README.md", content="bad \ud800 surrogate"),
        "cannot be written as UTF-8",
    )
    assert (root / "README.md").read_text() == "# Demo\nRun main().\n"


# --- edit_file --------------------------------------------------------------------------------


async def test_edit_file_replaces_the_one_occurrence(root: Path, env: ToolEnvironment) -> None:
    outcome = await call(
        env, "edit_file", path="src/app.py", old="    return os.getcwd()\n", new="    return 1\n"
    )
    assert outcome == Outcome(
        ActionStatus.executed,
        "Edited 'src/app.py': the text starting at line 4 (1 line(s)) was replaced by 1 line(s).",
        edits=(FileEdit("src/app.py"),),
    )
    assert (root / "src" / "app.py").read_text() == "import os\n\ndef main():\n    return 1\n"


async def test_edit_file_with_no_occurrence_changes_nothing(
    root: Path, env: ToolEnvironment
) -> None:
    outcome = await call(env, "edit_file", path="src/app.py", old="return  os", new="x")
    assert outcome == Outcome(
        ActionStatus.not_executed,
        "Error: `old` does not occur in 'src/app.py'; nothing was changed. Read the file again "
        "and copy the text exactly, including whitespace, indentation and line breaks.",
        synthetic=True,
    )
    assert (root / "src" / "app.py").read_text().endswith("return os.getcwd()\n")


async def test_edit_file_with_two_occurrences_changes_nothing_and_says_where(
    root: Path, env: ToolEnvironment
) -> None:
    (root / "dup.py").write_text("x = 1\ny = 2\nx = 1\n")
    outcome = await call(env, "edit_file", path="dup.py", old="x = 1", new="x = 3")
    assert outcome == Outcome(
        ActionStatus.not_executed,
        "Error: `old` occurs 2 times in 'dup.py' (starting at lines 1, 3); nothing was "
        "changed. Include more of the surrounding lines in `old` so that it occurs exactly "
        "once.",
        synthetic=True,
    )
    assert (root / "dup.py").read_text() == "x = 1\ny = 2\nx = 1\n"
    (root / "many.py").write_text("a\n" * 12)
    outcome = await call(env, "edit_file", path="many.py", old="a", new="b")
    refused(outcome, "occurs 12 times", "lines 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ...")


async def test_edit_file_other_refusals(root: Path, env: ToolEnvironment) -> None:
    refused(await call(env, "edit_file", path="README.md", old="", new="x"), "`old` is empty")
    refused(
        await call(env, "edit_file", path="README.md", old="Demo", new="Demo"),
        "`old` and `new` are the same text",
    )
    refused(await call(env, "edit_file", path="nope.md", old="a", new="b"), "no file")
    (root / "win.txt").write_bytes(b"one\r\ntwo\r\n")
    refused(
        await call(env, "edit_file", path="win.txt", old="one\ntwo", new="x"),
        "Windows line endings",
    )
    (root / "blob.bin").write_bytes(b"ab\x00cd")
    refused(await call(env, "edit_file", path="blob.bin", old="ab", new="x"), "not UTF-8 text")
    assert (root / "blob.bin").read_bytes() == b"ab\x00cd"
    assert (root / "README.md").read_text() == "# Demo\nRun main().\n"


async def test_edit_file_can_delete(root: Path, env: ToolEnvironment) -> None:
    outcome = await call(env, "edit_file", path="README.md", old="Run main().\n", new="")
    assert outcome.status is ActionStatus.executed
    assert (root / "README.md").read_text() == "# Demo\n"


# --- list_files -------------------------------------------------------------------------------


async def test_list_files_is_sorted_recursive_and_skips_git(
    root: Path, env: ToolEnvironment
) -> None:
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref")
    (root / ".env").write_text("")
    (root / "src" / "link.py").symlink_to(root / "src" / "app.py")
    (root / "gone").symlink_to(root / "missing.txt")
    (root / "pkgs").symlink_to(root / "src" / "pkg", target_is_directory=True)
    (root / "empty").mkdir()
    outcome = await call(env, "list_files")
    assert outcome == Outcome(
        ActionStatus.executed,
        "\n".join(
            [
                ".env",
                "README.md",
                "gone -> missing.txt (missing)",
                "pkgs -> src/pkg/",
                "src/app.py",
                "src/link.py -> src/app.py",
                "src/pkg/util.py",
            ]
        ),
    )


async def test_list_files_of_a_subdirectory_and_a_file(env: ToolEnvironment) -> None:
    outcome = await call(env, "list_files", path="src/pkg")
    assert outcome.observation == "src/pkg/util.py"
    outcome = await call(env, "list_files", path="src/app.py")
    assert outcome.observation == "src/app.py"
    refused(await call(env, "list_files", path="nope"), "no file or directory 'nope'")


async def test_list_files_patterns(env: ToolEnvironment) -> None:
    names = (await call(env, "list_files", pattern="*.py")).observation
    assert names == "src/app.py\nsrc/pkg/util.py"
    nested = (await call(env, "list_files", path="src", pattern="pkg/*.py")).observation
    assert nested == "src/pkg/util.py"
    top = (await call(env, "list_files", path="src", pattern="*/*.py")).observation
    assert top == "src/pkg/util.py"
    deep = (await call(env, "list_files", pattern="**/u*.py")).observation
    assert deep == "src/pkg/util.py"
    none = await call(env, "list_files", pattern="*.rs")
    assert none == Outcome(ActionStatus.executed, "[no files matching '*.rs' under '.']")


async def test_list_files_is_bounded_and_counts_what_it_cut(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root, shell=False, max_output_chars=100))
    for i in range(50):
        (root / f"f{i:03d}.txt").write_text("")
    outcome = await call(env, "list_files", pattern="f*.txt")
    names = [f"f{i:03d}.txt" for i in range(50)]  # 8 characters, 9 with the newline
    kept = names[:11]  # 11 * 9 - 1 = 98 characters
    full = "\n".join(names)
    assert outcome.truncated_chars == len(full) - len("\n".join(kept))
    assert outcome.observation == "\n".join(kept) + (
        f"\n[... 39 more entries ({outcome.truncated_chars} characters) not shown. Narrow the "
        "listing with path or pattern.]"
    )


# --- grep -------------------------------------------------------------------------------------


@pytest.fixture
def tree_with_binary(root: Path, tmp_path: Path) -> Path:
    (root / "data.bin").write_bytes(b"\x00\x01 def helper \x02")
    (root / "notes.txt").write_bytes("def in latin-1: caf\xe9\n".encode("latin-1"))
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("def git\n")
    secret = tmp_path / "secret.py"
    secret.write_text("def stolen(): pass\n")
    (root / "src" / "out.py").symlink_to(secret)
    (root / "src" / "outdir").symlink_to(tmp_path, target_is_directory=True)
    return root


async def test_grep_finds_matches_in_text_files_only(
    tree_with_binary: Path, env: ToolEnvironment
) -> None:
    outcome = await call(env, "grep", pattern=r"\bdef\b")
    assert outcome == Outcome(
        ActionStatus.executed,
        "notes.txt:1:def in latin-1: caf\ufffd\n"
        "src/app.py:3:def main():\n"
        "src/pkg/util.py:1:def helper():",
    )


async def test_grep_path_and_glob(tree_with_binary: Path, env: ToolEnvironment) -> None:
    outcome = await call(env, "grep", pattern="return", path="src", glob="util.py")
    assert outcome.observation == "src/pkg/util.py:2:    return 42"
    outcome = await call(env, "grep", pattern="return", path="src/app.py")
    assert outcome.observation == "src/app.py:4:    return os.getcwd()"


async def test_grep_without_matches_says_what_it_searched(
    tree_with_binary: Path, env: ToolEnvironment
) -> None:
    outcome = await call(env, "grep", pattern="helper", glob="*.bin")
    assert outcome == Outcome(
        ActionStatus.executed,
        "[no matches for 'helper' under '.': 0 files searched, 1 binary files skipped]",
    )


async def test_grep_with_an_invalid_regex_is_refused(env: ToolEnvironment) -> None:
    refused(
        await call(env, "grep", pattern="main("),
        "'main(' is not a valid regular expression (missing ), unterminated subpattern",
    )


async def test_grep_is_bounded_and_counts_what_it_cut(root: Path) -> None:
    env = ToolEnvironment(workspace_tools(root, shell=False, max_output_chars=200))
    (root / "many.txt").write_text("match\n" * 100)
    (root / "wide.txt").write_text("match " + "x" * 1000 + "\n")
    outcome = await call(env, "grep", pattern="match")
    lines = [f"many.txt:{i}:match" for i in range(1, 101)] + ["wide.txt:1:match " + "x" * 1000]
    full = "\n".join(lines)
    shown_lines = [line for i, line in enumerate(lines) if len("\n".join(lines[: i + 1])) <= 200]
    assert outcome.truncated_chars == len(full) - len("\n".join(shown_lines))
    assert outcome.observation.startswith("\n".join(shown_lines) + "\n[... ")
    # one long line alone is shortened, and the cut counted
    outcome = await call(env, "grep", pattern="x+", path="wide.txt")
    line = "wide.txt:1:match " + "x" * 1000
    assert outcome.observation == (line[: len("wide.txt:1:") + 400] + "…")[:200]
    assert outcome.truncated_chars == len(line) - 200


# --- through the loop -------------------------------------------------------------------------


async def test_a_run_records_the_tools_outcomes_in_its_steps(root: Path) -> None:
    (root / "big.txt").write_text("x" * 30_000)

    def call_(name: str, **args: Any) -> ModelReply:
        return ModelReply(tool_calls=(ToolCall(name, args, None),))

    model = ScriptedModel(
        [
            call_("read_file", path="big.txt"),
            call_("read_file", path="../etc/passwd"),
            call_("write_file", path="out.txt", content="done\n"),
            "finished",
        ]
    )
    result = await Loop(model, tools=workspace_tools(root, shell=False)).run("work")
    assert result.stop_reason is StopReason.agent_finished
    read, escape, write, _ = result.steps
    assert read.action_status == "executed"
    assert read.observation_truncated_chars == 10_000
    assert escape.action_status == "not_executed"
    assert escape.observation_synthetic
    assert write.action_status == "executed"
    assert result.actions_executed == 2
    assert (root / "out.txt").read_text() == "done\n"


# --- large files ------------------------------------------------------------------------------


def head_of(path: Path, size: int) -> bytes:
    with path.open("rb") as f:
        return f.read(size)


def sparse_text(path: Path, head: bytes, size: int) -> None:
    """A file of ``size`` bytes that starts with ``head``; the rest is a hole (NUL bytes past
    the first 8 KiB, which is what decides whether a file is binary)."""
    assert len(head) > 8192
    path.write_bytes(head)
    os.truncate(path, size)


async def test_read_file_stops_reading_where_its_output_is_full(
    root: Path, env: ToolEnvironment
) -> None:
    lines = [f"line {i:07d}\n" for i in range(3000)]  # 39,000 characters, over the cap
    head = "".join(lines).encode() + b"\xff"  # not UTF-8, after what is shown
    sparse_text(root / "huge.log", head, 400 << 20)
    outcome = await call(env, "read_file", path="huge.log")
    shown = "".join(lines[: 20_000 // 13])
    # the bad byte was never read; what was not read is counted from the size, in bytes
    assert outcome.truncated_chars == (400 << 20) - len(shown)
    assert outcome.observation == shown + (
        f"[... {outcome.truncated_chars} more characters not shown. To read on, call "
        f"read_file with offset={20_000 // 13}.]"
    )
    # the lines asked for are read (and checked) wherever they are
    refused(
        await call(env, "read_file", path="huge.log", offset=3000, limit=1),
        f"byte offset {len(head) - 1}",
    )


async def test_edit_file_refuses_a_file_over_its_cap_and_leaves_it_alone(
    root: Path, env: ToolEnvironment
) -> None:
    head = b"# big generated file\n" + b"x = 1\n" * 2000
    sparse_text(root / "big.py", head, (10 << 20) + 1)
    outcome = await call(env, "edit_file", path="big.py", old="# big", new="# small")
    assert outcome == Outcome(
        ActionStatus.not_executed,
        "Error: 'big.py' is 10485761 bytes; edit_file changes files of up to 10 MiB. Nothing "
        "was changed. Change a file this large with a command (e.g. sed) if you have a shell.",
        synthetic=True,
    )
    assert (root / "big.py").stat().st_size == (10 << 20) + 1
    assert head_of(root / "big.py", len(head)) == head
    # at the cap it is edited
    os.truncate(root / "big.py", 10 << 20)
    outcome = await call(env, "edit_file", path="big.py", old="# big", new="# small")
    assert outcome.status is ActionStatus.executed, outcome.observation
    assert head_of(root / "big.py", 8) == b"# small "


async def test_grep_skips_files_over_its_cap_and_says_which(
    root: Path, env: ToolEnvironment
) -> None:
    head = b"needle in a large log\n" + b"hay\n" * 3000
    (root / "logs").mkdir()
    sparse_text(root / "logs" / "big.log", head, (10 << 20) + 1)
    (root / "logs" / "small.log").write_text("needle in a small log\n")
    outcome = await call(env, "grep", pattern="needle")
    assert outcome == Outcome(
        ActionStatus.executed,
        "logs/small.log:1:needle in a small log\n"
        "[1 file(s) larger than 10 MiB not searched: logs/big.log. Search them with a command "
        "(e.g. grep -n) if you have a shell.]",
    )
    refused(
        await call(env, "grep", pattern="needle", path="logs/big.log"),
        "'logs/big.log' is 10485761 bytes; grep searches files of up to 10 MiB. Nothing was "
        "searched.",
    )


# --- names that are not UTF-8 -----------------------------------------------------------------


def write_named(root: Path, name: bytes, data: bytes) -> None:
    """Write a file whose name (bytes, relative to ``root``) need not be UTF-8."""
    with open(os.path.join(os.fsencode(root), name), "wb") as f:
        f.write(data)


async def test_names_that_are_not_utf8_are_shown_with_replacement_characters(
    root: Path, env: ToolEnvironment
) -> None:
    os.mkdir(os.path.join(os.fsencode(root), b"data_\xfe"))
    write_named(root, b"data_\xfe/report_\xff.txt", b"total: 3\n")
    note = (
        "[names shown with \ufffd contain bytes that are not UTF-8 (one \ufffd for each); the "
        "file tools cannot open them by the name shown]"
    )
    listing = await call(env, "list_files", pattern="*.txt")
    assert listing == Outcome(ActionStatus.executed, "data_\ufffd/report_\ufffd.txt\n" + note)
    found = await call(env, "grep", pattern="total")
    assert found == Outcome(
        ActionStatus.executed, "data_\ufffd/report_\ufffd.txt:1:total: 3\n" + note
    )
    plain = await call(env, "list_files", path="src")
    assert plain.observation == "src/app.py\nsrc/pkg/util.py"  # no note without such a name


async def test_a_run_journals_a_listing_of_names_that_are_not_utf8(
    root: Path, tmp_path: Path
) -> None:
    write_named(root, b"report_\xff.txt", b"total: 3\n")
    model = ScriptedModel(
        [
            ModelReply(tool_calls=(ToolCall("list_files", {"pattern": "report*"}, None),)),
            ModelReply(tool_calls=(ToolCall("grep", {"pattern": "total"}, None),)),
            "done",
        ]
    )
    async with SQLiteJournal(tmp_path / "runs.db", durability="normal") as journal:
        loop = Loop(model, tools=workspace_tools(root, shell=False), journal=journal)
        result = await loop.run("count")
        assert result.stop_reason is StopReason.agent_finished
        stored = await journal.steps(result.run_id)
    assert [s.observation.split("\n")[0] for s in stored[:2]] == [
        "report_\ufffd.txt",
        "report_\ufffd.txt:1:total: 3",
    ]
