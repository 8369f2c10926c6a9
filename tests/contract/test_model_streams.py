"""Streaming adapters in a run (issue 16): each of the four adapters with ``stream=True``, through
``Loop``, its real SDK, its localhost fake and a SQLite journal, with an observer collecting the
events. The deltas reach observers in order and add up to what is journaled; the journal holds
exactly one complete reply per attempt; a stream cut off is a retried attempt, never a partial
reply; cancelling mid-stream ends the run ``cancelled`` and closes the connection; and a
``FallbackModel`` whose primary streams falls back only while nothing of the failed attempt was
shown."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from polyloop import FallbackModel, Loop, RetryPolicy, StopReason
from polyloop.events import ModelCallFinished, ModelCallStarted, ModelDelta
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock
from tests.fakes._server import cut
from tests.fakes.providers import IDS, PROVIDERS, Provider, adder, chosen, free_port


@pytest.fixture(params=PROVIDERS, ids=IDS)
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    return chosen(request.param, monkeypatch)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"


def rows(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as con:
        return con.execute(sql, args).fetchall()


def attempts(db: Path, run_id: str) -> list[tuple[Any, ...]]:
    return rows(
        db,
        "SELECT step_idx, attempt, state, model FROM model_calls WHERE run_id = ?"
        " ORDER BY step_idx, attempt",
        run_id,
    )


def deltas(events: list[object], kind: str, step: int, attempt: int | None = None) -> str:
    """The ``kind`` deltas of one step (and attempt), concatenated in the order received."""
    return "".join(
        e.text
        for e in events
        if isinstance(e, ModelDelta)
        and e.kind == kind
        and e.step_idx == step
        and (attempt is None or e.attempt == attempt)
    )


async def run_with_fallback(
    primary: Provider, primary_url: str, backup_url: str, db: Path, events: list[object]
) -> Any:
    """A run of ``FallbackModel(primary, backup)``, both streaming, two attempts each."""
    first = primary.model(primary_url, stream=True)
    second = primary.model(backup_url, stream=True)
    try:
        with SQLiteJournal(db) as journal:
            loop = Loop(
                FallbackModel(first, second),
                journal=journal,
                clock=FakeClock(),
                retry=RetryPolicy(max_attempts=2),
                observers=[events.append],
            )
            return await loop.run("The capital of France?", run_id="r")
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_streamed_tool_round_trip_runs_to_the_end_and_the_deltas_add_up_to_the_journal(
    provider: Provider, db: Path
) -> None:
    answer, reasoning = "2 + 3 = 5, as the tool said.", "The tool said 5."
    events: list[object] = []
    with provider.server() as fake:
        fake.script(
            provider.call("add", {"a": 2, "b": 3}, "call_7", stream=True),
            provider.answer(answer, reasoning, stream=True),
        )
        model = provider.model(fake.url, stream=True)
        with SQLiteJournal(db) as journal:
            loop = Loop(
                model, tools=adder(), journal=journal, clock=FakeClock(), observers=[events.append]
            )
            result = await loop.run("What is 2+3?", run_id="r")
        await model.aclose()
    assert (result.stop_reason, result.final_answer) == (StopReason.agent_finished, answer)
    assert result.steps[0].observation == "5"
    # Deltas, in order, add up to what the journal holds for each step.
    (call_step, answer_step) = rows(
        db,
        "SELECT raw_response, tool_args_json, reasoning_chars, llm_call_id FROM steps"
        " WHERE run_id = ? ORDER BY step_idx",
        "r",
    )
    assert (
        json.loads(deltas(events, "tool_call", 0)) == json.loads(call_step[1]) == {"a": 2, "b": 3}
    )
    assert deltas(events, "text", 1) == answer_step[0] == answer
    assert len(deltas(events, "reasoning", 1)) == answer_step[2] == len(reasoning)
    # Each delta comes between its attempt's ModelCallStarted and ModelCallFinished.
    kinds = [
        type(e).__name__
        for e in events
        if isinstance(e, ModelCallStarted | ModelCallFinished | ModelDelta)
    ]
    first_call = kinds[: kinds.index("ModelCallFinished") + 1]
    assert first_call[0] == "ModelCallStarted" and set(first_call[1:-1]) == {"ModelDelta"}
    # One complete reply per attempt in the accounts, with its usage and the answering model.
    calls = rows(
        db,
        "SELECT step_idx, attempt, state, llm_call_id, response_model, input_tokens,"
        " output_tokens FROM model_calls WHERE run_id = ? ORDER BY step_idx",
        "r",
    )
    assert [(c[0], c[1], c[2]) for c in calls] == [(0, 1, "ok"), (1, 1, "ok")]
    assert [c[3] for c in calls] == [call_step[3], answer_step[3]]
    assert all(c[4] and c[5] is not None and c[6] is not None for c in calls)
    assert result.usage is not None and result.usage.input_tokens == sum(c[5] for c in calls)


@pytest.mark.parametrize("end", ["drop", "complete"])
async def test_a_stream_cut_off_is_a_retried_attempt_and_only_the_next_reply_is_journaled(
    provider: Provider, db: Path, end: Any
) -> None:
    cut_short = provider.answer("Lyon is the capital of France.", stream=True)
    events: list[object] = []
    with provider.server() as fake:
        fake.script(
            cut(cut_short, len(cut_short.events) // 2, end),
            provider.answer("Paris is the capital of France.", stream=True),
        )
        model = provider.model(fake.url, stream=True)
        with SQLiteJournal(db) as journal:
            loop = Loop(model, journal=journal, clock=FakeClock(), observers=[events.append])
            result = await loop.run("The capital of France?", run_id="r")
        await model.aclose()
    assert result.final_answer == "Paris is the capital of France."
    assert [(s, a, state) for s, a, state, _ in attempts(db, "r")] == [
        (0, 1, "retried"),
        (0, 2, "ok"),
    ]
    # The journal holds the second attempt's reply alone; the first one's deltas were shown
    # (and belong to no reply), the second one's add up to the journaled text.
    assert rows(db, "SELECT step_idx, raw_response FROM steps WHERE run_id = ?", "r") == [
        (0, "Paris is the capital of France.")
    ]
    shown = deltas(events, "text", 0, attempt=1)
    assert (
        shown
        and "Lyon is the capital of France.".startswith(shown)
        and shown != "Lyon is the capital of France."
    )
    assert deltas(events, "text", 0, attempt=2) == "Paris is the capital of France."
    failed = [e for e in events if isinstance(e, ModelCallFinished) and e.attempt == 1]
    assert failed and failed[0].error is not None  # the attempt failed, in the events too


async def test_cancelling_mid_stream_ends_the_run_cancelled_and_closes_the_connection(
    provider: Provider, db: Path
) -> None:
    streamed = provider.answer("The capital of France is Paris.", stream=True)
    shown = asyncio.Event()

    def observe(event: object) -> None:
        if isinstance(event, ModelDelta):
            shown.set()

    with provider.server() as fake:
        fake.script(cut(streamed, len(streamed.events) - 2, "stall"))
        model = provider.model(fake.url, stream=True)
        with SQLiteJournal(db) as journal:
            loop = Loop(model, journal=journal, clock=FakeClock(), observers=[observe])
            run = asyncio.create_task(loop.run("The capital of France?", run_id="r"))
            await shown.wait()
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        (held,) = fake.requests
        closed = await asyncio.to_thread(held.disconnected.wait, 10)
        await model.aclose()
    assert closed  # the server saw the client close the stream's connection
    assert rows(db, "SELECT status, stop_reason FROM runs WHERE run_id = ?", "r") == [
        ("ended", "cancelled")
    ]
    assert rows(db, "SELECT count(*) FROM steps WHERE run_id = ?", "r") == [(0,)]


@pytest.mark.parametrize("failure", ["refused", "503"])
async def test_a_streaming_primary_that_fails_before_any_delta_falls_back_after_its_retries(
    provider: Provider, db: Path, failure: str
) -> None:
    events: list[object] = []
    with provider.server() as primary_fake, provider.server() as backup_fake:
        primary_fake.script(provider.overloaded(), provider.overloaded())
        backup_fake.script(provider.answer("Paris.", stream=True))
        url = primary_fake.url if failure == "503" else f"http://127.0.0.1:{free_port()}"
        result = await run_with_fallback(provider, url, backup_fake.url, db, events)
        asked = len(primary_fake.requests)
    assert result.final_answer == "Paris."
    assert [(a, state) for _, a, state, _ in attempts(db, "r")] == [
        (1, "retried"),
        (2, "retried"),
        (3, "ok"),
    ]
    assert asked == (2 if failure == "503" else 0)
    assert [e.attempt for e in events if isinstance(e, ModelDelta)] == [3] * len(
        [e for e in events if isinstance(e, ModelDelta)]
    )
    assert deltas(events, "text", 0, attempt=3) == "Paris."


async def test_a_streaming_primary_cut_off_after_its_deltas_were_shown_does_not_fall_back(
    provider: Provider, db: Path
) -> None:
    streamed = provider.answer("The capital of France is Paris.", stream=True)
    partial = cut(streamed, len(streamed.events) // 2)
    events: list[object] = []
    with provider.server() as primary_fake, provider.server() as backup_fake:
        primary_fake.script(partial, partial)
        backup_fake.script(provider.answer("Lyon.", stream=True))
        result = await run_with_fallback(provider, primary_fake.url, backup_fake.url, db, events)
    # Recovery stays with the model whose output was in view: its retries, then llm_error.
    assert result.stop_reason is StopReason.llm_error
    assert result.stop_detail is not None and "kind=connection" in result.stop_detail
    assert backup_fake.requests == []
    assert [(a, state, model) for _, a, state, model in attempts(db, "r")] == [
        (1, "retried", provider.model(primary_fake.url).name),
        (2, "failed", provider.model(primary_fake.url).name),
    ]
    assert deltas(events, "text", 0, attempt=1) == deltas(events, "text", 0, attempt=2) != ""
