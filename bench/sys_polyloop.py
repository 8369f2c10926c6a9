"""PolyLoop with its default adapters: ``Loop(model, tools=registry)``, one async no-op tool,
the in-memory journal (``polyloop``), ``SQLiteJournal`` (``polyloop_sqlite``; with
``writer="process"``: ``polyloop_sqlite_process``, whose writer process's CPU in the timed
section is added to the CPU column) or ``PostgresJournal`` (``polyloop_postgres``, in a fresh
schema: see bench/pg.py).

The model is a minimal implementation of the ``Model`` seam, like a real adapter and like the
peers' fake models: it keeps nothing. (``polyloop.testing.FunctionModel`` records every request
for tests to inspect, which would keep every step's message snapshot alive.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from polyloop import (
    Limits,
    Loop,
    ModelReply,
    ModelRequest,
    RunDetached,
    StopReason,
    ToolCall,
    ToolRegistry,
)
from polyloop.journal import MemoryJournal, PostgresJournal, SQLiteJournal
from polyloop.testing import FunctionModel

from . import pg
from ._measure import (
    FINAL_ANSWER,
    GOAL,
    TOOL_NAME,
    TOOL_RESULT,
    Measured,
    Spec,
    is_final,
    sqlite_bytes,
    stored_bytes,
    timed,
)

# A provider hands tool-call arguments over as a JSON string; so does this fake.
_CALL = ModelReply(tool_calls=(ToolCall(TOOL_NAME, "{}", id="call_0"),))
_FINAL = ModelReply(text=FINAL_ANSWER)


def _tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(name=TOOL_NAME, replay="idempotent")
    async def noop() -> str:
        """Do nothing."""
        return TOOL_RESULT

    return tools


class _Model:
    """N-1 calls of the no-op tool, then the final answer; after ``latency_s`` if set."""

    def __init__(self, steps: int, latency_s: float, on_call: Any = None) -> None:
        self.steps = steps
        self.latency_s = latency_s
        self.on_call = on_call

    async def complete(self, request: ModelRequest) -> ModelReply:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.on_call is not None:
            self.on_call(request)
        return _FINAL if is_final(request.step_idx, self.steps) else _CALL


def _model(steps: int, latency_s: float, on_call: Any = None) -> _Model:
    return _Model(steps, latency_s, on_call)


def _journal(spec: Spec, path: str) -> MemoryJournal | SQLiteJournal:
    if spec.system in ("polyloop_sqlite", "polyloop_sqlite_process"):
        durability = "full" if spec.durability == "full" else "normal"
        writer = "process" if spec.system == "polyloop_sqlite_process" else "thread"
        return SQLiteJournal(
            path, durability=durability, group_commit=spec.group_commit, writer=writer
        )
    return MemoryJournal()


def _writer_cpu_s(journal: _Journal) -> float:
    """CPU seconds the journal's writer process has used so far (0 without one)."""
    pid = getattr(getattr(journal, "_writer", None), "pid", None)
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _batches(loop: Loop, spec: Spec) -> None:
    limits = Limits(max_steps=spec.steps)
    for _ in range(spec.batches):
        results = await asyncio.gather(*(loop.run(GOAL, limits=limits) for _ in range(spec.runs)))
        for r in results:
            assert r.stop_reason is StopReason.agent_finished, r.stop_reason
            assert len(r.steps) == spec.steps


_Journal = MemoryJournal | SQLiteJournal | PostgresJournal


async def _warm_up(journal: _Journal, tools: ToolRegistry) -> None:
    """One 5-step run: imports and first-call paths, before anything is timed."""
    await _batches(Loop(_model(5, 0.0), tools=tools, journal=journal), Spec("", "warmup", 5))


async def _timed(spec: Spec, journal: _Journal, tools: ToolRegistry) -> tuple[float, float]:
    """Wall and CPU seconds of the spec's runs on ``journal``."""
    loop = Loop(_model(spec.steps, spec.latency_ms / 1000), tools=tools, journal=journal)
    wall, cpu, _ = await timed(lambda: _batches(loop, spec))
    return wall, cpu


async def measure(spec: Spec) -> Measured:
    if spec.scenario == "resume":
        return await _resume(spec)
    if spec.system == "polyloop_postgres":
        return await _postgres(spec)
    tools = _tools()
    # Warm up on a throwaway journal.
    warm = _journal(spec, os.path.join(spec.workdir, "warm.db"))
    await _warm_up(warm, tools)
    if isinstance(warm, SQLiteJournal):
        await warm.aclose()
    path = os.path.join(spec.workdir, "journal.db")
    journal = _journal(spec, path)
    before = sqlite_bytes(path) if isinstance(journal, SQLiteJournal) else 0
    if isinstance(journal, SQLiteJournal) and journal.writer == "process":
        await _warm_up(journal, tools)  # the writer process started before the timing
        before = sqlite_bytes(path)
    writer_cpu = _writer_cpu_s(journal)
    wall, cpu = await _timed(spec, journal, tools)
    cpu += _writer_cpu_s(journal) - writer_cpu
    extra: dict[str, Any] = {}
    if isinstance(journal, SQLiteJournal):
        extra["journal_bytes"] = sqlite_bytes(path) - before
        extra["commits"] = journal.commits
        await journal.aclose()
        extra["stored_bytes"] = stored_bytes(path) - before
    return Measured(wall, cpu, extra)


async def _postgres(spec: Spec) -> Measured:
    """``PostgresJournal`` in a schema of its own, its pool (the default size) open and the
    warm-up run done on it before timing; WAL, stored bytes and server CPU around the timed
    section."""
    tools = _tools()
    schema = pg.Schema(os.environ[pg.ENV])
    try:
        journal = PostgresJournal(
            os.environ[pg.ENV], schema=schema.name, min_size=pg.POOL, max_size=pg.POOL
        )
        try:
            await journal.open()  # creates the schema and its tables, opens every connection
            await _warm_up(journal, tools)
            before = schema.snapshot()
            wall, cpu = await _timed(spec, journal, tools)
            after = schema.snapshot()
        finally:
            await journal.aclose()
    finally:
        schema.drop()
    return Measured(wall, cpu, schema.extra(before, after))


async def _resume(spec: Spec) -> Measured:
    """Journal a ``spec.steps``-step run, detach it, then time ``resume`` from a fresh
    ``SQLiteJournal`` object: read, check, replay, rebuild the context, take the lease, and
    one more step (the final answer)."""
    path = os.path.join(spec.workdir, "resume.db")
    tools = _tools()
    setup = SQLiteJournal(path, durability="normal")
    holder: dict[str, Loop] = {}

    def detach_at_end(request: ModelRequest) -> None:
        if request.step_idx == spec.steps - 1:
            holder["loop"].detach(request.run_id)

    # The journaled run: `steps` tool steps, detached after the last one.
    holder["loop"] = Loop(_model(spec.steps + 1, 0.0, detach_at_end), tools=tools, journal=setup)
    try:
        await holder["loop"].run(GOAL, run_id="resume-me", limits=Limits(max_steps=spec.steps + 1))
        raise AssertionError("the run should have been detached")
    except RunDetached:
        pass
    await setup.aclose()
    journal = SQLiteJournal(path, durability=spec.durability)
    loop = Loop(FunctionModel(lambda _: _FINAL), tools=tools, journal=journal)
    wall, cpu, result = await timed(lambda: loop.resume("resume-me"))
    assert result.stop_reason is StopReason.agent_finished, result.stop_reason
    assert len(result.steps) == spec.steps + 1, len(result.steps)
    await journal.aclose()
    return Measured(wall, cpu, {"journal_bytes": sqlite_bytes(path), "resumed_steps": spec.steps})
