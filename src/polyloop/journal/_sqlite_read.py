"""Reading a SQLite journal, in worker threads on their own connections: a run's spec and
records (decoded by ``_rows._parse_run``, as every reader decodes them), its steps,
``list_runs``' and ``step_usage``'s queries, and the read connections of a read-only
journal."""

from __future__ import annotations

import sqlite3
from typing import Any

from ..types import Record, RunNotFound, RunSpec, StepRecord
from . import _observations
from ._observations import READ_LARGE
from ._reading import STEP_USAGE_FIELDS, list_runs_sql, listed_row, step_usage_query
from ._rows import _parse_run, _steps_of, has_logprobs
from ._sql import READ_LOGPROBS, READ_RECORDS, READ_RUN, REQUEST_COLUMNS, RUN_FOUND
from ._sqlite_damage import _Health
from ._sqlite_schema import _READ_STEPS, _open_read_only
from ._sqlite_writer import _Readers


def _read_run(conn: sqlite3.Connection, run_id: str) -> tuple[RunSpec, tuple[Record, ...]]:
    row = conn.execute(READ_RUN, (run_id,)).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    rows = conn.execute(READ_RECORDS, (run_id,)).fetchall()
    # After the records: a result's steps row was written with it and is never changed.
    large = dict(conn.execute(READ_LARGE, (run_id, _observations.SHARED_ABOVE)).fetchall())
    logprobs = _logprobs(conn, run_id) if has_logprobs(rows) else {}
    return _parse_run(run_id, row, rows, large, logprobs)


def _logprobs(conn: sqlite3.Connection, run_id: str) -> dict[tuple[str, int], str]:
    """The run's attempts' ``model_calls.logprobs`` by (intent_id, attempt)."""
    rows = conn.execute(READ_LOGPROBS, (run_id,)).fetchall()
    return {(intent_id, attempt): text for intent_id, attempt, text in rows}


def _read_steps(conn: sqlite3.Connection, run_id: str) -> list[StepRecord]:
    if conn.execute(RUN_FOUND, (run_id,)).fetchone() is None:
        raise RunNotFound(run_id)
    cur = conn.execute(_READ_STEPS, (run_id,))
    return _steps_of(run_id, [d[0] for d in cur.description], cur.fetchall())


def _list_runs(
    conn: sqlite3.Connection,
    status: str | None,
    run_id: str | None,
    now: float,
    after: tuple[float, str] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    # A journal of an older minor, read without migrating it, lacks the newer columns.
    have = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    requests = ", ".join(c if c in have else f"NULL AS {c}" for c in REQUEST_COLUMNS)
    calls = {row[1] for row in conn.execute("PRAGMA table_info(model_calls)")}
    query, params = list_runs_sql(
        status,
        run_id,
        requests=requests,
        runs_have=have,
        calls_have=calls,
        after=after,
        limit=limit,
    )
    cur = conn.execute(query, params)
    names = [d[0] for d in cur.description]
    return [listed_row(names, row, now) for row in cur.fetchall()]


def _step_usage(conn: sqlite3.Connection, run_id: str) -> dict[int, dict[str, Any]]:
    if conn.execute(RUN_FOUND, (run_id,)).fetchone() is None:
        raise RunNotFound(run_id)
    calls = {row[1] for row in conn.execute("PRAGMA table_info(model_calls)")}
    cur = conn.execute(step_usage_query(calls), (run_id,))
    return {row[0]: dict(zip(STEP_USAGE_FIELDS, row[1:], strict=True)) for row in cur}


def _read_only_pool(path: str, busy_timeout_s: float, health: _Health) -> tuple[_Readers, bool]:
    """The read connections of a read-only journal (the first one opened, and the file
    checked, now; the others like it on demand), and whether they are ``immutable``."""
    conn, uri, immutable = _open_read_only(path, busy_timeout_s)

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(
            uri, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )

    return _Readers(path, busy_timeout_s, health, connect=connect, idle=[conn]), immutable
