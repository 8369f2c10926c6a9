"""Fixtures of the durable journals' tests: a store per test on each backend.

``journal_backend`` runs a test once on a SQLite file and once on a PostgreSQL schema (see
tests/durability/journals.py for what a store offers); ``every_journal`` runs a kernel test on
the memory journal too, handing it a function that opens a journal object on one store. The
PostgreSQL runs skip, saying why and how to run them, when no server can be started; with
``POLYLOOP_TEST_PG_DSN`` set (CI) they fail instead (tests/durability/pg.py).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from polyloop.journal import MemoryJournal
from tests.durability import pg
from tests.durability.journals import PostgresStore, SQLiteProcessStore, SQLiteStore, Store


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


@pytest.fixture(params=["sqlite", "sqlite-process", "postgres"])
def journal_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, empty store of each durable journal (``sqlite-process``: the SQLite journal
    with ``writer="process"``)."""
    if request.param in ("sqlite", "sqlite-process"):
        folder = tmp_path / "store"
        folder.mkdir()
        kind = SQLiteStore if request.param == "sqlite" else SQLiteProcessStore
        return kind(folder / "j.db")
    store: PostgresStore = request.getfixturevalue("db")
    return store


OpenJournal = Callable[[], AbstractAsyncContextManager[Any]]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def every_journal(request: pytest.FixtureRequest, tmp_path: Path) -> OpenJournal:
    """``async with every_journal() as journal``: a journal object on one fresh store of each
    journal (memory, SQLite, PostgreSQL); a second call opens another object on the same store
    (the memory journal hands back the same object: it is its only store)."""
    if request.param == "memory":
        memory = MemoryJournal()

        @contextlib.asynccontextmanager
        async def same() -> AsyncIterator[Any]:
            yield memory

        return same
    store: Store = (
        request.getfixturevalue("db")
        if request.param == "postgres"
        else SQLiteStore(tmp_path / "every.db")
    )
    return store.journal


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
