"""kill -9 of a process while its real model call is in flight, then resume: the lost attempt
is ``uncertain`` in ``model_calls``, the same intent is called again with the next attempt and
the same conversation, and the run ends as it would have."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from polyloop import RunResult, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.testing.real_model import LlamaServer

from .crash_child import crash_loop
from .support import (
    Wire,
    assert_journal_matches_wire,
    journal_kinds,
    model_calls,
    run_row,
    steps,
    table,
)

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parents[2]


def _kill_mid_call(db: Path, base_url: str, run_id: str, sent: Path) -> None:
    """Start the child, wait (bounded) until its request is on the wire, SIGKILL it, reap it."""
    args = [str(db), base_url, run_id, str(sent)]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.real_model.crash_child", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 120)
        line = child.stdout.readline() if ready else ""
        if line != "sent\n":
            child.kill()
            _, err = child.communicate()
            pytest.fail(f"the child did not send its model call (printed {line!r}): {err}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert child.returncode == -signal.SIGKILL


def test_e_kill_9_during_a_real_model_call_then_resume(
    tool_server: LlamaServer, tmp_path: Path
) -> None:
    db, sent = tmp_path / "runs.db", tmp_path / "sent.json"
    _kill_mid_call(db, tool_server.base_url, "e", sent)

    # What the crash left: a model intent, its attempt pending, no result, no step, no end.
    (lost,) = model_calls(db, "e")
    assert (lost["attempt"], lost["state"], lost["llm_call_id"]) == (1, "pending", None)
    assert journal_kinds(db, "e")[-1] == "model_intent"
    assert steps(db, "e") == []
    assert run_row(db, "e")["status"] == "running"

    async def resume() -> tuple[RunResult, Wire]:
        wire = Wire(tool_server.base_url)
        try:
            async with SQLiteJournal(db) as journal:
                # The dead child's lease is taken over at once (its owner is provably dead).
                return await crash_loop(wire, journal).resume("e"), wire
        finally:
            await wire.aclose()

    result, wire = asyncio.run(resume())

    assert result.stop_reason == StopReason.task_completed
    # The call was made again, with the very conversation the killed process had sent.
    (exchange,) = wire.exchanges
    assert exchange.sent == json.loads(sent.read_text())
    calls = model_calls(db, "e")
    assert [(c["attempt"], c["state"]) for c in calls] == [(1, "uncertain"), (2, "ok")]
    assert calls[0]["intent_id"] == calls[1]["intent_id"] == lost["intent_id"]
    assert (calls[0]["input_tokens"], calls[0]["output_tokens"]) == (None, None)
    assert_journal_matches_wire(db, "e", wire.exchanges)
    intents = table(
        db,
        "SELECT body FROM journal WHERE run_id = ? AND kind = 'model_intent' ORDER BY seq",
        "e",
    )
    bodies = [json.loads(r["body"]) for r in intents]
    assert [(b["intent_id"], b["attempt"]) for b in bodies] == [
        (lost["intent_id"], 1),
        (lost["intent_id"], 2),
    ]
    (step,) = steps(db, "e")
    assert (step["tool_name"], step["action_status"], step["llm_call_id"]) == (
        "submit",
        "executed",
        calls[1]["llm_call_id"],
    )
    run = run_row(db, "e")
    assert (run["status"], run["stop_reason"], run["steps_used"]) == ("ended", "task_completed", 1)
