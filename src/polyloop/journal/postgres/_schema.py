"""The PostgreSQL journal's schema: its tables as they are created (the SQLite journal's
tables, columns and meanings in PostgreSQL's types, plus ``runs.version``, the fencing token),
and opening a schema: create the tables in an empty one, accept (and migrate) a PolyLoop
journal of a readable version, refuse anything else without modifying it.

The functions take psycopg's ``sql`` module and ``Error`` class from the caller, which imported
psycopg lazily (layout.md rule 6)."""

from __future__ import annotations

import hashlib
import logging
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final

from ...types import STEP_SCHEMA_VERSION, JournalError
from .._sql import REQUESTS_DDL, STATUS_CHECK, STEP_COLUMNS
from .._versions import (
    _ADDED_COLUMNS,
    JOURNAL_SCHEMA_VERSION,
    _check_meta,
    _check_tables,
    _level,
    _needs_migration,
    foreign_meta,
)

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    _Conn = AsyncConnection[tuple[Any, ...]]

log = logging.getLogger("polyloop")

# -- the tables ---------------------------------------------------------------------------------


def _pg_decl(decl: str) -> str:
    """A SQLite column declaration in PostgreSQL's types (``REAL`` is ``DOUBLE PRECISION``)."""
    return decl.replace("REAL", "DOUBLE PRECISION")


_TABLE_COLUMNS: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "meta": (("key", "TEXT PRIMARY KEY"), ("value", "TEXT NOT NULL")),
    "runs": (
        ("run_id", "TEXT PRIMARY KEY"),
        ("owner", "TEXT"),
        ("lease_expires_at", "DOUBLE PRECISION"),
        ("version", "BIGINT NOT NULL DEFAULT 0"),
        ("status", f"TEXT NOT NULL {STATUS_CHECK}"),
        ("stop_reason", "TEXT"),
        ("steps_used", "INTEGER NOT NULL DEFAULT 0"),
        ("actions_executed", "INTEGER NOT NULL DEFAULT 0"),
        ("tokens_used", "INTEGER"),  # journal schema 1.3, as the three below
        ("cost_usd", "DOUBLE PRECISION"),
        ("active_seconds", "DOUBLE PRECISION"),
        ("usage_missing", "INTEGER"),
        ("created_at", "DOUBLE PRECISION NOT NULL"),
        ("ended_at", "DOUBLE PRECISION"),
        ("journal_schema_version", "TEXT NOT NULL"),
        ("wording_version", "TEXT NOT NULL"),
        ("stop_detail", "TEXT"),
        ("final_answer", "TEXT"),
        ("request", "TEXT CHECK (request IN ('stop', 'cancel'))"),  # journal schema 1.3,
        ("request_reason", "TEXT"),  # as the two below
        ("requested_by", "TEXT"),
        ("requested_at", "DOUBLE PRECISION"),
        ("goal", "TEXT NOT NULL"),
        ("limits_json", "TEXT NOT NULL"),
        ("metadata_json", "TEXT"),
        ("history_json", "TEXT NOT NULL"),
    ),
    # One column per StepRecord field, the SQLite journal's list (kernel.md §7).
    "steps": (("run_id", "TEXT NOT NULL"), *((n, _pg_decl(d)) for n, d in STEP_COLUMNS)),
    "journal": (
        ("run_id", "TEXT NOT NULL"),
        ("seq", "INTEGER NOT NULL"),
        ("kind", "TEXT NOT NULL"),
        ("body", "TEXT NOT NULL"),
        ("written_at", "DOUBLE PRECISION NOT NULL"),
    ),
    "model_calls": (
        ("run_id", "TEXT NOT NULL"),
        ("step_idx", "INTEGER NOT NULL"),
        ("intent_id", "TEXT NOT NULL"),
        ("attempt", "INTEGER NOT NULL"),
        ("llm_call_id", "TEXT"),
        (
            "state",
            "TEXT NOT NULL CHECK (state IN ('pending', 'ok', 'failed', 'retried', 'uncertain'))",
        ),
        ("input_tokens", "INTEGER"),
        ("output_tokens", "INTEGER"),
        ("latency_ms", "DOUBLE PRECISION"),
        ("error", "TEXT"),
        ("model", "TEXT"),  # journal schema 1.2, as the four below
        ("response_model", "TEXT"),
        ("cached_tokens", "INTEGER"),
        ("reasoning_tokens", "INTEGER"),
        ("cost_usd", "DOUBLE PRECISION"),  # journal schema 1.3
        ("logprobs", "TEXT"),  # journal schema 2.1: JSON, as the journal's bodies
    ),
}
_TABLE_TAIL: Final = {
    "meta": "",
    # Room on each page for the version bumps to be HOT updates (no index touched).
    "runs": " WITH (fillfactor = 80)",
    "steps": ",\n    PRIMARY KEY (run_id, step_idx)",
    "journal": ",\n    PRIMARY KEY (run_id, seq)",
    "model_calls": ",\n    PRIMARY KEY (intent_id, attempt)",
}


def _create_table(name: str) -> str:
    cols = ",\n".join(f"    {col} {decl}" for col, decl in _TABLE_COLUMNS[name])
    tail = _TABLE_TAIL[name]
    if tail.startswith(","):
        return f"CREATE TABLE {name} (\n{cols}{tail}\n)"
    return f"CREATE TABLE {name} (\n{cols}\n){tail}"


_DDL: Final[tuple[str, ...]] = (
    *(_create_table(name) for name in _TABLE_COLUMNS),
    "CREATE INDEX runs_by_status ON runs (status, lease_expires_at)",
    "CREATE INDEX model_calls_by_run ON model_calls (run_id, step_idx)",
    _pg_decl(REQUESTS_DDL),  # journal schema 2.1
)


def _lock_key(name: str) -> int:
    """A 64-bit advisory lock key for creating the schema or tables named ``name``."""
    digest = hashlib.sha256(f"polyloop-journal:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# -- opening a schema ---------------------------------------------------------------------------


async def set_search_path(conn: _Conn, schema: str | None, sql: ModuleType) -> None:
    """Point the connection at ``schema`` (None: leave its current schema)."""
    if schema is not None:
        await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))


async def check_schema(
    conn: _Conn, schema: str | None, server: str, sql: ModuleType, error: type[Exception]
) -> None:
    """Create the tables in an empty namespace (``schema``, created if missing; None: the
    connection's current one); accept a readable PolyLoop journal, migrating an older minor;
    refuse anything else without modifying it. ``server`` names it in messages."""
    if schema is not None:
        cur = await conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
        if await cur.fetchone() is None:
            async with conn.transaction():  # IF NOT EXISTS alone races with itself
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(schema),))
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
    await set_search_path(conn, schema, sql)
    cur = await conn.execute("SELECT current_schema()")
    row = await cur.fetchone()
    namespace = None if row is None else row[0]
    if namespace is None:
        where = server + (f" (schema {schema})" if schema else "")
        raise JournalError(
            f"the PostgreSQL journal {where}: the connection has no current schema "
            "(its search_path names none that exists); pass schema= or fix the search_path"
        )
    where = f"{server} schema {namespace!r}"
    names = await _relations(conn, namespace)
    if names:
        version = await _check_polyloop(conn, where, namespace, names, error)
        if _needs_migration(version):
            await _migrate(conn, where, namespace)
        return
    async with conn.transaction():
        # Two processes opening one empty schema: the second waits, then finds the tables.
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(namespace),))
        names = await _relations(conn, namespace)
        if names:
            await _check_polyloop(conn, where, namespace, names, error)
            return
        for statement in _DDL:
            await conn.execute(statement)
        await conn.cursor().executemany(
            "INSERT INTO meta (key, value) VALUES (%s, %s)",
            [
                ("journal_schema_version", JOURNAL_SCHEMA_VERSION),
                ("step_schema_version", STEP_SCHEMA_VERSION),
            ],
        )


async def _relations(conn: _Conn, namespace: str) -> set[str]:
    cur = await conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')",
        (namespace,),
    )
    return {str(r[0]) for r in await cur.fetchall()}


async def _migrate(conn: _Conn, where: str, namespace: str) -> None:
    """Bring a journal of an older version to ``JOURNAL_SCHEMA_VERSION`` (the SQLite
    journal's ``_migrate``), in one transaction under the schema's advisory lock."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(namespace),))
        cur = await conn.execute(
            "SELECT value FROM meta WHERE key = 'journal_schema_version' FOR UPDATE"
        )
        row = await cur.fetchone()
        old = None if row is None else row[0]
        if old is None or not _needs_migration(old):
            return  # another writer migrated it meanwhile
        for added, table, column, decl in _ADDED_COLUMNS:
            if added > _level(old):
                await conn.execute(
                    f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {_pg_decl(decl)}"
                )
        if _level(old) < (1, 4):  # 1.4: runs.status may be 'awaiting_approval'
            await conn.execute("ALTER TABLE runs DROP CONSTRAINT IF EXISTS runs_status_check")
            await conn.execute("ALTER TABLE runs ADD CONSTRAINT runs_status_check " + STATUS_CHECK)
        await conn.execute(_pg_decl(REQUESTS_DDL))  # 2.1
        await conn.execute(
            "UPDATE meta SET value = %s WHERE key = 'journal_schema_version'",
            (JOURNAL_SCHEMA_VERSION,),
        )
    log.info(
        "PostgreSQL journal %s: migrated from journal schema %s to %s",
        where,
        old,
        JOURNAL_SCHEMA_VERSION,
    )


async def _check_polyloop(
    conn: _Conn, where: str, namespace: str, names: set[str], error: type[Exception]
) -> str:
    """Refuse a schema that is not a PolyLoop journal this version can read; its journal
    schema version."""
    if "meta" not in names:
        shown = ", ".join(sorted(names)[:8])
        raise JournalError(
            f"{where} holds tables ({shown}) and no PolyLoop 'meta' table: it is not a "
            "PolyLoop journal; refusing to touch it (it was not modified). Pass schema= "
            "naming an empty or PolyLoop schema."
        )
    try:
        cur = await conn.execute("SELECT key, value FROM meta")
        meta = {str(k): v for k, v in await cur.fetchall()}
    except error as exc:
        raise foreign_meta(where, exc) from None
    _check_meta(meta, where)
    cur = await conn.execute(
        "SELECT c.relname, a.attname FROM pg_attribute a "
        "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = ANY(%s) AND a.attnum > 0 "
        "AND NOT a.attisdropped",
        (namespace, sorted(_TABLE_COLUMNS)),
    )
    have: dict[str, set[str]] = {}
    for table, column in await cur.fetchall():
        have.setdefault(str(table), set()).add(str(column))
    want = {table: [c for c, _ in columns] for table, columns in _TABLE_COLUMNS.items()}
    version = str(meta["journal_schema_version"])
    _check_tables(where, names, have, want, version)
    return version
