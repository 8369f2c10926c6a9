"""The journal's stored form is a public data format: the DDL of a fresh journal and the rows a
fixed sequence of journal calls writes equal the snapshot (``journal_snapshot.py`` says how it
was made), in SQLite (every durability and writer) and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from polyloop.journal import SQLiteJournal
from tests.durability import journal_snapshot as snap
from tests.durability.journals import PostgresStore

SNAPSHOT: dict[str, Any] = json.loads(snap.SNAPSHOT.read_text())


@pytest.mark.parametrize("mode", sorted(snap.SQLITE_MODES))
async def test_a_fresh_sqlite_journal_has_the_snapshot_ddl_and_writes_its_rows(
    tmp_path: Path, mode: str
) -> None:
    path = tmp_path / "j.db"
    async with SQLiteJournal(path, clock=lambda: snap.NOW, **snap.SQLITE_MODES[mode]) as journal:
        assert snap.as_json(snap.sqlite_ddl(path)) == SNAPSHOT["sqlite"]["ddl"][mode]
        await snap.replay(journal, SNAPSHOT["ops"])
    assert snap.as_json(snap.sqlite_rows(path)) == SNAPSHOT["sqlite"]["rows"]


async def test_a_fresh_postgres_journal_has_the_snapshot_ddl_and_writes_its_rows(
    db: PostgresStore,
) -> None:
    async with db.journal(clock=lambda: snap.NOW) as journal:
        assert snap.as_json(snap.pg_ddl(db)) == SNAPSHOT["postgres"]["ddl"]
        await snap.replay(journal, SNAPSHOT["ops"])
    assert snap.as_json(snap.pg_rows(db)) == SNAPSHOT["postgres"]["rows"]
