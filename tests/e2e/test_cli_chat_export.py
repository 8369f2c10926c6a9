"""End-to-end: ``polyloop export --format chat`` as a subprocess. On a journal written by
``polyloop run`` against the fake OpenAI-compatible server, a run's record holds the
conversation the model was sent at its last call, then its answer; with ``--redact`` none of
the content; with ``-o`` the same lines in a file. On a PostgreSQL journal, records equal to
the runs' ``RunResult.messages``, as on SQLite."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from polyloop import Limits, Loop, RunResult
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from tests.batch import test_postgres as pg_tests
from tests.durability import pg
from tests.e2e import test_cli as base
from tests.e2e.test_cli import (
    CLI,
    SECRET,
    SlowableServer,
    assert_one_line_error,
    read_call,
    run_args,
    run_id_of,
)
from tests.e2e.test_cli_postgres import PRICE, reply, tick_tools
from tests.fakes.openai_server import completion

pytest.importorskip("typer")
pytest.importorskip("openai")
pq = pytest.importorskip("pyarrow.parquet")

cli, fake, workspace = base.cli, base.fake, base.workspace
pg_dsn, db = pg_tests.pg_dsn, pg_tests.db


def records(out: str) -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in out.splitlines()]
    return {r["run_id"]: r for r in rows}


def test_chat_export_holds_what_the_model_was_sent_then_its_answer(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(read_call(), completion(f"The note says {SECRET}.", id="chatcmpl-2"))
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    run_id = run_id_of(done.out)
    j = ("--journal", "j.db")
    chat, redacted, to_file, parquet = cli.many(
        ("export", *j, "--format", "chat"),
        ("export", *j, "--format", "chat", "--redact"),
        ("export", *j, "--format", "chat", "-o", "runs.jsonl"),
        ("export", *j, "--format", "chat-parquet", "-o", "runs.parquet"),
    )
    for d in (chat, redacted, to_file, parquet):
        assert d.code == 0 and "Traceback" not in d.err, d

    (record,) = records(chat.out).values()
    assert record["run_id"] == run_id
    assert (record["stop_reason"], record["steps_used"]) == ("agent_finished", 2)
    assert record["metadata"]["cli"]["model"] == "openai:test-model"
    sent = fake.requests[-1].body["messages"]
    answer = {"role": "assistant", "content": f"The note says {SECRET}."}
    assert record["messages"] == [*sent, answer]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert [(t["message_index"], t["step_idx"], t["logprobs"]) for t in record["turns"]] == [
        (2, 0, None),
        (4, 1, None),
    ]
    assert record["tokens_used"] == sum(
        t["input_tokens"] + t["output_tokens"] for t in record["turns"]
    )

    assert SECRET not in redacted.out and "notes.txt" not in redacted.out, redacted
    assert "read notes" not in redacted.out, redacted
    (hidden,) = records(redacted.out).values()
    assert [m["role"] for m in hidden["messages"]] == [m["role"] for m in record["messages"]]
    call = hidden["messages"][2]["tool_calls"][0]
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == {"path": "[redacted]"}

    assert to_file.out == "" and "wrote 1 runs to runs.jsonl" in to_file.err, to_file
    assert (cli.cwd / "runs.jsonl").read_text(encoding="utf-8") == chat.out

    # chat-parquet: the same columns and values, metadata as its JSON text, nulls for the
    # keys a message has not (what a datasets.load_dataset("parquet", ...) row holds).
    assert "wrote 1 runs to runs.parquet" in parquet.err, parquet
    (row,) = pq.read_table(cli.cwd / "runs.parquet").to_pylist()
    assert list(row) == list(record)
    assert json.loads(row.pop("metadata")) == record.pop("metadata")
    assert row.pop("messages") == [
        {"content": None, "tool_calls": None, "tool_call_id": None, **m}
        for m in record.pop("messages")
    ]
    assert row == record


def test_chat_export_bad_output_is_one_line(cli: CLI) -> None:
    asyncio.run(make_runs(SQLiteJournal(cli.cwd / "j.db")))
    j = ("export", "--journal", "j.db")
    missing, parquet_to_stdout, parquet_missing = cli.many(
        (*j, "--format", "chat", "-o", "no-such-dir/runs.jsonl"),
        (*j, "--format", "chat-parquet"),
        (*j, "--format", "chat-parquet", "-o", "no-such-dir/runs.parquet"),
    )
    for done in (missing, parquet_to_stdout, parquet_missing):
        assert_one_line_error(done)
    assert "cannot write no-such-dir/runs.jsonl: No such file" in missing.err, missing
    assert "chat-parquet needs an output file: -o chat.parquet" in parquet_to_stdout.err
    assert "cannot write no-such-dir/runs.parquet" in parquet_missing.err, parquet_missing


async def make_runs(journal: Any) -> dict[str, RunResult]:
    """An answered run and one cut by its step budget (test_cli_postgres's runs)."""
    async with journal:
        model = FunctionModel(reply, pricing=PRICE)
        loop = Loop(model, tools=tick_tools(), journal=journal)
        return {
            "answered": await loop.run("answer", run_id="answered"),
            "short": await loop.run("short", run_id="short", limits=Limits(max_steps=1)),
        }


def test_chat_export_reads_a_postgres_journal_as_sqlite(cli: CLI, db: pg.Db) -> None:
    sqlite_path = cli.cwd / "same.db"
    on_sqlite = asyncio.run(make_runs(SQLiteJournal(sqlite_path)))
    on_pg = asyncio.run(make_runs(db.journal()))
    from_pg, from_sqlite = cli.many(
        ("export", "--journal", f"{db.dsn}#schema={db.schema}", "--format", "chat"),
        ("export", "--journal", str(sqlite_path), "--format", "chat"),
    )
    assert from_pg.code == 0 and from_pg.err == "", from_pg
    assert from_sqlite.code == 0, from_sqlite
    for exported, results in ((from_pg, on_pg), (from_sqlite, on_sqlite)):
        got = records(exported.out)
        assert sorted(got) == sorted(results)
        for run_id, result in results.items():
            assert got[run_id]["messages"] == json.loads(json.dumps(list(result.messages)))
            assert got[run_id]["stop_reason"] == result.stop_reason
            assert got[run_id]["cost_usd"] == pytest.approx(result.totals.cost_usd)
    assert records(from_pg.out)["short"]["stop_reason"] == "step_budget"
