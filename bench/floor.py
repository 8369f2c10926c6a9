"""The hand-written floor: the least code that does the same work as an agent loop.

``floor``: an asyncio loop that calls the fake model, calls the tool, appends two messages,
repeats. ``floor_sqlite``: the same, plus the commits PolyLoop's durable journal makes per step
(the first model intent alone; then per tool step model result + action intent, and action
result + step + the next step's model intent: 2 per step; the final answer's result + step +
end), each its own fsync'd transaction on one SQLite connection in WAL mode
(``synchronous=FULL`` or ``NORMAL``), made inline on the event loop thread — what the disk
costs, nothing more.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from typing import Any

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

_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": TOOL_NAME, "arguments": "{}"}}
    ],
}
_FINAL = {"role": "assistant", "content": FINAL_ANSWER}


async def _model(messages: list[dict[str, Any]], step_idx: int, steps: int, latency: float):
    if latency:
        await asyncio.sleep(latency)
    return _FINAL if is_final(step_idx, steps) else _CALL


async def _noop() -> str:
    return TOOL_RESULT


class _Disk:
    """The commits PolyLoop's journal makes per step, one row per record."""

    def __init__(self, path: str, durability: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute(f"PRAGMA synchronous = {durability.upper()}")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS journal (run_id TEXT, seq INTEGER, body TEXT, "
            "PRIMARY KEY (run_id, seq))"
        )
        self.commits = 0

    def commit(self, run_id: str, seq: int, *bodies: dict[str, Any]) -> int:
        """One transaction holding ``bodies`` as rows ``seq``, ``seq + 1``, ...; the next seq."""
        self.conn.execute("BEGIN IMMEDIATE")
        for body in bodies:
            self.conn.execute(
                "INSERT INTO journal VALUES (?, ?, ?)", (run_id, seq, json.dumps(body))
            )
            seq += 1
        self.conn.execute("COMMIT")
        self.commits += 1
        return seq


async def _run(spec: Spec, disk: _Disk | None, latency: float) -> str:
    run_id = os.urandom(8).hex()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": GOAL},
    ]
    seq = 1
    if disk is not None:
        seq = disk.commit(run_id, seq, {"kind": "model_intent", "step_idx": 0})
    for i in range(spec.steps):
        reply = await _model(messages, i, spec.steps, latency)
        result = {"kind": "model_result", "step_idx": i, "reply": reply}
        messages.append(reply)
        if reply is _FINAL:
            if disk is not None:
                step = {"kind": "step", "step_idx": i}
                seq = disk.commit(run_id, seq, result, step, {"kind": "end"})
            return str(reply["content"])
        if disk is not None:
            intent = {"kind": "action_intent", "step_idx": i, "tool": TOOL_NAME}
            seq = disk.commit(run_id, seq, result, intent)
        observation = await _noop()
        if disk is not None:
            step = {"kind": "step", "step_idx": i, "observation": observation}
            nxt = {"kind": "model_intent", "step_idx": i + 1}
            seq = disk.commit(run_id, seq, {"kind": "action_result"}, step, nxt)
        messages.append({"role": "tool", "tool_call_id": "c", "content": observation})
    return ""


async def _batches(spec: Spec, disk: _Disk | None) -> None:
    latency = spec.latency_ms / 1000
    for _ in range(spec.batches):
        out = await asyncio.gather(*(_run(spec, disk, latency) for _ in range(spec.runs)))
        assert all(o == FINAL_ANSWER for o in out), out


async def measure(spec: Spec) -> Measured:
    durable = spec.system == "floor_sqlite"
    disk = None
    path = os.path.join(spec.workdir, "floor.db")
    if durable:
        warm = _Disk(os.path.join(spec.workdir, "warm.db"), spec.durability)
        await _run(Spec(spec.system, "warmup", 5), warm, 0.0)
        warm.conn.close()
        disk = _Disk(path, spec.durability)
    else:
        await _run(Spec(spec.system, "warmup", 5), None, 0.0)
    before = sqlite_bytes(path) if durable else 0
    wall, cpu, _ = await timed(lambda: _batches(spec, disk))
    extra: dict[str, Any] = {}
    if disk is not None:
        extra["journal_bytes"] = sqlite_bytes(path) - before
        extra["commits"] = disk.commits
        disk.conn.close()
        extra["stored_bytes"] = stored_bytes(path) - before
    return Measured(wall, cpu, extra)
