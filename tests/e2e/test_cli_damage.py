"""End-to-end: damaged journal files and the ``polyloop`` command. ``check`` finds what the
reading commands would call damaged; the writing commands refuse a file SQLite's
``quick_check`` finds damaged, before they write anything.

Every command runs as ``python -m polyloop.cli ...`` (see ``test_cli.py``), judged by its
output and exit code only; the damage is made with plain sqlite3 and by overwriting a page.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest

from tests.durability.test_sqlite_damage import overwrite_page, table_leaves, write_runs
from tests.e2e.test_cli import CLI, assert_one_line_error, run_args
from tests.fakes.openai_server import FakeOpenAIServer

pytest.importorskip("typer")
pytest.importorskip("openai")

DAMAGED = 8  # ExitCode.DAMAGED


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(tmp_path)


def update(path: Path, query: str, *params: object) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        assert conn.execute(query, params).rowcount == 1


def test_check_reports_records_the_reading_commands_call_damaged(cli: CLI) -> None:
    db = cli.cwd / "j.db"
    asyncio.run(write_runs(db, 4))
    # SQLite's own check finds nothing wrong with either: a body that is not JSON, and a
    # JSON body whose kind is not the row's.
    cut_short = '{"kind": "mod'
    update(db, "UPDATE journal SET body = ? WHERE run_id = ? AND seq = 2", cut_short, "run-001")
    update(db, "UPDATE journal SET kind = 'run_end' WHERE run_id = ? AND seq = 3", "run-002")

    found = cli("check", "--journal", "j.db")
    assert found.code == DAMAGED, found
    assert found.err == "" and len(found.out.splitlines()) == 1, found
    assert found.out.startswith("j.db: DAMAGED: "), found
    assert "run 'run-001': journal record 2 is not valid JSON" in found.out, found
    assert "run 'run-002': journal record 3 does not match its kind 'run_end'" in found.out, found
    assert "run-000" not in found.out and "run-003" not in found.out, found
    assert "polyloop show" not in found.out  # says which runs cannot be read, and what to do
    assert "2 of 4 runs cannot be read" in found.out, found

    # What show says of the same runs (resume reads them as show does).
    for run_id, seq in (("run-001", 2), ("run-002", 3)):
        shown = cli("show", run_id, "--journal", "j.db")
        assert_one_line_error(shown)
        assert f"run {run_id!r}: journal record {seq} " in shown.err, shown
    assert cli("show", "run-000", "--journal", "j.db").code == 0


def test_a_record_body_nested_too_deeply_to_decode_is_damage_not_a_crash(cli: CLI) -> None:
    db = cli.cwd / "j.db"
    asyncio.run(write_runs(db, 2))
    deep = '{"kind": "model_intent", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    update(db, "UPDATE journal SET body = ? WHERE run_id = ? AND seq = 1", deep, "run-001")
    found = cli("check", "--journal", "j.db")
    assert found.code == DAMAGED, found
    assert "run 'run-001': journal record 1 is not valid JSON" in found.out, found
    assert "1 of 2 runs cannot be read" in found.out, found
    shown = cli("show", "run-001", "--journal", "j.db")
    assert_one_line_error(shown)
    assert "run 'run-001': journal record 1 " in shown.err, shown


def test_writing_commands_refuse_a_file_damaged_at_page_level_in_one_line(
    cli: CLI, tmp_path: Path
) -> None:
    db = tmp_path / "j.db"
    asyncio.run(write_runs(db, 40))
    leaves = table_leaves(db, "steps")
    overwrite_page(db, leaves[len(leaves) // 2])  # pages none of these commands reads
    before = db.read_bytes()
    (tmp_path / "goals.jsonl").write_text('{"goal": "g"}\n', encoding="utf-8")
    (tmp_path / "ws").mkdir()
    fake = FakeOpenAIServer().start()
    try:
        j = ("--journal", "j.db")
        model = ("--model", "openai:test-model", "--base-url", fake.url, "--workspace", "ws")
        writing = {
            "run": run_args(fake, tmp_path / "ws"),
            "resume": ("resume", "run-000", *j),
            "batch": ("batch", "goals.jsonl", *model, *j),
            "recover": ("recover", *j),
            "approve": ("approve", "run-000", "op", *j),
            "deny": ("deny", "run-000", "op", "--reason", "x", *j),
            "stop": ("stop", "run-000", "--reason", "x", *j),
            "cancel": ("cancel", "run-000", *j),
        }
        done = dict(zip(writing, cli.many(*writing.values()), strict=True))
        assert fake.requests == []
    finally:
        fake.stop()
    for name, d in done.items():
        try:
            assert_one_line_error(d, DAMAGED)
            assert "j.db is damaged (SQLite quick_check: " in d.err
            assert "nothing was written; run `polyloop check --journal j.db`" in d.err
        except AssertionError:
            raise AssertionError(f"{name}: {d}") from None
    assert db.read_bytes() == before
    # The reading commands still read what they can.
    assert cli("runs", "--journal", "j.db").code == 0
