"""``polyloop demo``: an offline, deterministic tour of a real run and of crash-safe resume.

Scene 1: a scripted model fixes the cancel-order bug of a small shop service through the real
general tools (list, read, edit) and a test runner, and submits -> ``task_completed``.
Scene 2: the same run starts in a child process, which is killed (SIGKILL) in the middle of a
step, while its test run is in flight; the run is then resumed from the SQLite journal.
Scene 3: a model that alternates between two wrong fixes (fix A breaks one test, fix B
another); the failure guard stops it on the third round with ``repeated_failure`` and an
escalation report for a human: the rounds and what each changed, the two tests side by side
with their messages, candidate directions, and the question that separates them.

Only the model is scripted; the loop, the tools and the journal are the code paths a real run
uses. Nothing here needs a network or an API key.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from polyloop import (
    Limits,
    Loop,
    ModelReply,
    RunNotFound,
    RunResult,
    ToolCall,
    ToolContext,
    ToolRegistry,
)
from polyloop.events import Event, RunEnded, StepAppended
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.tools.builtin import extract_failures, workspace_tools
from polyloop.types import (
    ActionIntent,
    ActionResult,
    ActionStatus,
    ModelRequest,
    Outcome,
    Record,
    StepWritten,
)

from . import _render

__all__ = ["DEMO_WORKSPACE", "GOAL", "demo_loop", "run_demo"]

DEMO_WORKSPACE = Path(__file__).with_name("demo_workspace")
GOAL = (
    "The shop's cancel_order has a bug: cancelling must refuse a shipped order and return "
    "the items to stock. Fix it so the tests pass, then submit a summary."
)
SLOW_ENV = "POLYLOOP_DEMO_SLOW_TESTS"
DEMO_LIMITS = Limits(max_steps=12)

_BUGGY = """        order = self.orders[order_id]
        order.status = "cancelled"
        return order"""
_FIXED = """        order = self.orders[order_id]
        if order.status != "placed":
            raise OrderError(f"order {order_id} is {order.status}")
        order.status = "cancelled"
        self.stock[order.item] += order.quantity
        return order"""


def _call(thought: str, name: str, **arguments: object) -> ModelReply:
    return ModelReply(text=thought, tool_calls=(ToolCall(name, dict(arguments)),))


def _edit(thought: str, old: str, new: str) -> ModelReply:
    return _call(thought, "edit_file", path="shop/orders.py", old=old, new=new)


# Two wrong fixes: A restocks but lets a shipped order be cancelled; B refuses shipped
# orders but forgets to restock. Each makes the other's test fail.
_FIX_A = """        order = self.orders[order_id]
        order.status = "cancelled"
        self.stock[order.item] += order.quantity
        return order"""
_FIX_B = """        order = self.orders[order_id]
        if order.status != "placed":
            raise OrderError(f"order {order_id} is {order.status}")
        order.status = "cancelled"
        return order"""

OSCILLATING: list[ModelReply] = [
    _call("Read the service first.", "read_file", path="shop/orders.py"),
    _edit("Cancelling must restock.", _BUGGY, _FIX_A),
    _call("Run the tests.", "run_tests"),
    _edit("A shipped order must be refused instead.", _FIX_A, _FIX_B),
    _call("Run the tests.", "run_tests"),
    _edit("Restocking was right after all.", _FIX_B, _FIX_A),
    _call("Run the tests.", "run_tests"),
    _edit("Try the other way again.", _FIX_A, _FIX_B),
]

SCRIPT: list[ModelReply] = [
    _call("Let me see what is in the workspace.", "list_files", path="."),
    _call("The bug report is about cancel_order; read it.", "read_file", path="shop/orders.py"),
    _call("Run the tests to see the failure.", "run_tests"),
    _edit("cancel_order neither checks the status nor restocks. Fix both.", _BUGGY, _FIXED),
    _call("Run the tests again.", "run_tests"),
    _call(
        "All tests pass.",
        "submit",
        summary="cancel_order now refuses shipped orders and returns the items to stock.",
    ),
]


def scripted_reply(request: ModelRequest) -> ModelReply:
    """The scripted model: keyed by step, so a resumed run gets the same replies."""
    return SCRIPT[min(request.step_idx, len(SCRIPT) - 1)]


def oscillating_reply(request: ModelRequest) -> ModelReply:
    """A model that trades one failing test for another, round after round."""
    return OSCILLATING[min(request.step_idx, len(OSCILLATING) - 1)]


def demo_tools(workspace: Path, writable_paths: Sequence[str] = ("shop",)) -> ToolRegistry:
    """The general workspace tools (writing only under ``writable_paths``) plus a test runner
    and a submit tool."""
    registry = ToolRegistry()

    @registry.tool(replay="idempotent")
    async def run_tests(ctx: ToolContext) -> Outcome:
        """Run the workspace's unit tests and report the result. Running tests changes
        nothing, so it is safe to repeat (replay="idempotent")."""
        if os.environ.get(SLOW_ENV):  # scene 2: a slow test run, so the kill lands mid-step
            await asyncio.sleep(60)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "unittest",
            "-q",
            cwd=workspace,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        text = out.decode(errors="replace").strip()
        report = extract_failures(text) if proc.returncode else None
        failures = report.failures if report is not None else ()
        return Outcome(
            ActionStatus.executed, f"exit code {proc.returncode}\n{text}", failures=failures
        )

    @registry.tool(completion_marker=True)
    def submit(summary: str) -> str:
        """Submit a summary of the fix; this ends the run."""
        return "submitted"

    return workspace_tools(
        workspace, writable_paths=list(writable_paths), shell=False, registry=registry
    )


def demo_loop(
    workspace: Path,
    journal: SQLiteJournal,
    observers: tuple[Callable[[Event], None], ...] = (),
    *,
    reply: Callable[[ModelRequest], ModelReply] = scripted_reply,
    limits: Limits = DEMO_LIMITS,
    writable_paths: Sequence[str] = ("shop",),
) -> Loop:
    return Loop(
        FunctionModel(reply),
        tools=demo_tools(workspace, writable_paths),
        journal=journal,
        limits=limits,
        observers=observers,
    )


class _Printer:
    """A line per step and one per failed model attempt; ``waiting`` (the real model's demo)
    also tells what the run waits for on a terminal (:mod:`._live`)."""

    def __init__(self, say: Callable[[str], None], *, waiting: bool = False) -> None:
        self.say = say
        self.progress = _render.Progress() if waiting else None

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def __call__(self, event: Event) -> None:
        if self.progress is not None and (failed := self.progress.follow(event)) is not None:
            self.say(f"  {failed.strip()}")
        if isinstance(event, StepAppended):
            s = event.step
            first = (s.observation or "").strip().splitlines()[:1]
            self.say(
                f"  step {s.step_idx}  {s.action or '-':<44.44}  {s.action_status or '-':<12}"
                f"  {s.step_wall_ms:7.1f} ms  {first[0][:40] if first else ''}"
            )
        elif isinstance(event, RunEnded):
            self.say(
                f"  -> {event.stop_reason} after {event.steps_used} steps, "
                f"{event.actions_executed} actions"
            )


def _fresh_workspace(root: Path, name: str) -> Path:
    target = root / name
    shutil.copytree(DEMO_WORKSPACE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _describe_tail(records: list[Record]) -> str:
    steps = sum(isinstance(r, StepWritten) for r in records)
    last = records[-1] if records else None
    if isinstance(last, ActionIntent):
        a = last.action
        return (
            f"{steps} complete steps, then an action intent for step {last.step_idx} "
            f"({a.tool_name}, op_id {last.op_id[:12]}…, replay={last.replay_policy}) "
            "with no result: the action was in flight when the process died"
        )
    return f"{steps} complete steps; the last record is {last.kind if last else 'none'}"


async def _scene_one(root: Path, journal: SQLiteJournal, say: Callable[[str], None]) -> RunResult:
    say("Scene 1 — a run fixes a bug through the real tools (the model is scripted)")
    workspace = _fresh_workspace(root, "shop-1")
    result = await demo_loop(workspace, journal, (_Printer(say),)).run(GOAL)
    say(f"  run {result.run_id}: {result.stop_reason}\n")
    return result


async def _scene_two(root: Path, journal_path: Path, say: Callable[[str], None]) -> RunResult:
    say("Scene 2 — the same run in a child process, killed with SIGKILL mid-step, resumed")
    workspace = _fresh_workspace(root, "shop-2")
    run_id = f"demo-crash-{os.getpid()}"
    env = {**os.environ, SLOW_ENV: "1"}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "polyloop.cli.demo",
        str(workspace),
        str(journal_path),
        run_id,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    reader = SQLiteJournal(journal_path)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if child.returncode is not None:
                err = (await child.stderr.read()).decode() if child.stderr else ""
                raise RuntimeError(f"the demo's child process exited early:\n{err}")
            try:
                _, recs = await reader.read(run_id)
            except RunNotFound:
                continue  # not created yet
            if recs and isinstance(recs[-1], ActionIntent) and recs[-1].step_idx == 2:
                break
        else:
            raise RuntimeError("the demo's child never reached the step to interrupt")
        child.send_signal(signal.SIGKILL)
        await child.wait()
        say(f"  child pid {child.pid} killed while its test run was in flight")
        _, recs = await reader.read(run_id)
        say(f"  the journal holds: {_describe_tail(list(recs))}")
    finally:
        await reader.aclose()
        if child.returncode is None:
            child.kill()
            await child.wait()
    journal = SQLiteJournal(journal_path)
    try:
        say("  resuming (the dead owner's lease is taken over at once):")
        result = await demo_loop(workspace, journal, (_Printer(say),)).resume(run_id)
    finally:
        await journal.aclose()
    records = list(await _read(journal_path, run_id))
    replays = [r for r in records if isinstance(r, ActionIntent) and r.step_idx == 2]
    results = [r for r in records if isinstance(r, ActionResult) and r.step_idx == 2]
    say(
        f"  the interrupted action had 1 intent and {len(results)} result: it was executed "
        f"again with the same op_id {replays[0].op_id[:12]}… (replay=idempotent)"
    )
    say(f"  run {run_id}: {result.stop_reason}\n")
    return result


async def _scene_three(root: Path, journal: SQLiteJournal, say: Callable[[str], None]) -> RunResult:
    say(
        "Scene 3 — a fix loop going in circles, stopped by the failure guard (same_failure_limit=2)"
    )
    workspace = _fresh_workspace(root, "shop-3")
    loop = demo_loop(
        workspace,
        journal,
        (_Printer(say),),
        reply=oscillating_reply,
        limits=Limits(max_steps=12, same_failure_limit=2),
    )
    result = await loop.run(GOAL)
    say(f"  run {result.run_id}: {result.stop_reason}\n")
    if result.report is not None:
        for line in result.report.to_markdown().splitlines():
            say(f"  {line}" if line else "")
    return result


async def _read(path: Path, run_id: str) -> list[Record]:
    journal = SQLiteJournal(path)
    try:
        return list((await journal.read(run_id))[1])
    finally:
        await journal.aclose()


DEMO_JOURNAL = "polyloop-demo.db"
"""The demo's journal, in the current folder: each ``polyloop demo`` replaces it (the runs of
the last demo stay there for ``polyloop runs --journal polyloop-demo.db``); the demo never
writes to the default journal, so it mixes no scripted run into real ones."""


def demo_journal(name: str = DEMO_JOURNAL) -> Path:
    """Where a demo's journal goes: ``name`` in the current folder, emptied first (with its
    ``-wal`` and ``-shm``), or, when that folder cannot be written, in PolyLoop's cache folder
    (``$POLYLOOP_CACHE``, else ``~/.cache/polyloop``)."""
    folder = Path.cwd()
    if not os.access(folder, os.W_OK):
        from ..testing.real_model import cache_dir

        folder = cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
    return path.resolve()


async def run_demo(say: Callable[[str], None] = print, root: Path | None = None) -> int:
    """Run the three scenes; returns the process exit code (0 when they ended as scripted).

    Without ``root``, the workspaces the scenes work on are made in a temporary folder and
    removed at the end, and the journal is :func:`demo_journal` (it stays, replaced by the
    next demo); with ``root``, both go in ``root`` and stay."""
    if root is not None:
        return await _run_demo(say, root, root / "demo.sqlite")
    journal_path = demo_journal()
    with tempfile.TemporaryDirectory(prefix="polyloop-demo-") as tmp:
        return await _run_demo(say, Path(tmp), journal_path)


async def _run_demo(say: Callable[[str], None], root: Path, journal_path: Path) -> int:
    say("PolyLoop demo — offline: the model is a script, everything else is real.")
    say(f"  journal: {journal_path} (each demo replaces it)\n")
    journal = SQLiteJournal(journal_path)
    try:
        first = await _scene_one(root, journal, say)
    finally:
        await journal.aclose()
    second = await _scene_two(root, journal_path, say)
    journal = SQLiteJournal(journal_path)
    try:
        third = await _scene_three(root, journal, say)
    finally:
        await journal.aclose()
    say("Look inside:")
    say(f"  polyloop runs --journal {journal_path}")
    say(f"  polyloop show {first.run_id} --journal {journal_path}")
    say(f"  polyloop show {third.run_id} --journal {journal_path}   # with its report")
    say(
        f'  sqlite3 {journal_path} "SELECT step_idx, tool_name, action_status, '
        f"prompt_chars FROM steps WHERE run_id = '{second.run_id}'\""
    )
    say(f'  sqlite3 {journal_path} "SELECT stop_reason, count(*) FROM runs GROUP BY 1"')
    ok = (
        first.stop_reason == second.stop_reason == "task_completed"
        and third.stop_reason == "repeated_failure"
    )
    return 0 if ok else 1


def _child(workspace: str, journal_path: str, run_id: str) -> None:
    async def go() -> None:
        journal = SQLiteJournal(Path(journal_path))
        await demo_loop(Path(workspace), journal).run(GOAL, run_id=run_id)

    asyncio.run(go())


if __name__ == "__main__":  # the child process of scene 2
    _child(*sys.argv[1:4])
