"""The server's own context-length error (a 256-token window, a longer prompt) ends the run
``llm_error`` with kind ``context_length``, after one attempt: it is never retried, and never
``context_overflow`` (that is PolyLoop's check, before a request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from polyloop import Limits, Loop, RetryPolicy, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.testing.real_model import LlamaServer

from .support import Wire, assert_journal_matches_wire, journal_kinds, model_calls, run_row, steps

pytestmark = pytest.mark.real_model

# About 600 tokens: more than the 256-token window.
GOAL = "Repeat these words in order: " + " ".join(f"word{i}" for i in range(150))


async def test_c_a_real_context_length_error_is_llm_error_and_not_retried(
    small_server: LlamaServer, tmp_path: Path
) -> None:
    db = tmp_path / "runs.db"
    wire = Wire(small_server.base_url)
    try:
        async with SQLiteJournal(db) as journal:
            loop = Loop(
                wire.model(),
                journal=journal,
                retry=RetryPolicy(max_attempts=3),  # room for retries that must not happen
                limits=Limits(max_steps=3),
            )
            result = await loop.run(GOAL, run_id="c")
    finally:
        await wire.aclose()

    assert result.stop_reason == StopReason.llm_error
    (exchange,) = wire.exchanges  # one attempt, no retry
    assert exchange.status == 400
    assert exchange.received["error"]["code"] == "context_length_exceeded"
    assert result.stop_detail is not None
    assert result.stop_detail.startswith("ModelCallError: BadRequestError")
    assert result.stop_detail.endswith("[kind=context_length, retryable=False, attempts=1]")

    (step,) = steps(db, "c")
    assert (step["raw_response"], step["parse_ok"], step["parse_error"]) == ("", 0, None)
    assert step["llm_call_id"] is None and step["action"] is None
    (call,) = model_calls(db, "c")
    assert call["state"] == "failed" and call["attempt"] == 1
    assert "maximum context length is 256 tokens" in call["error"]
    assert_journal_matches_wire(db, "c", wire.exchanges)
    assert journal_kinds(db, "c")[-3:] == ["model_failure", "step", "end"]
    run = run_row(db, "c")
    assert (run["stop_reason"], run["steps_used"], run["actions_executed"]) == ("llm_error", 1, 0)
