"""End-to-end: the reading commands (``runs``, ``show``, ``stats``, ``export``) on a
PostgreSQL journal (``--journal postgresql://…``) print what they print on a SQLite journal
holding the same runs; the commands that work on SQLite files only refuse a PostgreSQL URI in
one line naming the commands that take one; and a missing default journal points at the
demo's journal when it is there.

The PostgreSQL tests skip, saying how to run them, when no server can be had
(tests/durability/pg.py)."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest

from polyloop import Limits, Loop, ModelReply, Pricing, ToolCall, ToolRegistry, Usage
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest
from tests.batch import test_postgres as pg_tests
from tests.durability import pg
from tests.e2e import test_cli as base
from tests.e2e.test_cli import CLI, assert_one_line_error

pytest.importorskip("typer")

# The fixtures of the CLI tests, and of the PostgreSQL ones (a schema per test).
cli, pg_dsn, db = base.cli, pg_tests.pg_dsn, pg_tests.db

PRICE = Pricing(input_per_mtok=3.0, output_per_mtok=15.0)


def reply(r: ModelRequest) -> ModelReply:
    """Two ticks, then an answer; every call reports usage."""
    usage = Usage(1000 + r.step_idx, 100 + r.step_idx, cached_tokens=r.step_idx)
    if r.step_idx < 2:
        return ModelReply(tool_calls=(ToolCall("tick", {}),), usage=usage)
    return ModelReply(text="done", usage=usage)


def tick_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def tick() -> str:
        """One more step."""
        return "ticked"

    return tools


async def make_runs(journal: Any) -> None:
    """The same runs in any journal: one answered, one cut by its step budget."""
    async with journal:
        model = FunctionModel(reply, pricing=PRICE)
        loop = Loop(model, tools=tick_tools(), journal=journal)
        await loop.run("answer", run_id="answered")
        await loop.run("short", run_id="short", limits=Limits(max_steps=1))


# Times differ between the two journals (created, durations); everything else must not.
# (a step's own ms is the last column of show's step rows).
_TIMES = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\d+\.\d+|\b\d+ ms\b|\t\d+$", re.M)


def same_shape(text: str) -> str:
    return _TIMES.sub("T", text)


def test_the_readers_read_a_postgres_journal_as_they_read_sqlite(cli: CLI, db: pg.Db) -> None:
    sqlite_path = cli.cwd / "same.db"
    asyncio.run(make_runs(SQLiteJournal(sqlite_path)))
    asyncio.run(make_runs(db.journal()))
    uri = f"{db.dsn}#schema={db.schema}"
    for args in (("runs",), ("show", "answered"), ("show", "short", "--json"), ("stats",)):
        on_pg = cli(*args, "--journal", uri)
        on_sqlite = cli(*args, "--journal", str(sqlite_path))
        assert on_pg.code == 0 and on_pg.err == "", on_pg
        assert on_sqlite.code == 0, on_sqlite
        assert "agent_finished" in on_pg.out or args[-1] == "--json", on_pg
        if args[-1] == "--json":
            pg_doc, sqlite_doc = json.loads(on_pg.out), json.loads(on_sqlite.out)
            assert [s["step_idx"] for s in pg_doc["steps"]] == [0], pg_doc
            assert pg_doc.keys() == sqlite_doc.keys()
            assert pg_doc["run"]["stop_reason"] == sqlite_doc["run"]["stop_reason"]
            assert pg_doc["usage"] == sqlite_doc["usage"]
        else:
            assert same_shape(on_pg.out) == same_shape(on_sqlite.out), (on_pg, on_sqlite)
    assert "step_budget" in cli("runs", "--journal", uri, "--stop-reason", "step_budget").out
    exported = cli("export", "--journal", uri)
    assert exported.code == 0, exported
    rows = [json.loads(line) for line in exported.out.splitlines()]
    sqlite_rows = [
        json.loads(line) for line in cli("export", "--journal", str(sqlite_path)).out.splitlines()
    ]
    assert [(r["run_id"], r["step_idx"]) for r in rows] == [
        ("answered", 0),
        ("answered", 1),
        ("answered", 2),
        ("short", 0),
    ]
    assert [r.keys() for r in rows] == [r.keys() for r in sqlite_rows]
    for got, want in zip(rows, sqlite_rows, strict=True):
        for field in ("input_tokens", "output_tokens", "cached_tokens", "cost_usd", "tokens_used"):
            assert got[field] == want[field], (field, got, want)
    missing = cli("show", "nope", "--journal", uri)
    assert_one_line_error(missing)
    assert "no run 'nope' in " in missing.err and db.schema in missing.err, missing


def test_readers_on_an_unreachable_postgres_say_so_in_one_line(cli: CLI) -> None:
    uri = "postgresql://127.0.0.1:1/x"
    for done in cli.many(*((verb, "--journal", uri) for verb in ("runs", "stats", "export"))):
        assert_one_line_error(done)
        assert "cannot connect to the PostgreSQL journal" in done.err, done
        assert "postgresql:/127" not in done.err, done


@pytest.mark.parametrize(
    "args",
    [
        ("view",),
        ("report", "r1"),
        ("run", "a goal", "--model", "openai:m", "--workspace", "."),
        ("resume", "r1"),
    ],
)
def test_sqlite_only_commands_refuse_a_postgres_uri_in_one_line(
    cli: CLI, args: tuple[str, ...]
) -> None:
    done = cli(*args, "--journal", "postgresql://h/db")
    assert_one_line_error(done)
    assert "postgresql:/h" not in done.err, done
    assert "runs, show, stats, export, stop, cancel" in done.err, done
    assert "batch and recover" in done.err, done
    assert not (cli.cwd / "postgresql:").exists()


def test_a_missing_default_journal_points_at_the_demos(cli: CLI) -> None:
    asyncio.run(make_runs(SQLiteJournal(cli.cwd / "polyloop-demo.db")))
    for done in cli.many(*((verb,) for verb in ("runs", "stats", "export", "view"))):
        assert_one_line_error(done)
        assert "no journal at polyloop.db" in done.err, done
        assert done.err.rstrip().endswith(
            "(the demo's runs are in polyloop-demo.db: --journal polyloop-demo.db)"
        ), done
    (cli.cwd / "polyloop-demo.db").unlink()
    alone = cli("runs")
    assert_one_line_error(alone)
    assert "demo" not in alone.err, alone
