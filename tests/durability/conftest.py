"""Fixtures of the durable journals' tests: a store per test on each backend.

``journal_backend`` runs a test once on a SQLite file and once on a PostgreSQL schema (see
tests/durability/journals.py for what a store offers). The PostgreSQL runs skip, saying why and
how to run them, when no server can be started; with ``POLYLOOP_TEST_PG_DSN`` set (CI) they
fail instead (tests/durability/pg.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.durability import pg
from tests.durability.journals import PostgresStore, SQLiteStore, Store


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    with pg.server() as dsn:
        yield dsn


@pytest.fixture
def db(pg_dsn: str) -> Iterator[PostgresStore]:
    """A fresh schema of the test database, dropped after the test."""
    store = PostgresStore(pg_dsn)
    try:
        yield store
    finally:
        store.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def journal_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of each durable journal."""
    if request.param == "sqlite":
        folder = tmp_path / "store"
        folder.mkdir()
        return SQLiteStore(folder / "j.db")
    store: PostgresStore = request.getfixturevalue("db")
    return store


@pytest.fixture(autouse=True)
def _no_stray_writer_threads() -> Iterator[None]:
    """Every SQLite journal a test opened was closed, or collected, by its end."""
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [t for t in threading.enumerate() if t.name.startswith("polyloop-journal-writer")]
        if not left:
            return
        time.sleep(0.01)
    raise AssertionError(f"writer threads left running: {left}")
