"""Log-probabilities are journaled (journal schema 2.1): each answered attempt's tokens are kept
in its ``model_calls.logprobs`` row as one JSON array (NULL when none were recorded), not in
the ``journal`` body; every reader puts them back on the attempt's ``ModelResult``, so
``RunResult.logprobs`` and the chat export survive a resume and a reopened file; SQL joins them
to ``steps``; a 2.0 journal is read and migrated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polyloop import JournalError, Loop, ModelCallError, ModelReply, StopReason, ToolRegistry
from polyloop.journal import SQLiteJournal
from polyloop.observe.chat_export import chat_records
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelRequest, ModelResult, TokenLogprob
from tests.conftest import Crash, RecordingJournal, call
from tests.durability.conftest import OpenJournal
from tests.durability.journals import PostgresStore, SQLiteStore, Store, recording


def tokens(text: str, base: int) -> tuple[TokenLogprob, ...]:
    """One TokenLogprob per character of ``text``, with a token id and two alternatives."""
    return tuple(
        TokenLogprob(
            ch,
            -0.25 * (i + 1),
            base + i,
            (TokenLogprob(ch, -0.25 * (i + 1), base + i), TokenLogprob("é", -3.5)),
        )
        for i, ch in enumerate(text)
    )


def script(request: ModelRequest) -> ModelReply:
    """Step 0: a rate-limited first attempt (no reply), then a tool call; step 1: the answer."""
    if request.step_idx == 0 and request.attempt == 1:
        raise ModelCallError("slow down", retryable=True, kind="rate_limit")
    if request.step_idx == 0:
        return ModelReply(
            tool_calls=call("add", {"a": 1, "b": 2}).tool_calls, logprobs=tokens("ad", 10)
        )
    return ModelReply("3", logprobs=tokens("3!", 20))


def plain(request: ModelRequest) -> ModelReply:
    return call("add", {"a": 1, "b": 2}) if request.step_idx == 0 else ModelReply("3")


def loop(journal: Any, model: Any = script) -> Loop:
    registry = ToolRegistry()

    @registry.tool(replay="idempotent")
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return Loop(FunctionModel(model), tools=registry, journal=journal, clock=FakeClock())


def expected_logprobs() -> list[tuple[int, int, tuple[TokenLogprob, ...]]]:
    return [(0, 2, tokens("ad", 10)), (1, 1, tokens("3!", 20))]


def as_tuples(r: Any) -> list[tuple[int, int, tuple[TokenLogprob, ...]]]:
    return [(a.step_idx, a.attempt, a.tokens) for a in r.logprobs]


async def test_every_journal_keeps_each_attempts_logprobs_for_resume_and_export(
    every_journal: OpenJournal,
) -> None:
    async with every_journal() as journal:
        r = await loop(journal).run("add", run_id="lp")
    assert r.stop_reason == StopReason.agent_finished
    assert as_tuples(r) == expected_logprobs()
    async with every_journal() as journal:  # ended: resume rebuilds it from the journal
        again = await loop(journal).resume("lp")
        _, records = await journal.read("lp")
        exported = [record async for record in chat_records(journal)]
    assert as_tuples(again) == expected_logprobs()
    results = [x for x in records if isinstance(x, ModelResult)]
    assert [x.reply.logprobs for x in results] == [tokens("ad", 10), tokens("3!", 20)]
    turns = [t for t in exported[0]["turns"] if t["logprobs"] is not None]
    assert [len(t["logprobs"]) for t in turns] == [2, 2]
    assert turns[1]["logprobs"][0]["top_logprobs"][1] == {
        "token": "é",
        "logprob": -3.5,
        "token_id": None,
    }


async def test_the_logprobs_live_in_model_calls_not_in_the_journal_body(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        await loop(journal).run("add", run_id="lp")
    rows = store.sql(
        "SELECT step_idx, attempt, state, logprobs FROM model_calls WHERE run_id = ? "
        "ORDER BY step_idx, attempt",
        "lp",
    )
    assert [(s, a, state) for s, a, state, _ in rows] == [
        (0, 1, "retried"),
        (0, 2, "ok"),
        (1, 1, "ok"),
    ]
    assert rows[0][3] is None
    assert json.loads(rows[2][3]) == [
        {
            "token": "3",
            "logprob": -0.25,
            "token_id": 20,
            "top_logprobs": [
                {"token": "3", "logprob": -0.25, "token_id": 20},
                {"token": "é", "logprob": -3.5, "token_id": None},
            ],
        },
        {
            "token": "!",
            "logprob": -0.5,
            "token_id": 21,
            "top_logprobs": [
                {"token": "!", "logprob": -0.5, "token_id": 21},
                {"token": "é", "logprob": -3.5, "token_id": None},
            ],
        },
    ]
    # The bodies leave them out and say where they are.
    assert store.sql("SELECT count(*) FROM journal WHERE body LIKE '%\"logprob\"%'") == [(0,)]


async def test_sql_joins_each_token_to_its_step(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        await loop(journal).run("add", run_id="lp")
    if isinstance(store, PostgresStore):  # as the README's "Log-probabilities" has them
        query = """SELECT s.step_idx, s.tool_name, c.attempt, t.position - 1 AS position,
       t.value ->> 'token' AS token, (t.value ->> 'logprob')::float8 AS logprob
FROM steps s
JOIN model_calls c ON c.run_id = s.run_id AND c.step_idx = s.step_idx
CROSS JOIN LATERAL jsonb_array_elements(c.logprobs::jsonb) WITH ORDINALITY AS t(value, position)
WHERE s.run_id = ?
ORDER BY s.step_idx, c.attempt, t.position"""
    else:
        query = """SELECT s.step_idx, s.tool_name, c.attempt, t.key AS position,
       json_extract(t.value, '$.token') AS token, json_extract(t.value, '$.logprob') AS logprob
FROM steps s
JOIN model_calls c ON c.run_id = s.run_id AND c.step_idx = s.step_idx
JOIN json_each(c.logprobs) AS t
WHERE s.run_id = ?
ORDER BY s.step_idx, c.attempt, t.key"""
    assert store.sql(query, "lp") == [
        (0, "add", 2, 0, "a", -0.25),
        (0, "add", 2, 1, "d", -0.5),
        (1, None, 1, 0, "3", -0.25),
        (1, None, 1, 1, "!", -0.5),
    ]


async def test_a_run_resumed_after_a_crash_keeps_the_attempts_before_it(
    every_journal: OpenJournal,
) -> None:
    counted = RecordingJournal()
    ref = await loop(counted).run("add", run_id="ref")
    assert as_tuples(ref) == expected_logprobs()
    kept = []
    for n in range(2, counted.count + 1):  # before each append of the run but its creation
        async with every_journal() as journal:
            with pytest.raises(Crash):
                await loop(recording(journal, crash_at=n)).run("add", run_id=f"c{n}")
            _, records = await journal.read(f"c{n}")
        before = {(x.step_idx, x.attempt) for x in records if isinstance(x, ModelResult)}
        async with every_journal() as journal:
            r = await loop(journal).resume(f"c{n}")
        # Every attempt answered before the crash is there as it was; a lost one was asked again.
        assert before <= {(a.step_idx, a.attempt) for a in r.logprobs}, n
        assert [(s, t) for s, _, t in as_tuples(r)] == [(s, t) for s, _, t in expected_logprobs()]
        kept.append(len(before))
    assert kept[0] == 0 and 1 in kept  # crashes before the first answer and after it


async def test_off_by_default_every_row_holds_null(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        r = await loop(journal, plain).run("add", run_id="plain")
    assert r.logprobs == ()
    assert store.sql("SELECT count(*), count(logprobs) FROM model_calls") == [(2, 0)]


async def test_a_2_0_journal_is_read_and_migrated(journal_backend: Store, tmp_path: Path) -> None:
    store = journal_backend
    async with store.journal() as journal:
        await loop(journal, plain).run("add", run_id="old")
    store.damage(
        "ALTER TABLE model_calls DROP COLUMN logprobs",
        "UPDATE meta SET value = '2.0' WHERE key = 'journal_schema_version'",
        "UPDATE runs SET journal_schema_version = '2.0'",
    )
    if isinstance(store, SQLiteStore):  # a reader does not migrate it
        async with SQLiteJournal(store.path, read_only=True) as reader:
            _, records = await reader.read("old")
        assert [x.reply.logprobs for x in records if isinstance(x, ModelResult)] == [None, None]
        assert store.sql("SELECT value FROM meta WHERE key = 'journal_schema_version'") == [
            ("2.0",)
        ]
    async with store.journal() as journal:
        old = await loop(journal).resume("old")
        new = await loop(journal).run("add", run_id="new")
    assert store.sql("SELECT value FROM meta WHERE key = 'journal_schema_version'") == [("2.1",)]
    assert old.logprobs == () and as_tuples(new) == expected_logprobs()
    assert store.sql("SELECT count(logprobs) FROM model_calls WHERE run_id = 'new'") == [(2,)]


@pytest.mark.parametrize(
    "damage", ['[{"token": 1, "logprob": -1, "token_id": null, "top_logprobs": []}]', "[{"]
)
async def test_a_damaged_logprobs_column_is_refused_in_one_line(
    journal_backend: Store, damage: str
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        await loop(journal).run("add", run_id="lp")
    store.damage(f"UPDATE model_calls SET logprobs = '{damage}' WHERE step_idx = 1")
    async with store.journal() as journal:
        with pytest.raises(JournalError) as info:
            await journal.read("lp")
    message = str(info.value)
    assert "\n" not in message and "model_calls.logprobs" in message and "'lp'" in message


async def test_a_marked_result_whose_column_is_null_is_damage(journal_backend: Store) -> None:
    store = journal_backend
    async with store.journal() as journal:
        await loop(journal).run("add", run_id="lp")
    assert store.sql("SELECT count(*) FROM journal WHERE body LIKE '%logprobs_in%'") == [(2,)]
    store.damage("UPDATE model_calls SET logprobs = NULL WHERE step_idx = 1")
    async with store.journal() as journal:
        with pytest.raises(JournalError, match=r"no model_calls\.logprobs to read"):
            await journal.read("lp")
