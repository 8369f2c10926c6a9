"""Workspace tools: every path stays inside the root, and writes inside ``writable_paths``."""

from __future__ import annotations

import ctypes
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from polyloop.tools import ToolEnvironment
from polyloop.tools.builtin import workspace_tools
from polyloop.types import Action, ActionStatus, ConfigError, Outcome, ToolContext

CTX = ToolContext("run-1", 0, "op-1")
SECRET = "TOP SECRET\n"

# Each file tool, called with a path; the arguments would do harm if the path escaped.
CALLS: dict[str, Callable[[str], dict[str, Any]]] = {
    "read_file": lambda p: {"path": p},
    "write_file": lambda p: {"path": p, "content": "pwned\n"},
    "edit_file": lambda p: {"path": p, "old": "TOP", "new": "PWNED"},
    "list_files": lambda p: {"path": p},
    "grep": lambda p: {"pattern": "SECRET", "path": p},
}
WRITES = ("write_file", "edit_file")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text(SECRET)
    return d


@pytest.fixture
def root(tmp_path: Path, outside: Path) -> Path:
    r = tmp_path / "ws"
    (r / "src").mkdir(parents=True)
    (r / "src" / "app.py").write_text("print('hi')\n")
    (r / "protected.txt").write_text("keep\n")
    (r / "link").symlink_to(outside / "secret.txt")
    (r / "linkdir").symlink_to(outside, target_is_directory=True)
    (r / "dangling").symlink_to(outside / "new.txt")
    (r / "alias.py").symlink_to(r / "src" / "app.py")
    return r


def tree(d: Path) -> dict[str, str]:
    return {
        str(p.relative_to(d)): p.read_text() if p.is_file() else "<dir>"
        for p in sorted(d.rglob("*"))
    }


async def call(env: ToolEnvironment, tool: str, **args: Any) -> Outcome:
    return await env.execute(Action(f"{tool}(...)", tool, args), CTX)


def env_for(root: Path, **kw: Any) -> ToolEnvironment:
    return ToolEnvironment(workspace_tools(root, shell=False, **kw))


ESCAPES = [
    pytest.param("../outside/secret.txt", "through '..'", id="dotdot"),
    pytest.param("src/../../outside/secret.txt", "through '..'", id="dotdot-nested"),
    pytest.param("./src/./../../outside", "through '..'", id="dotdot-dir"),
    pytest.param("link", "symbolic link", id="symlink-file"),
    pytest.param("linkdir/secret.txt", "symbolic link", id="symlinked-dir"),
    pytest.param("linkdir", "symbolic link", id="symlinked-dir-itself"),
    pytest.param("src/../linkdir/../outside/secret.txt", "symbolic link", id="dotdot-after-link"),
    pytest.param("dangling", "symbolic link", id="dangling-symlink"),
]


@pytest.mark.parametrize(("path", "reason"), ESCAPES)
async def test_paths_that_escape_the_root_are_refused_before_anything_is_touched(
    root: Path, outside: Path, path: str, reason: str
) -> None:
    env = env_for(root)
    before = tree(outside)
    for tool, args in CALLS.items():
        outcome = await call(env, tool, **args(path))
        assert outcome.status is ActionStatus.not_executed, tool
        assert outcome.synthetic
        assert reason in outcome.observation
        assert "outside the workspace" in outcome.observation
        assert repr(path) in outcome.observation  # the path as the model wrote it
        assert "TOP SECRET" not in outcome.observation
    assert tree(outside) == before


@pytest.mark.parametrize("path", ["{outside}/secret.txt", "{outside}", "/etc/passwd", "/"])
async def test_absolute_paths_outside_the_root_are_refused(
    root: Path, outside: Path, path: str
) -> None:
    env = env_for(root)
    path = path.format(outside=outside)
    before = tree(outside)
    for tool, args in CALLS.items():
        outcome = await call(env, tool, **args(path))
        assert outcome.status is ActionStatus.not_executed, tool
        assert outcome.synthetic
        assert "absolute path" in outcome.observation
    assert tree(outside) == before


async def test_absolute_paths_and_dotdot_inside_the_root_are_fine(root: Path) -> None:
    env = env_for(root)
    for path in (str(root / "src" / "app.py"), "src/../src/app.py", "./src//app.py"):
        outcome = await call(env, "read_file", path=path)
        assert outcome == Outcome(ActionStatus.executed, "print('hi')\n"), path


async def test_a_symlink_that_stays_inside_the_root_is_followed(root: Path) -> None:
    env = env_for(root)
    assert (await call(env, "read_file", path="alias.py")).observation == "print('hi')\n"
    outcome = await call(env, "edit_file", path="alias.py", old="hi", new="ho")
    assert outcome.status is ActionStatus.executed
    assert (root / "src" / "app.py").read_text() == "print('ho')\n"
    assert (root / "alias.py").is_symlink()


async def test_a_root_given_through_a_symlink_is_its_real_path(tmp_path: Path, root: Path) -> None:
    via = tmp_path / "via"
    via.symlink_to(root, target_is_directory=True)
    env = env_for(via)
    outcome = await call(env, "read_file", path=str(root / "src" / "app.py"))
    assert outcome.status is ActionStatus.executed
    assert (await call(env, "read_file", path="link")).status is ActionStatus.not_executed


async def test_symlinks_inside_the_root_are_read_and_followed_while_they_stay_inside(
    tmp_path: Path, root: Path
) -> None:
    env = env_for(root)
    (root / "srclink").symlink_to("src", target_is_directory=True)
    (root / "abs.py").symlink_to(root / "src" / "app.py")  # absolute, inside
    (root / "src" / "up.py").symlink_to("../protected.txt")
    (root / "back.py").symlink_to(f"../{root.name}/src/app.py")  # out through '..' and in
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    (root / "later.txt").symlink_to("src/later.txt")  # dangling, inside
    for path in ("srclink/app.py", "abs.py", "srclink/../src/app.py", str(root / "abs.py")):
        assert (await call(env, "read_file", path=path)).observation == "print('hi')\n", path
    assert (await call(env, "read_file", path="src/up.py")).observation == "keep\n"
    outcome = await call(env, "read_file", path="back.py")
    assert outcome.status is ActionStatus.not_executed
    assert "symbolic link that points outside" in outcome.observation
    outcome = await call(env, "read_file", path="loop1")
    assert outcome.status is ActionStatus.not_executed
    assert "too many symbolic links" in outcome.observation
    outcome = await call(env, "write_file", path="later.txt", content="made\n")
    assert outcome.observation == "Created 'later.txt': 5 characters in 1 line(s)."
    assert (root / "later.txt").is_symlink()
    assert (root / "src" / "later.txt").read_text() == "made\n"
    listing = await call(env, "list_files", pattern="l*")
    assert listing.observation == (
        "later.txt -> src/later.txt\nlink -> (outside the workspace)\nlinkdir -> (outside the "
        "workspace)\nloop1 -> (unreadable)\nloop2 -> (unreadable)\nsrc/later.txt"
    )
    via = tmp_path / "via"
    via.symlink_to(root, target_is_directory=True)
    through = await call(env_for(via), "read_file", path=str(via / "src" / "app.py"))
    assert through.observation == "print('hi')\n"


async def test_writes_replace_the_file_keeping_its_mode_and_leave_nothing_behind(
    root: Path,
) -> None:
    env = env_for(root)
    script = root / "src" / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o750)
    outcome = await call(env, "write_file", path="src/run.sh", content="echo new\n")
    assert outcome.status is ActionStatus.executed
    outcome = await call(env, "edit_file", path="src/run.sh", old="new", new="newer")
    assert outcome.status is ActionStatus.executed
    assert script.read_text() == "echo newer\n"
    assert script.stat().st_mode & 0o7777 == 0o750
    # '..' below a missing directory only undoes it: nothing but the file is made
    outcome = await call(env, "write_file", path="src/new/../made.txt", content="x")
    assert outcome.status is ActionStatus.executed
    assert sorted(p.name for p in (root / "src").iterdir()) == ["app.py", "made.txt", "run.sh"]


@contextmanager
def unprivileged() -> Iterator[None]:
    """Run the body as a user the file permissions bind: ``nobody`` when the tests run as root
    (root may write any file), else the current user."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)  # every thread, the tools' worker threads included
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may create files in (pytest's own are its user's alone)."""
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o777)
        yield Path(d)


async def test_writes_to_a_file_its_user_may_not_write_are_refused_and_change_nothing(
    shared_dir: Path,
) -> None:
    # a workspace where the user may create files, holding a file it may only read
    root = shared_dir
    locked = root / "locked.txt"
    locked.write_text("keep\n")
    locked.chmod(0o444)
    env = env_for(root)
    # (the worker threads start, and import what they need, with the test's own rights)
    assert (await call(env, "read_file", path="locked.txt")).observation == "keep\n"
    with unprivileged():
        written = await call(env, "write_file", path="locked.txt", content="pwned\n")
        edited = await call(env, "edit_file", path="locked.txt", old="keep", new="pwned")
    for outcome in (written, edited):
        assert outcome.status is ActionStatus.not_executed, outcome.observation
        assert "'locked.txt'" in outcome.observation
        assert "ermission denied" in outcome.observation
    assert locked.read_text() == "keep\n"
    assert locked.stat().st_mode & 0o7777 == 0o444
    assert sorted(p.name for p in root.iterdir()) == ["locked.txt"]


LOOKALIKES = [
    pytest.param("．．／．．／outside／secret.txt", id="fullwidth-dot-and-solidus"),
    pytest.param("．．/outside/secret.txt", id="fullwidth-dots"),
    pytest.param("․․/outside/secret.txt", id="one-dot-leader"),
    pytest.param("..∕outside∕secret.txt", id="division-slash"),
    pytest.param("..⁄outside⁄secret.txt", id="fraction-slash"),
    pytest.param("%2e%2e/outside/secret.txt", id="url-encoded"),
    pytest.param("..\\outside\\secret.txt", id="backslash"),
]


@pytest.mark.parametrize("path", LOOKALIKES)
async def test_unicode_lookalikes_are_odd_names_inside_the_root(
    root: Path, outside: Path, path: str
) -> None:
    env = env_for(root)
    before = tree(outside)
    read = await call(env, "read_file", path=path)
    assert read.status is ActionStatus.not_executed
    assert "there is no file or directory" in read.observation
    assert "SECRET" not in read.observation

    written = await call(env, "write_file", path=path, content="harmless\n")
    assert written.status is ActionStatus.executed, written.observation
    created = root / path
    assert created.read_text() == "harmless\n"
    assert created.resolve().is_relative_to(root)
    assert tree(outside) == before
    assert (outside / "secret.txt").read_text() == SECRET


@pytest.mark.parametrize("path", ["src/app.py\x00.txt", "\x00", "../\x00"])
async def test_nul_in_a_path_is_refused(root: Path, path: str) -> None:
    env = env_for(root)
    before = tree(root)
    for tool, args in CALLS.items():
        outcome = await call(env, tool, **args(path))
        assert outcome.status is ActionStatus.not_executed, tool
        assert outcome.synthetic
        assert "contains a NUL character" in outcome.observation
    assert tree(root) == before


# --- writable_paths --------------------------------------------------------------------------


async def test_writes_outside_writable_paths_are_not_executed(root: Path) -> None:
    env = env_for(root, writable_paths=["src"])
    ok = await call(env, "write_file", path="src/pkg/new.py", content="x = 1\n")
    assert ok.status is ActionStatus.executed
    assert (root / "src" / "pkg" / "new.py").read_text() == "x = 1\n"

    for tool, args in [
        ("write_file", {"path": "docs/new.md", "content": "x"}),
        ("write_file", {"path": "protected.txt", "content": "x"}),
        ("write_file", {"path": "srcx/a.py", "content": "x"}),
        ("edit_file", {"path": "protected.txt", "old": "keep", "new": "lost"}),
    ]:
        before = tree(root)
        outcome = await call(env, tool, **args)
        assert outcome.status is ActionStatus.not_executed, args
        assert outcome.synthetic
        assert outcome.observation == (
            f"Error: writing to {args['path']!r} is not allowed; nothing was done. Only these "
            "paths may be written: src. Keep your changes inside them."
        )
        assert tree(root) == before
    # reads are not narrowed
    assert (await call(env, "read_file", path="protected.txt")).observation == "keep\n"


async def test_writable_globs_match_segment_by_segment(root: Path) -> None:
    env = env_for(root, writable_paths=["**/*.md", "src/*.py"])
    allowed = ["a.md", "docs/deep/b.md", "src/c.py"]
    refused = ["docs/b.txt", "src/pkg/d.py", "src/c.pyc"]
    for path in allowed:
        outcome = await call(env, "write_file", path=path, content="x")
        assert outcome.status is ActionStatus.executed, path
    for path in refused:
        outcome = await call(env, "write_file", path=path, content="x")
        assert outcome.status is ActionStatus.not_executed, path
        assert not (root / path).exists()


async def test_a_symlink_in_a_writable_dir_cannot_lead_a_write_elsewhere(root: Path) -> None:
    (root / "src" / "sneaky").symlink_to(root / "protected.txt")
    env = env_for(root, writable_paths=["src"])
    outcome = await call(env, "write_file", path="src/sneaky", content="overwritten")
    assert outcome.status is ActionStatus.not_executed
    outcome = await call(env, "edit_file", path="src/sneaky", old="keep", new="lost")
    assert outcome.status is ActionStatus.not_executed
    assert (root / "protected.txt").read_text() == "keep\n"


async def test_empty_writable_paths_make_the_workspace_read_only(root: Path) -> None:
    env = env_for(root, writable_paths=[])
    outcome = await call(env, "write_file", path="src/app.py", content="")
    assert outcome.status is ActionStatus.not_executed
    assert "none (the workspace is read-only)" in outcome.observation
    assert (root / "src" / "app.py").read_text() == "print('hi')\n"


def test_writable_paths_are_named_in_the_write_tools_descriptions(root: Path) -> None:
    registry = workspace_tools(root, writable_paths=["src", "tests/*.py"], shell=False)
    for name in WRITES:
        tool = registry.get(name)
        assert tool is not None
        assert tool.description.endswith(" Only these paths may be written: src, tests/*.py.")
    read = registry.get("read_file")
    assert read is not None
    assert "Only these paths" not in read.description


def test_absolute_writable_paths_inside_the_root_are_accepted(root: Path) -> None:
    workspace_tools(root, writable_paths=[root / "src", str(root / "docs" / "*.md")])


@pytest.mark.parametrize(
    "writable",
    [["../outside"], ["/etc"], ["src/../../x"], ["../*.py"], ["linkdir"], [""], ["a\x00b"]],
)
def test_writable_paths_outside_the_root_are_a_config_error(
    root: Path, writable: list[str]
) -> None:
    with pytest.raises(ConfigError, match="writable_paths entry"):
        workspace_tools(root, writable_paths=writable)


def test_a_single_string_for_writable_paths_is_a_config_error(root: Path) -> None:
    with pytest.raises(ConfigError, match=r"writable_paths=\[\.\.\.\]"):
        workspace_tools(root, writable_paths="src")


def test_a_missing_root_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not an existing directory"):
        workspace_tools(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="not an existing directory"):
        workspace_tools(tmp_path / "file")


# --- a path swapped while the tools use it ---------------------------------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchanger() -> Callable[[Path, Path], None]:
    """``exchange(a, b)``: swap two names atomically (Linux ``renameat2(RENAME_EXCHANGE)``), so
    a name is never missing, only a directory or file one moment and a symlink the next."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        pytest.skip("needs renameat2 (Linux with glibc 2.28 or later)")
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    renameat2.argtypes.append(ctypes.c_uint)

    def exchange(a: Path, b: Path) -> None:
        if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), str(a))

    return exchange


def test_a_directory_or_file_swapped_for_a_symlink_during_calls_never_leads_outside(
    tmp_path: Path,
) -> None:
    exchange = _exchanger()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "note.txt").write_text("OUTSIDE TOKEN\n")
    (outside / "outside_only.txt").write_text("OUTSIDE\n")
    root = tmp_path / "ws"
    (root / "d").mkdir(parents=True)
    (root / "d" / "note.txt").write_text("inside TOKEN\n")
    (root / "f.txt").write_text("inside TOKEN\n")
    (root / "d.link").symlink_to(outside, target_is_directory=True)
    (root / "f.link").symlink_to(outside / "note.txt")
    before = tree(outside)
    registry = workspace_tools(root, shell=False)

    def tool(name: str) -> Callable[..., Any]:
        found = registry.get(name)
        assert found is not None
        return found.function

    read, write, edit = tool("read_file"), tool("write_file"), tool("edit_file")
    listing, grep = tool("list_files"), tool("grep")

    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            exchange(root / "d", root / "d.link")
            exchange(root / "f.txt", root / "f.link")

    swapper = threading.Thread(target=swap)
    swapper.start()
    leaks: list[str] = []
    errors: list[str] = []
    states: set[str] = set()

    def run(name: str, function: Callable[..., Any], *args: str) -> str:
        try:
            result = function(*args)
        except Exception as exc:  # a tool that raises is not confined by construction
            errors.append(f"{name}{args!r} raised {exc!r}")
            return ""
        text = result if isinstance(result, str) else result.observation
        if "OUTSIDE" in text or "outside_only" in text:
            leaks.append(f"{name}{args!r} -> {text!r}")
        return text

    try:
        for i in range(1000):  # 1,000 calls of each tool, half through each swapped name
            swapped_dir = i % 2 == 0
            path = "d/note.txt" if swapped_dir else "f.txt"
            text = run("read_file", read, path)
            states.add("read" if "inside TOKEN" in text else "refused")
            run("edit_file", edit, path, "TOKEN", "TOKEN ")
            run("write_file", write, "d/new.txt" if swapped_dir else "f.txt", "inside TOKEN\n")
            run("list_files", listing, "d" if swapped_dir else ".")
            run("grep", grep, "OUTSID[E]", "d" if swapped_dir else ".")
    finally:
        stop.set()
        swapper.join()
    changed = sorted(k for k, v in tree(outside).items() if before.get(k) != v)
    assert states == {"read", "refused"}  # the calls met both sides of the swap
    assert changed == [], "writes went outside the workspace"
    assert leaks == []
    assert errors == []
