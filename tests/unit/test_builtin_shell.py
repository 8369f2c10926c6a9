"""Workspace tools: the shell (timeout, output cap, killing what it started) and its command
policy."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import polyloop
from polyloop.tools import ToolEnvironment, ToolRegistry
from polyloop.tools.builtin import CommandPolicy, Rule, Verdict, workspace_tools
from polyloop.tools.builtin._shell import run_shell
from polyloop.types import (
    Action,
    ActionStatus,
    ConfigError,
    EnvironmentFailure,
    Outcome,
    ToolContext,
)

CTX = ToolContext("run-1", 0, "op-1")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    r.mkdir()
    (r / "hello.txt").write_text("hello\n")
    return r


def env_for(root: Path, **kw: Any) -> ToolEnvironment:
    return ToolEnvironment(workspace_tools(root, **kw))


async def sh(env: ToolEnvironment, command: str) -> Outcome:
    return await env.execute(Action(command, "shell", {"command": command}), CTX)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent that never reaps it is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def gone(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture
def strays() -> Iterator[list[int]]:
    """Pids a test started; those still running at the end are killed (never left behind)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:  # (the command line tells the pid was not reused meanwhile)
            ours = any(word in Path(f"/proc/{pid}/cmdline").read_bytes() for word in OURS)
        except OSError:
            continue
        if alive(pid) and ours:
            os.kill(pid, signal.SIGKILL)


OURS = (b"sleep", b"bash", b"_supervisor")


def written(path: Path) -> str:
    """The whole line a command wrote to ``path``, or "" while it is not there yet."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ""
    return text if text.endswith("\n") else ""


async def pid_in(path: Path, within_s: float = 10.0) -> int:
    """The pid a command wrote to ``path``, once it is there."""
    deadline = time.monotonic() + within_s
    while not written(path):
        assert time.monotonic() < deadline, f"{path.name} was never written"
        await asyncio.sleep(0.01)
    return int(written(path))


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid`` that runs now (Linux /proc)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        found += map(int, children)
        todo += map(int, children)
    return found


# A setsid grandchild: in a new session, so outside the command's process group.
DAEMON = "setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' &"
WAIT_FOR_DAEMON = "while [ ! -s daemon.pid ]; do sleep 0.01; done"
needs_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="only Linux finds every descendant"
)


# --- running a command ------------------------------------------------------------------------


async def test_combined_output_and_exit_code_from_the_root(root: Path) -> None:
    outcome = await sh(env_for(root), "pwd; cat hello.txt; echo oops >&2; exit 3")
    assert outcome == Outcome(ActionStatus.executed, f"{root}\nhello\noops\n[exit code 3]")


async def test_no_output_and_output_without_a_final_newline(root: Path) -> None:
    env = env_for(root)
    assert (await sh(env, "true")).observation == "[no output]\n[exit code 0]"
    assert (await sh(env, "printf done")).observation == "done\n[exit code 0]"


async def test_stdin_is_empty_so_reading_it_does_not_hang(root: Path) -> None:
    outcome = await sh(env_for(root, shell_timeout_s=5), "cat; read x; echo after $?")
    assert outcome.observation == "after 1\n[exit code 0]"


async def test_a_command_killed_by_a_signal_says_so(root: Path) -> None:
    outcome = await sh(env_for(root), "kill -9 $$")
    assert outcome == Outcome(ActionStatus.executed, "[no output]\n[killed by signal 9]")


async def test_enormous_output_keeps_the_start_and_the_end_and_counts_the_rest(
    root: Path,
) -> None:
    command = "printf 'START'; head -c 3000000 /dev/zero | tr '\\0' a; printf 'END'"
    outcome = await sh(env_for(root), command)
    total = 3_000_008
    assert outcome.status is ActionStatus.executed
    assert outcome.truncated_chars == total - 20_000
    head = "START" + "a" * (10_000 - 5)
    tail = "a" * (10_000 - 3) + "END"
    assert outcome.observation == (
        f"{head}\n[... {total - 20_000} characters of output omitted ...]\n{tail}\n[exit code 0]"
    )


async def test_output_is_decoded_leniently(root: Path) -> None:
    outcome = await sh(env_for(root), "printf 'caf\\xe9 \\xc3\\xa9\\n'")
    assert outcome.observation == "caf\ufffd é\n[exit code 0]"


async def test_a_command_that_never_ends_is_killed_with_its_process_group(
    root: Path, strays: list[int]
) -> None:
    env = env_for(root, shell_timeout_s=0.5)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    started = time.monotonic()
    outcome = await sh(env, "sleep 300 & echo $!; sleep 300; echo never")
    elapsed = time.monotonic() - started
    ticking.cancel()
    assert outcome.status is ActionStatus.executed
    child = int(outcome.observation.splitlines()[0])
    strays.append(child)
    assert outcome.observation == (  # bash, the sleep in the background and the one it waits on
        f"{child}\n[timed out after 0.5 seconds; killed 3 processes: the command and every "
        "process it started that was still running]"
    )
    assert 0.5 <= elapsed < 3
    assert ticks > 10  # the event loop was never blocked
    assert await gone(child)


async def test_background_processes_are_killed_when_the_command_returns(
    root: Path, strays: list[int]
) -> None:
    started = time.monotonic()
    outcome = await sh(env_for(root), "sleep 300 & echo $!")
    assert time.monotonic() - started < 3
    child = int(outcome.observation.splitlines()[0])
    strays.append(child)
    assert outcome.observation == (
        f"{child}\n[exit code 0]\n[killed 1 process the command left running in the background]"
    )
    assert await gone(child)


@needs_linux
async def test_a_timeout_kills_a_descendant_in_a_new_session_and_counts_it(
    root: Path, strays: list[int]
) -> None:
    env = env_for(root, shell_timeout_s=2)
    outcome = await sh(env, f"{DAEMON} {WAIT_FOR_DAEMON}; sleep 300; echo never")
    daemon = int((root / "daemon.pid").read_text())
    strays.append(daemon)
    assert await gone(daemon)
    assert outcome.observation == (  # bash, its sleep, and the daemon
        "[no output]\n[timed out after 2 seconds; killed 3 processes: the command and every "
        "process it started that was still running]"
    )


@needs_linux
async def test_a_daemon_left_behind_is_killed_when_the_command_returns(
    root: Path, strays: list[int]
) -> None:
    # The subshell exits at once, so the daemon is an orphan while the command still runs.
    outcome = await sh(env_for(root), f"({DAEMON}); {WAIT_FOR_DAEMON}; echo started")
    daemon = int((root / "daemon.pid").read_text())
    strays.append(daemon)
    assert await gone(daemon)
    assert outcome.observation == (
        "started\n[exit code 0]\n[killed 1 process the command left running in the background]"
    )


async def test_background_processes_that_ended_by_themselves_are_not_reported(
    root: Path,
) -> None:
    outcome = await sh(env_for(root), "(sleep 0.01; echo late) & wait; echo done")
    assert outcome.observation == "late\ndone\n[exit code 0]"


CALL_THE_SHELL = """
import asyncio, sys
from polyloop.tools import ToolEnvironment
from polyloop.tools.builtin import workspace_tools
from polyloop.types import Action, ToolContext

env = ToolEnvironment(workspace_tools(sys.argv[1], shell_timeout_s=600))
action = Action("shell", "shell", {"command": sys.argv[2]})
asyncio.run(env.execute(action, ToolContext("run-1", 0, "op-1")))
"""


@needs_linux
async def test_when_polyloop_is_killed_nothing_the_command_started_keeps_running(
    root: Path, strays: list[int]
) -> None:
    src = str(Path(polyloop.__file__).parents[1])
    command = f"{DAEMON} sleep 300 & echo $! > sleep.pid; wait"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CALL_THE_SHELL,
        str(root),
        command,
        env={**os.environ, "PYTHONPATH": src},
    )
    try:
        strays.append(await pid_in(root / "sleep.pid"))
        strays.append(await pid_in(root / "daemon.pid"))
        running = descendants(process.pid)  # the supervisor, bash, its sleep and the daemon
        strays.extend(running)
        assert set(strays) <= set(running)
    finally:
        process.kill()
        await process.wait()
    for pid in running:
        assert await gone(pid, within_s=10), f"{pid} still runs after PolyLoop was killed"


async def test_a_shell_that_cannot_be_started_is_an_environment_failure(root: Path) -> None:
    with pytest.raises(EnvironmentFailure, match="cannot start '/no/such/shell' in "):
        await run_shell(
            "true", program="/no/such/shell", cwd=str(root), timeout_s=5, max_chars=1000
        )


async def test_cancelling_the_call_kills_the_process_group(root: Path, strays: list[int]) -> None:
    env = env_for(root, shell_timeout_s=60)
    task = asyncio.create_task(sh(env, "sleep 300 & echo $! > pid; wait"))
    pid_file = root / "pid"
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        await asyncio.sleep(0.01)
    child = int(pid_file.read_text())
    strays.append(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await gone(child)


# --- the command policy -----------------------------------------------------------------------


def test_the_strictest_matching_rule_wins() -> None:
    allow = Rule(r"^git\b", "allow")
    prompt = Rule(r"\bpush\b", "prompt")
    forbid = Rule(r"--force\b", "forbid")
    policy = CommandPolicy([allow, prompt, forbid])
    assert policy.decide("git status") == Verdict("allow", allow)
    assert policy.decide("git push origin") == Verdict("prompt", prompt)
    assert policy.decide("git push --force") == Verdict("forbid", forbid)
    assert policy.decide("ls") == Verdict("allow", None)
    reordered = CommandPolicy([forbid, prompt, allow])
    assert reordered.decide("git push --force") == Verdict("forbid", forbid)
    first = Rule("push", "prompt")
    assert CommandPolicy([first, prompt]).decide("git push").rule is first  # equals: first


def test_strict_policy_prompts_unless_a_rule_says_otherwise() -> None:
    allow = Rule(r"^(ls|cat|pytest)\b", "allow")
    policy = CommandPolicy.strict([allow])
    assert policy.default == "prompt"
    assert policy.decide("ls -la") == Verdict("allow", allow)
    assert policy.decide("make") == Verdict("prompt", None)
    assert CommandPolicy(default="forbid").decide("ls") == Verdict("forbid", None)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Rule("(", "allow"), "not a valid regular expression"),
        (lambda: Rule("x", "deny"), "decision must be 'allow', 'prompt' or 'forbid'"),
        (lambda: CommandPolicy(default="maybe"), "decision must be"),
        (lambda: CommandPolicy([("rm", "forbid")]), "must be Rule"),
    ],
)
def test_bad_rules_are_config_errors(make: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()


def test_a_bad_policy_or_approver_registers_nothing(root: Path) -> None:
    registry = ToolRegistry()
    with pytest.raises(ConfigError, match="command_policy must be a CommandPolicy"):
        workspace_tools(root, command_policy="allow", registry=registry)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="approve must be callable"):
        workspace_tools(root, approve=True, registry=registry)  # type: ignore[arg-type]
    assert len(registry) == 0


POLICY = CommandPolicy(
    [
        Rule(r"^echo\b", "allow"),
        Rule(r"\bsecret\b", "prompt", reason="Secrets need a human."),
        Rule(r"\brm\b", "forbid", reason="Deleting is not allowed here."),
    ]
)


async def test_a_forbidden_command_is_not_run_and_the_rule_is_named(root: Path) -> None:
    asked: list[str] = []
    env = env_for(root, command_policy=POLICY, approve=lambda c: asked.append(c) or True)
    outcome = await sh(env, "echo secret > out.txt; rm hello.txt")
    assert outcome == Outcome(
        ActionStatus.not_executed,
        "Error: the command was not run: the workspace forbids it (rule `\\brm\\b`: "
        "forbid). Deleting is not allowed here. Do not retry it; use another command.",
        synthetic=True,
    )
    assert asked == []  # forbid beats prompt: nobody is asked
    assert (root / "hello.txt").exists()
    assert not (root / "out.txt").exists()


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_prompt_runs_the_command_only_when_approved(root: Path, kind: str) -> None:
    answers = iter([True, False])
    asked: list[str] = []

    def sync_approve(command: str) -> bool:
        asked.append(command)
        return next(answers)

    async def async_approve(command: str) -> bool:
        return sync_approve(command)

    approve = sync_approve if kind == "sync" else async_approve
    env = env_for(root, command_policy=POLICY, approve=approve)
    approved = await sh(env, "echo secret > a.txt")
    assert approved == Outcome(ActionStatus.executed, "[no output]\n[exit code 0]")
    assert (root / "a.txt").read_text() == "secret\n"
    declined = await sh(env, "echo secret > b.txt")
    assert declined == Outcome(
        ActionStatus.not_executed,
        "Error: the command was not run: it needs a person's approval (rule `\\bsecret\\b`: "
        "prompt) and was declined. Secrets need a human. Use another command.",
        synthetic=True,
    )
    assert not (root / "b.txt").exists()
    assert asked == ["echo secret > a.txt", "echo secret > b.txt"]


async def test_prompt_without_an_approver_is_refused(root: Path) -> None:
    env = env_for(root, command_policy=POLICY)
    outcome = await sh(env, "echo secret > a.txt")
    assert outcome.status is ActionStatus.not_executed
    assert outcome.synthetic
    assert "nobody is available to approve it" in outcome.observation
    assert "(rule `\\bsecret\\b`: prompt)" in outcome.observation
    assert not (root / "a.txt").exists()
    assert (await sh(env, "echo fine")).observation == "fine\n[exit code 0]"


@pytest.mark.parametrize("answer", ["yes", 1, None])
async def test_only_true_approves(root: Path, answer: object) -> None:
    env = env_for(root, command_policy=POLICY, approve=lambda c: answer)
    outcome = await sh(env, "echo secret > a.txt")
    assert outcome.status is ActionStatus.not_executed
    assert "was declined" in outcome.observation
    assert not (root / "a.txt").exists()


async def test_an_approver_that_raises_refuses_the_command(root: Path) -> None:
    def broken(command: str) -> bool:
        raise RuntimeError("terminal closed")

    outcome = await sh(env_for(root, command_policy=POLICY, approve=broken), "echo secret")
    assert outcome.status is ActionStatus.not_executed
    assert "asking for it failed (RuntimeError: terminal closed)" in outcome.observation


async def test_strict_policy_asks_about_unmatched_commands(root: Path) -> None:
    asked: list[str] = []

    def approve(command: str) -> bool:
        asked.append(command)
        return False

    policy = CommandPolicy.strict([Rule(r"^cat\b", "allow")])
    env = env_for(root, command_policy=policy, approve=approve)
    assert (await sh(env, "cat hello.txt")).observation == "hello\n[exit code 0]"
    outcome = await sh(env, "touch x")
    assert "(no rule matched; the default is prompt)" in outcome.observation
    assert asked == ["touch x"]


async def test_empty_and_nul_commands_are_refused(root: Path) -> None:
    env = env_for(root)
    outcome = await sh(env, "  \n")
    assert outcome.status is ActionStatus.not_executed
    assert "the command is empty" in outcome.observation
    outcome = await sh(env, "echo a\x00b")
    assert outcome.status is ActionStatus.not_executed
    assert "NUL character" in outcome.observation


def test_shell_false_registers_no_shell(root: Path) -> None:
    assert "shell" not in workspace_tools(root, shell=False)


def test_the_shell_description_states_its_limits(root: Path) -> None:
    tool = workspace_tools(root, shell_timeout_s=2.5, max_output_chars=500).get("shell")
    assert tool is not None
    assert "Run a command with bash in the workspace root directory" in tool.description
    assert "after 2.5 seconds" in tool.description
    assert "longer than 500 characters" in tool.description


async def test_prompt_without_an_approver_parks_a_run_until_a_person_approves(root: Path) -> None:
    from polyloop import ApprovalRequired, Loop
    from polyloop.journal import MemoryJournal
    from polyloop.testing import ScriptedModel
    from polyloop.types import ModelReply, ToolCall

    tools = workspace_tools(root, shell=True, command_policy=POLICY)
    call = ToolCall("shell", {"command": "echo secret > a.txt"})
    fine = ToolCall("shell", {"command": "echo fine"})
    journal = MemoryJournal()
    model = ScriptedModel([ModelReply(tool_calls=(fine,)), ModelReply(tool_calls=(call,)), "ok"])
    loop = Loop(model, tools=tools, journal=journal)
    with pytest.raises(ApprovalRequired) as info:
        await loop.run("write it", run_id="s")
    assert info.value.step_idx == 1 and not (root / "a.txt").exists()  # "fine" needed none
    await loop.approve("s", info.value.op_id, by="alice")
    r = await loop.resume("s")
    assert (root / "a.txt").read_text() == "secret\n" and r.final_answer == "ok"
    assert r.steps[1].observation == "[no output]\n[exit code 0]"
