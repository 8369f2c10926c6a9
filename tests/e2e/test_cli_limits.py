"""End-to-end: ``polyloop limits`` retunes a run's budgets from another process, ``show`` lists
the request, and values that cannot hold are one-line refusals that write nothing.

Every command runs as ``python -m polyloop.cli ...`` in a temporary directory (see
``test_cli.py``), judged by its output, exit code and the journal's rows.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest

from polyloop import Limits, Loop, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import RunSpec
from tests.conftest import call
from tests.e2e.test_cli import CLI, assert_one_line_error

pytest.importorskip("typer")


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(tmp_path)


def a_run_nobody_drives(path: Path, run_id: str, limits: Limits) -> None:
    async def go() -> None:
        async with SQLiteJournal(path) as journal:
            lease = await journal.create(RunSpec(run_id, "g", limits, 0.0), ttl_s=30)
            await journal.release(lease)

    asyncio.run(go())


def requests_of(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT seq, kind, values_json, requested_by, reason, outcome FROM requests"
        ).fetchall()


def test_limits_changes_a_run_nobody_drives_and_show_lists_it(cli: CLI) -> None:
    db = cli.cwd / "j.db"
    a_run_nobody_drives(db, "r", Limits(max_steps=2))
    done = cli("limits", "r", "--max-steps", "7", "--max-cost", "1.5", "--reason", "needs room",
               "--by", "ops", "--journal", str(db))  # fmt: skip
    assert done.code == 0, done
    assert done.out.count("\n") == 1 and "applied now" in done.out, done
    assert "max_steps 2 -> 7" in done.out and "max_cost none -> 1.5" in done.out, done
    (row,) = requests_of(db)
    assert row[:2] == (1, "limits") and row[3:] == ("ops", "needs room", "applied")
    assert json.loads(str(row[2])) == {
        "max_cost": {"old": None, "new": 1.5},
        "max_steps": {"old": 2, "new": 7},
    }
    shown = cli("show", "r", "--journal", str(db))
    assert shown.code == 0, shown
    assert "limits request 1 by ops" in shown.out and "max_steps 2 -> 7" in shown.out, shown
    as_json = cli("show", "r", "--json", "--journal", str(db))
    assert json.loads(as_json.out)["requests"][0]["values"]["max_steps"] == {"old": 2, "new": 7}

    async def resume() -> StopReason:
        async with SQLiteJournal(db) as journal:
            model = FunctionModel(lambda r: call("nope"))  # an unknown tool: a step each
            loop = Loop(model, journal=journal)
            result = await loop.resume("r")
            assert result.steps_used == 7
            return result.stop_reason

    assert asyncio.run(resume()) == StopReason.step_budget


@pytest.mark.parametrize(
    "bad",
    [
        ["--max-steps", "0"],
        ["--max-tokens", "-5"],
        ["--max-cost", "nan"],
        ["--max-seconds", "inf"],
        ["--max-actions", "0"],
        [],
    ],
)
def test_limits_refuses_what_cannot_hold_in_one_line_and_writes_nothing(
    cli: CLI, bad: list[str]
) -> None:
    db = cli.cwd / "j.db"
    a_run_nobody_drives(db, "r", Limits(max_steps=2))
    done = cli("limits", "r", *bad, "--reason", "x", "--journal", str(db))
    assert_one_line_error(done)
    assert requests_of(db) == []


def test_limits_of_an_ended_run_says_it_ended(cli: CLI) -> None:
    db = cli.cwd / "j.db"

    async def ended() -> None:
        async with SQLiteJournal(db) as journal:
            await Loop(FunctionModel(lambda r: "done"), journal=journal).run("g", run_id="e")

    asyncio.run(ended())
    done = cli("limits", "e", "--max-steps", "9", "--reason", "x", "--journal", str(db))
    assert_one_line_error(done)
    assert "has ended (agent_finished)" in done.err, done
    assert requests_of(db) == []


def test_show_reads_a_2_0_journal_without_a_requests_table(cli: CLI) -> None:
    db = cli.cwd / "j.db"
    a_run_nobody_drives(db, "r", Limits(max_steps=2))
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE requests")
        conn.execute("UPDATE meta SET value = '2.0' WHERE key = 'journal_schema_version'")
    shown = cli("show", "r", "--journal", str(db))  # a reader: it does not migrate
    assert shown.code == 0, shown
    assert "request" not in shown.out, shown
    with sqlite3.connect(db) as conn:
        version = conn.execute("SELECT value FROM meta WHERE key = 'journal_schema_version'")
        assert version.fetchall() == [("2.0",)]


def test_limits_refuses_a_run_id_or_reason_that_is_not_unicode_in_one_line(cli: CLI) -> None:
    from tests.e2e.test_cli_errors import run_bytes

    db = cli.cwd / "j.db"
    a_run_nobody_drives(db, "r", Limits(max_steps=2))
    bad = b"id\xff"
    for args in (
        ("limits", bad, "--max-steps", "3", "--reason", "x"),
        ("limits", "r", "--max-steps", "3", "--reason", bad),
    ):
        done = run_bytes(cli, *args, "--journal", str(db))
        assert_one_line_error(done)
        assert "U+DCFF" in done.err and "not valid Unicode" in done.err, done
    assert requests_of(db) == []
