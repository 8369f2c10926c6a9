"""PostgreSQL for the PostgreSQL journal's tests: a server, a fresh schema per test, plain SQL,
and a fork server for the SIGKILL crash harness.

The server: ``POLYLOOP_TEST_PG_DSN`` when set (CI sets it from ``.ci/postgres.sh``; it must
then work: the tests fail rather than skip). Otherwise the session starts its own throwaway
cluster with the same script (without installing anything) and stops it at the end; when that
cannot be done the tests skip, saying why and how to run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
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
        if self._conn is None:
            self._conn = connect(self.dsn)
            self._conn.execute(f"SET search_path TO {self.schema}")
        cur = self._conn.execute(query, args or None)
        return list(cur.fetchall()) if cur.description is not None else []

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table in the schema, sorted: to show nothing was modified."""
        tables = [
            r[0]
            for r in self.sql(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1", self.schema
            )
        ]
        return {t: sorted(self.sql(f'SELECT * FROM "{t}"'), key=repr) for t in tables}

    def drop(self) -> None:
        self.sql(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        self._conn.close()
        self._conn = None


# -- the SIGKILL harness's fork server --------------------------------------------------------

_FORK_SERVER = r"""
import asyncio, os, sys
import psycopg, psycopg_pool
import tests.durability.crash_child as child

print("ready", flush=True)
for line in sys.stdin:
    journal, run_id, n, when, effects = line.rstrip("\n").split("\t")
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(child.main(journal, int(n), when == "after", effects, run_id))
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkServer:
    """A process that imports tests/durability/crash_child.py once, then forks one child per
    request to run :func:`crash_child.main` (which SIGKILLs itself around its n-th journal
    write) and reports how the child ended. Each child is a real process holding the lease
    when it dies; forking spares the harness a Python start and the imports for each of its
    crash points."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lock = asyncio.Lock()

    @classmethod
    async def start(cls) -> ForkServer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FORK_SERVER,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"ready", line
        return cls(proc)

    async def crash(self, journal: str, run_id: str, n: int, after: bool, effects: Path) -> int:
        """Run the scenario as ``run_id`` in a forked child dying around write ``n``; the
        child's exit code."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        async with self.lock:
            when = "after" if after else "before"
            request = f"{journal}\t{run_id}\t{n}\t{when}\t{effects}\n"
            self.proc.stdin.write(request.encode())
            await self.proc.stdin.drain()
            reply = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        return int(reply)

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
