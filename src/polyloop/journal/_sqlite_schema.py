"""The SQLite journal's file: its tables (DDL and the checks that a file holds them), the SQL
statements only SQLite runs (those both journals speak are in :mod:`polyloop.journal._sql`),
and opening a file (connect, check, WAL, create the schema). The tables are described in
:mod:`polyloop.journal.sqlite`."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import time
from pathlib import Path
from typing import Literal

from ..types import STEP_SCHEMA_VERSION, JournalError
from ._sql import REQUESTS_DDL, STATUS_CHECK, STEP_COLUMNS, STEPS_COUNTED
from ._sqlite_damage import _damaged_error, _is_damage
from ._versions import (
    _ADDED_COLUMNS,
    JOURNAL_SCHEMA_VERSION,
    _check_meta,
    _check_tables,
    _level,
    _needs_migration,
    foreign_meta,
)

Durability = Literal["full", "normal"]
"""``SQLiteJournal(durability=...)``: ``synchronous=FULL`` or ``NORMAL``."""

log = logging.getLogger("polyloop")

# -- the schema -------------------------------------------------------------------------------

# Column order in ``runs`` is deliberate: the small, mutable columns come first and the bulky,
# immutable ones (goal, limits, metadata, history) last, so reading the lease never walks the
# overflow pages of a long history.
_RUNS_DDL = """CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT,
    lease_expires_at REAL,
    status TEXT NOT NULL CHECK (status IN ('running', 'ended', 'awaiting_approval')),
    stop_reason TEXT,
    steps_used INTEGER NOT NULL DEFAULT 0,
    actions_executed INTEGER NOT NULL DEFAULT 0,
    tokens_used INTEGER,
    cost_usd REAL,
    active_seconds REAL,
    usage_missing INTEGER,
    created_at REAL NOT NULL,
    ended_at REAL,
    journal_schema_version TEXT NOT NULL,
    wording_version TEXT NOT NULL,
    stop_detail TEXT,
    final_answer TEXT,
    request TEXT CHECK (request IN ('stop', 'cancel')),
    request_reason TEXT,
    requested_by TEXT,
    requested_at REAL,
    goal TEXT NOT NULL,
    limits_json TEXT NOT NULL,
    metadata_json TEXT,
    history_json TEXT NOT NULL
)"""

_DDL: tuple[str, ...] = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)",
    _RUNS_DDL,
    "CREATE INDEX runs_by_status ON runs (status, lease_expires_at)",
    "CREATE TABLE steps (\n    run_id TEXT NOT NULL,\n"
    + "".join(f"    {name} {decl},\n" for name, decl in STEP_COLUMNS)
    + "    PRIMARY KEY (run_id, step_idx)\n)",
    """CREATE TABLE journal (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    written_at REAL NOT NULL,
    PRIMARY KEY (run_id, seq)
)""",
    """CREATE TABLE model_calls (
    run_id TEXT NOT NULL,
    step_idx INTEGER NOT NULL,
    intent_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    llm_call_id TEXT,
    state TEXT NOT NULL
        CHECK (state IN ('pending', 'ok', 'failed', 'retried', 'uncertain')),
    input_tokens INTEGER,
    output_tokens INTEGER,
    latency_ms REAL,
    error TEXT,
    model TEXT,
    response_model TEXT,
    cached_tokens INTEGER,
    reasoning_tokens INTEGER,
    cost_usd REAL,
    logprobs TEXT,
    PRIMARY KEY (intent_id, attempt)
)""",
    "CREATE INDEX model_calls_by_run ON model_calls (run_id, step_idx)",
    REQUESTS_DDL,
)
_TABLES = frozenset({"meta", "runs", "steps", "journal", "model_calls"})

# The statements only SQLite has (those both journals speak are in ``_sql``).
_INSERT_RUN = """INSERT INTO runs (run_id, owner, lease_expires_at, status, created_at,
    journal_schema_version, wording_version, goal, limits_json, metadata_json, history_json)
    VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (run_id) DO NOTHING"""
# Taking over a lease read under the write lock (``acquire``), unless it changed meanwhile.
_TAKE_LEASE = """UPDATE runs SET owner = ?, lease_expires_at = ?
    WHERE run_id = ? AND owner IS ? AND lease_expires_at IS ?"""
_RENEW = "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND owner = ?"
# Ending a run nobody holds (``request_end``): the lease taken for the transaction, which the
# end record releases.
_TAKE_TO_END = "UPDATE runs SET owner = ?, lease_expires_at = ? WHERE run_id = ?"
# Every column, read by name: a journal of an older minor lacks the columns added since (their
# fields take their defaults), a newer minor's extra columns are read past.
_READ_STEPS = "SELECT * FROM steps WHERE run_id = ? ORDER BY step_idx"
# The fence of an append. A step's append keeps the run's counters current, in the step's
# transaction; matching only while the writer holds the lease, it is also the append's fence
# (0 rows: lease lost). Another append is fenced by an update that changes no byte of the row
# (owner = owner), so it writes nothing and never copies the history.
_COUNT_STEPS = """UPDATE runs SET steps_used = steps_used + ?,
    actions_executed = actions_executed + ? WHERE run_id = ? AND owner = ?"""
_FENCE = "UPDATE runs SET owner = owner WHERE run_id = ? AND owner = ?"
_RECOUNT = f"UPDATE runs SET\n    {STEPS_COUNTED}\n    WHERE run_id = ?"


# -- opening a file ---------------------------------------------------------------------------


def _open_writer(path: str, durability: Durability, busy_timeout_s: float) -> sqlite3.Connection:
    """Connect, check the file is a PolyLoop journal of a readable version (creating the
    schema only in an empty database), then switch to WAL and migrate a journal of an older
    minor version (``_migrate``). Nothing is written to a file that is refused."""
    _check_writable(path)
    try:
        conn = sqlite3.connect(
            path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise JournalError(f"cannot open the SQLite journal {path}: {exc}") from exc
    try:
        try:
            names = _schema_names(conn)
        except sqlite3.DatabaseError as exc:
            raise _open_failure(path, exc) from exc
        version = _check_polyloop(conn, path, names) if names else JOURNAL_SCHEMA_VERSION
        mode = _switch_to_wal(conn, path, busy_timeout_s)
        if mode.lower() != "wal":
            log.warning(
                "SQLite journal %s: WAL mode is unavailable (journal_mode=%s); "
                "writers will block readers",
                path,
                mode,
            )
        conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
        if not names:
            _create_schema(conn, path)
        elif _needs_migration(version):
            _migrate(conn, path)
    except sqlite3.Error as exc:  # switching to WAL, creating or migrating (rolled back)
        conn.close()
        raise _setup_failure(path, exc, busy_timeout_s) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def _setup_failure(path: str, exc: sqlite3.Error, busy_timeout_s: float) -> JournalError:
    """The one-line error for a journal whose setup at open (WAL mode, creating or migrating
    its tables) SQLite refused: every change it made was rolled back."""
    if _is_damage(exc):
        return _damaged_error(path, exc)
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return JournalError(
            f"cannot open the SQLite journal {path}: another connection kept it locked for "
            f"longer than busy_timeout_s={busy_timeout_s} s ({exc}); it was not modified. Try "
            "again, or pass a longer busy_timeout_s"
        )
    return JournalError(f"cannot open the SQLite journal {path}: {exc} (it was not modified)")


def _switch_to_wal(conn: sqlite3.Connection, path: str, busy_timeout_s: float) -> str:
    """``PRAGMA journal_mode = WAL``; the mode the file is in after it. Leaving the rollback
    journal needs the file to itself, and SQLite answers "database is locked" at once, without
    its busy handler, while another connection reads it (several processes opening a new file
    together): retried until ``busy_timeout_s`` has passed, then ``JournalError``."""
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.001
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode & 0xFF != sqlite3.SQLITE_BUSY:  # extended codes too
                raise
            if time.monotonic() >= deadline:
                raise JournalError(
                    f"cannot switch the SQLite journal {path} to WAL mode: another connection "
                    f"kept it locked for {busy_timeout_s} s ({exc})"
                ) from exc
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _schema_names(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


def _check_polyloop(conn: sqlite3.Connection, path: str, names: set[str]) -> str:
    """Refuse a database that is not a PolyLoop journal this version can read; its journal
    schema version."""
    if "meta" not in names:
        shown = ", ".join(sorted(names)[:8])
        raise JournalError(
            f"{path} is a SQLite database but not a PolyLoop journal (it holds {shown} and no "
            "PolyLoop 'meta' table); refusing to touch it (it was not modified). Pass the path "
            "of a PolyLoop journal or of a new file."
        )
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error as exc:
        if _is_damage(exc):
            raise _damaged_error(path, exc) from exc
        raise foreign_meta(str(path), exc) from None
    _check_meta(meta, str(path))
    want = _table_columns()
    have = {t: {row[1] for row in conn.execute(f"PRAGMA table_info({t})")} for t in want}
    version = str(meta["journal_schema_version"])
    _check_tables(str(path), names, have, want, version)
    return version


@functools.cache
def _table_columns() -> dict[str, tuple[str, ...]]:
    """The columns of each table as ``_DDL`` creates them (read back from SQLite itself)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        for statement in _DDL:
            conn.execute(statement)
        return {
            table: tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
            for table in sorted(_TABLES)
        }


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring a journal of an older version to ``JOURNAL_SCHEMA_VERSION``: add the columns the
    minors since then added and set the version in ``meta``, in one transaction (another
    writer may have done it meanwhile: then nothing changes). A PolyLoop of major 1 refuses
    the file from then on (see ``JOURNAL_SCHEMA_VERSION``)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT value FROM meta WHERE key = 'journal_schema_version'").fetchone()
        old = row[0]
        if _needs_migration(old):
            for added, table, column, decl in _ADDED_COLUMNS:
                have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
                if added > _level(old) and column not in have:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            if _level(old) < (1, 4):
                _widen_status(conn)
            conn.execute(REQUESTS_DDL)  # 2.1
            conn.execute(
                "UPDATE meta SET value = ? WHERE key = 'journal_schema_version'",
                (JOURNAL_SCHEMA_VERSION,),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if _needs_migration(old):
        log.info(
            "SQLite journal %s: migrated from journal schema %s to %s",
            path,
            old,
            JOURNAL_SCHEMA_VERSION,
        )


_OLD_STATUS_CHECK = "CHECK (status IN ('running', 'ended'))"
_NEW_STATUS_CHECK = STATUS_CHECK


def _widen_status(conn: sqlite3.Connection) -> None:
    """Journal schema 1.4: let ``runs.status`` hold ``'awaiting_approval'``. A CHECK constraint
    that admits more values changes no stored row, so the table's definition is edited in
    place, as SQLite's documentation describes for such changes (ALTER TABLE, "making other
    kinds of table schema changes"), and the schema cookie is bumped so every connection reads
    the new definition. Runs inside the migration's transaction."""
    (cookie,) = conn.execute("PRAGMA schema_version").fetchone()
    conn.execute("PRAGMA writable_schema = ON")
    try:
        conn.execute(
            "UPDATE sqlite_master SET sql = replace(sql, ?, ?) "
            "WHERE type = 'table' AND name = 'runs'",
            (_OLD_STATUS_CHECK, _NEW_STATUS_CHECK),
        )
        conn.execute(f"PRAGMA schema_version = {int(cookie) + 1}")
    finally:
        conn.execute("PRAGMA writable_schema = OFF")


def _create_schema(conn: sqlite3.Connection, path: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        names = _schema_names(conn)  # another process may have created it meanwhile
        if names:
            _check_polyloop(conn, path, names)
        else:
            for statement in _DDL:
                conn.execute(statement)
            conn.executemany(
                "INSERT INTO meta (key, value) VALUES (?, ?)",
                [
                    ("journal_schema_version", JOURNAL_SCHEMA_VERSION),
                    ("step_schema_version", STEP_SCHEMA_VERSION),
                ],
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


# -- failures at open, writable folders, opening read-only ------------------------------------


def _open_failure(path: str, exc: sqlite3.DatabaseError) -> JournalError:
    """The one-line error for a file SQLite could not even list the tables of: damaged (a
    PolyLoop journal's or any file's structure), not SQLite at all, or not openable."""
    code = getattr(exc, "sqlite_errorcode", None)
    if _is_damage(exc) and code != sqlite3.SQLITE_NOTADB:
        return _damaged_error(path, exc)
    if isinstance(exc, sqlite3.OperationalError) and code is not None:
        return JournalError(f"cannot open the SQLite journal {path}: {exc}")
    return JournalError(
        f"{path} is not a SQLite database ({exc}); refusing to use it as a PolyLoop "
        "journal (it was not modified). Pass the path of a PolyLoop journal or of a "
        "new file."
    )


_READ_ONLY_HINT = (
    "(reading it needs no write access: SQLiteJournal(path, read_only=True), or the polyloop "
    "commands runs, show, stats, export, view, report and check)"
)


def _check_writable(path: str) -> None:
    """Refuse a journal SQLite could not write, in one line, before SQLite tries: an existing
    file that is not writable, or a folder in which the file (if new) and its ``-wal`` and
    ``-shm`` files cannot be created (WAL mode needs both, also to read). A folder that does
    not exist is left to SQLite's own error. Two ``access`` calls: no cost worth measuring."""
    real = os.path.realpath(path)  # SQLite keeps the -wal file next to the file a link names
    folder = os.path.dirname(real) or "."
    name = os.path.basename(real)
    if not os.path.isdir(folder):
        return
    if not os.access(folder, os.W_OK | os.X_OK):
        raise JournalError(
            f"cannot write the journal {path}: the directory {folder} is not writable (SQLite "
            f"needs to create {name}-wal and {name}-shm next to the journal); make it writable "
            f"or move the journal {_READ_ONLY_HINT}"
        )
    if os.path.exists(real) and not os.access(real, os.W_OK):
        raise JournalError(
            f"cannot write the journal {path}: the file is not writable; make it writable "
            f"(chmod u+w) {_READ_ONLY_HINT}"
        )


def _read_only_uri(path: str, *, immutable: bool) -> str:
    uri = f"{Path(os.path.abspath(path)).as_uri()}?mode=ro"
    return f"{uri}&immutable=1" if immutable else uri


def _open_read_only(path: str, busy_timeout_s: float) -> tuple[sqlite3.Connection, str, bool]:
    """A read-only connection to the PolyLoop journal at ``path`` (checked as
    :func:`_open_writer` checks it), the URI that opens more like it, and whether it is
    ``immutable``. Never creates or modifies the journal (``mode=ro`` in a writable folder
    leaves the empty ``-wal`` and ``-shm`` files SQLite makes for every reader of a WAL-mode
    file).

    ``mode=ro`` first: it sees every commit, also those of a writer working meanwhile. Reading
    a WAL-mode file needs its ``-shm`` file; where that cannot be created (a read-only folder
    and no writer holding the file open), the file is opened ``immutable=1``: SQLite then
    takes no locks and assumes nobody changes the file, so what a writer commits later is not
    seen. A ``-wal`` file holding commits is refused then (immutable would not read them).
    """
    if not os.path.isfile(path):
        raise JournalError(
            f"no journal at {path} (a journal opened read-only is never created: pass the path "
            "of an existing journal)"
        )
    immutable = False
    while True:
        uri = _read_only_uri(path, immutable=immutable)
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise JournalError(f"cannot open the SQLite journal {path}: {exc}") from exc
        try:
            try:
                conn.execute("PRAGMA query_only = ON")
                names = _schema_names(conn)
            except sqlite3.OperationalError as exc:
                code = (exc.sqlite_errorcode or 0) & 0xFF
                if immutable or code not in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
                    raise _open_failure(path, exc) from exc
                conn.close()
                _refuse_unread_wal(path)
                immutable = True
                continue
            except sqlite3.DatabaseError as exc:
                raise _open_failure(path, exc) from exc
            if not names:
                raise JournalError(
                    f"{path} is an empty database, not a PolyLoop journal yet (a journal opened "
                    "read-only creates nothing; open it writable to create one)"
                )
            try:
                _check_polyloop(conn, path, names)
            except sqlite3.DatabaseError as exc:
                raise _open_failure(path, exc) from exc
        except BaseException:
            conn.close()
            raise
        return conn, uri, immutable


def _refuse_unread_wal(path: str) -> None:
    try:
        pending = os.path.getsize(f"{path}-wal")
    except OSError:
        return
    if pending:
        raise JournalError(
            f"cannot read the journal {path}: {path}-wal holds commits not yet in the file, and "
            f"SQLite cannot read them without a {path}-shm file it can create or write; make the "
            "directory writable, or copy the journal with its -wal file to a writable place"
        )
