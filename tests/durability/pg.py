"""PostgreSQL for the PostgreSQL journal's tests: a server, a fresh schema per test, plain SQL.

The server: ``POLYLOOP_TEST_PG_DSN`` when set (CI sets it from ``.ci/postgres.sh``; it must
then work: the tests fail rather than skip). Otherwise the session starts its own throwaway
cluster with the same script (without installing anything) and stops it at the end; when that
cannot be done the tests skip, saying why and how to run them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "postgres.sh"
ENV = "POLYLOOP_TEST_PG_DSN"
HOW = (
    f'to run them: export {ENV}="$(.ci/postgres.sh start DIR)" (the script installs '
    "PostgreSQL with apt-get when it is missing)"
)


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        pytest.skip("psycopg is not installed: pip install -e '.[postgres]' (or '.[dev]')")
    return psycopg


def _can_connect(dsn: str) -> str | None:
    """None when ``dsn`` accepts a connection, else the error."""
    psycopg = _psycopg()
    try:
        with psycopg.connect(dsn, connect_timeout=10):
            return None
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def server() -> Iterator[str]:
    """A DSN for the session: the environment's, or a cluster started (and stopped) here."""
    _psycopg()
    dsn = os.environ.get(ENV)
    if dsn:
        error = _can_connect(dsn)
        if error is not None:
            pytest.fail(f"{ENV} is set but PostgreSQL cannot be reached there: {error}")
        yield dsn
        return
    if shutil.which("bash") is None or not SCRIPT.exists():
        pytest.skip(f"PostgreSQL tests: no {ENV} and no bash to start a cluster; {HOW}")
    # /tmp itself is world-enterable, so the postgres user can reach the cluster's folder.
    folder = tempfile.mkdtemp(prefix="polyloop-pg-")
    try:
        started = subprocess.run(
            ["bash", str(SCRIPT), "start", folder],
            capture_output=True, text=True, timeout=120, check=False,
            env={**os.environ, "POLYLOOP_PG_NO_INSTALL": "1"},
        )  # fmt: skip
        if started.returncode != 0:
            tail = " | ".join(started.stderr.strip().splitlines()[-3:])
            pytest.skip(
                f"PostgreSQL tests: no {ENV}, and starting a cluster failed ({tail}); {HOW}"
            )
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", folder], capture_output=True, check=False,
                       timeout=60)  # fmt: skip
        shutil.rmtree(folder, ignore_errors=True)


def with_schema(dsn: str, schema: str) -> str:
    """``dsn`` whose connections use ``schema`` (libpq ``options``): for child processes,
    which then open ``PostgresJournal(dsn)`` without ``schema=``."""
    return str(_psycopg().conninfo.make_conninfo(dsn, options=f"-csearch_path={schema}"))


def connect(dsn: str) -> Any:
    """A plain autocommit psycopg connection."""
    return _psycopg().connect(dsn, autocommit=True)


class Db:
    """One schema of the test database, dropped after the test."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.schema = f"t_{secrets.token_hex(6)}"
        self.schema_dsn = with_schema(dsn, self.schema)
        self._conn: Any = None
        self.sql(f"CREATE SCHEMA {self.schema}")

    def journal(self, **kw: Any) -> Any:
        from polyloop.journal import PostgresJournal

        return PostgresJournal(self.dsn, schema=self.schema, **kw)

    def connect(self) -> Any:
        """A new connection whose search_path is the schema."""
        return connect(self.schema_dsn)

    def sql(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement in the schema (autocommit); its rows, or [] if it returns none."""
        return self._execute(query, args)

    def _execute(self, query: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if self._conn is None:
            self._conn = connect(self.dsn)
            self._conn.execute(f"SET search_path TO {self.schema}")
        cur = self._conn.execute(query, args or None)
        return list(cur.fetchall()) if cur.description is not None else []

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table in the schema, sorted: to show nothing was modified."""
        tables = [
            r[0]
            for r in self._execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", (self.schema,)
            )
        ]
        return {t: sorted(self._execute(f'SELECT * FROM "{t}"', ()), key=repr) for t in tables}

    def drop(self) -> None:
        self._execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE", ())
        self._conn.close()
        self._conn = None
