"""The world the batch tests run in: a scripted agent whose side effects go to a file, so they
survive a killed process and can be counted afterwards.

Importable by path (``tests.batch.world:make_loop``) from child processes and Ray workers.

A run's script, keyed by ``step_idx`` (so a resumed run continues where it was):

* step 0: ``store(key=<goal>)`` — idempotent (a repeat must reuse the op_id);
* step 1: ``charge(amount=<len(goal)>)`` — never replayed (must happen at most once);
* step 2: ``done(answer=<goal>)`` — the completion marker (idempotent): ``task_completed``.

A goal starting with ``loop`` keeps storing forever and stops on ``step_budget``; a goal
starting with ``talk`` answers in text at step 1: ``agent_finished``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from polyloop import Limits, Loop, ModelReply, ToolCall, ToolContext, ToolRegistry
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest

LIMITS = Limits(max_steps=5)


def _goal(request: ModelRequest) -> str:
    for message in request.messages:
        if message.get("role") == "user":
            return str(message.get("content"))
    raise AssertionError("no user message")


def _call(name: str, args: dict[str, Any], step: int) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall(name, args, f"call-{step}"),))


def reply(goal: str, step: int) -> ModelReply:
    if goal.startswith("loop"):
        return _call("store", {"key": f"{goal}/{step}"}, step)
    if goal.startswith("talk") and step >= 1:
        return ModelReply(text=f"answer to {goal}")
    if step == 0:
        return _call("store", {"key": goal}, step)
    if step == 1:
        return _call("charge", {"amount": len(goal)}, step)
    return _call("done", {"answer": goal}, step)


def _append(path: Path, entry: dict[str, Any]) -> None:
    line = json.dumps(entry) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write(2) with O_APPEND: lines never interleave
        os.fsync(fd)
    finally:
        os.close(fd)


def tools(effects: Path) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(replay="idempotent")
    def store(key: str, ctx: ToolContext) -> str:
        """Upsert a record; the op_id is the idempotency key."""
        _append(effects, {"run": ctx.run_id, "tool": "store", "op": ctx.op_id, "pid": os.getpid()})
        return f"stored {key}"

    @registry.tool  # replay="never"
    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card: must never happen twice."""
        _append(effects, {"run": ctx.run_id, "tool": "charge", "op": ctx.op_id, "pid": os.getpid()})
        return f"charged {amount}"

    @registry.tool(completion_marker=True, replay="idempotent")
    def done(answer: str, ctx: ToolContext) -> str:
        """Submit the answer (no side effect: safe to repeat)."""
        return f"submitted {answer}"

    return registry


def model(
    latency_s: float = 0.0,
    *,
    calls: Path | None = None,
    hang: tuple[str, int, Path] | None = None,
    track: list[int] | None = None,
    stall_from: int | None = None,
) -> FunctionModel:
    """The scripted model. ``calls``: a file getting a line per call (run, step, pid).
    ``hang=(run_id, step, pid_file)``: the first call for that step writes this process's pid
    to ``pid_file`` and hangs (a test kills the process); later calls (after the file exists)
    answer. ``track``: [in flight now, most in flight] for concurrency checks. ``stall_from=K``:
    the step-1 call of goals ``task N`` with N >= K never answers (a driver to be killed)."""

    async def answer(request: ModelRequest) -> ModelReply:
        if calls is not None:
            _append(calls, {"run": request.run_id, "step": request.step_idx, "pid": os.getpid()})
        if track is not None:
            track[0] += 1
            track[1] = max(track[1], track[0])
        try:
            if hang is not None and (request.run_id, request.step_idx) == hang[:2]:
                pid_file = hang[2]
                if not pid_file.exists():
                    pid_file.write_text(str(os.getpid()))
                    await asyncio.sleep(120)  # killed before this ends
            goal = _goal(request)
            if (
                stall_from is not None
                and request.step_idx == 1
                and goal.startswith("task ")
                and int(goal.split()[1]) >= stall_from
            ):
                await asyncio.sleep(3600)  # killed before this ends
            if latency_s:
                await asyncio.sleep(latency_s)
            return reply(goal, request.step_idx)
        finally:
            if track is not None:
                track[0] -= 1

    return FunctionModel(answer)


def make_loop(
    journal: Any,
    *,
    effects: str,
    latency_s: float = 0.0,
    calls: str | None = None,
    hang: tuple[str, int, str] | None = None,
    lease_ttl_s: float = 30.0,
    track: list[int] | None = None,
    stall_from: int | None = None,
) -> Loop:
    """A Loop on ``journal`` (for ``functools.partial`` in tests and Ray workers)."""
    return Loop(
        model(
            latency_s,
            calls=None if calls is None else Path(calls),
            hang=None if hang is None else (hang[0], hang[1], Path(hang[2])),
            track=track,
            stall_from=stall_from,
        ),
        tools=tools(Path(effects)),
        journal=journal,
        limits=LIMITS,
        lease_ttl_s=lease_ttl_s,
    )


def effects_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wait_for(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def make_loop_for_tests(journal: Any) -> Loop:
    """``make_loop`` by path (``tests.batch.world:make_loop_for_tests``): effects go to
    ``$POLYLOOP_TEST_EFFECTS``."""
    return make_loop(journal, effects=os.environ["POLYLOOP_TEST_EFFECTS"])
