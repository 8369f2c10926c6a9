"""The accounts of each model-call attempt in ``model_calls`` (journal schema 1.2), on SQLite and
PostgreSQL: the model each attempt asked (``model``, from its intent, also for attempts that
failed or were lost), the provider's name for the model that answered (``response_model``), and
the cached and reasoning tokens where the provider reported them; ``steps.model`` names the
model that answered the step."""

from __future__ import annotations

import pytest

from polyloop import FallbackModel, Loop, ModelCallError, ModelReply, RetryPolicy, StopReason
from polyloop.testing import FakeClock, ScriptedModel
from polyloop.types import Usage
from tests.conftest import Crash, call, make_tools
from tests.durability.journals import Store, recording

DOWN = ModelCallError("503", retryable=True, kind="server")


def answer(text: str, model: str, usage: Usage | None) -> ModelReply:
    return ModelReply(text=text, usage=usage, model=model)


async def test_every_attempt_names_its_model_and_the_answer_its_usage(
    journal_backend: Store,
) -> None:
    store = journal_backend
    primary = ScriptedModel(
        [DOWN, ModelReply(tool_calls=call("noop").tool_calls, model="p-2026-01")], name="x:p"
    )
    backup = ScriptedModel(
        [answer("done", "b-2025-09", Usage(100, 20, cached_tokens=60, reasoning_tokens=5))],
        name="y:b",
    )
    async with store.journal() as journal:
        loop = Loop(
            FallbackModel(primary, ScriptedModel([DOWN], name="y:b0"), backup),
            tools=make_tools(),
            journal=journal,
            clock=FakeClock(),
            retry=RetryPolicy(max_attempts=1),
        )
        r = await loop.run("go", run_id="r")
        assert r.stop_reason == StopReason.agent_finished
        r2 = await Loop(primary, tools=make_tools(), journal=journal, clock=FakeClock()).run(
            "again", run_id="r2"
        )
        assert r2.stop_reason == StopReason.llm_error  # the script ran out
    rows = store.rows(
        "SELECT step_idx, attempt, state, model, response_model, input_tokens, output_tokens,"
        " cached_tokens, reasoning_tokens FROM model_calls WHERE run_id = ?"
        " ORDER BY step_idx, attempt",
        "r",
    )
    assert [tuple(row.values()) for row in rows] == [
        (0, 1, "retried", "x:p", None, None, None, None, None),
        (0, 2, "retried", "y:b0", None, None, None, None, None),
        (0, 3, "ok", "y:b", "b-2025-09", 100, 20, 60, 5),
    ]
    assert store.sql("SELECT step_idx, model FROM steps WHERE run_id = ? ORDER BY 1", "r") == [
        (0, "y:b")
    ]
    # One model alone: its name on every attempt; the failed one has no response_model.
    assert store.sql(
        "SELECT step_idx, state, model, response_model FROM model_calls WHERE run_id = ?"
        " ORDER BY step_idx",
        "r2",
    ) == [(0, "ok", "x:p", "p-2026-01"), (1, "failed", "x:p", None)]


async def test_an_attempt_lost_in_a_crash_keeps_the_name_of_the_model_it_asked(
    journal_backend: Store,
) -> None:
    store = journal_backend
    model = ScriptedModel([call("noop"), "done"], name="x:p")
    async with store.journal() as journal:  # dies just after the first intent is durable
        loop = Loop(
            model, tools=make_tools(), journal=recording(journal, crash_at=1, crash_after=True)
        )
        with pytest.raises(Crash):
            await loop.run("go", run_id="lost")
        resumed = await Loop(
            ScriptedModel([answer("done", "p-1", Usage(3, 1))], name="x:p"),
            tools=make_tools(),
            journal=journal,
        ).resume("lost")
    assert resumed.final_answer == "done"
    assert store.sql(
        "SELECT attempt, state, model, response_model FROM model_calls WHERE run_id = ?"
        " ORDER BY attempt",
        "lost",
    ) == [(1, "uncertain", "x:p", None), (2, "ok", "x:p", "p-1")]
