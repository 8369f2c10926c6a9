"""The embedded durable journal: one SQLite file, standard library ``sqlite3`` only.

Tables (their names and columns are public: downstream SQL reads them directly)::

    runs         one row per run: run_id, owner, lease_expires_at, status ('running'|'ended'),
                 stop_reason (NULL until ended), steps_used, actions_executed, created_at,
                 ended_at, journal_schema_version, wording_version, stop_detail, final_answer,
                 goal, limits_json, metadata_json, history_json
    steps        one row per step record: run_id plus a column per StepRecord field, same
                 names (booleans as 0/1); PRIMARY KEY (run_id, step_idx)
    journal      the append-only records: run_id, seq (1, 2, ... per run), kind, body (the
                 canonical JSON of ``record_to_dict``), written_at; PRIMARY KEY (run_id, seq)
    model_calls  the accounts, one row per model-call attempt: run_id, step_idx, intent_id,
                 attempt, llm_call_id, state, input_tokens, output_tokens, latency_ms, error;
                 PRIMARY KEY (intent_id, attempt)
    meta         key/value: journal_schema_version, step_schema_version

``model_calls.state`` is ``pending`` (intent written, no answer yet), ``ok``, ``retried`` (failed,
retried), ``failed`` (the step's final failure) or ``uncertain``: the attempt's answer was lost
(a crash between intent and result, found when the next attempt of the same intent arrives, or
a run that ended while the call was in flight). The provider may have served and billed it.

``runs.steps_used`` and ``runs.actions_executed`` are the end record's counters: they are set
when the run ends (``status = 'ended'``). A running run's progress is in ``steps``
(``SELECT count(*) FROM steps WHERE run_id = ?``); :meth:`SQLiteJournal.list_runs` reports it.
Keeping them out of the per-step writes is deliberate: a step never rewrites the ``runs`` row,
which holds the run's history (see "bytes per step" below).

Writes. One writer thread owns the write connection. The writes queued meanwhile (``append``,
``create``, lease changes) share one ``BEGIN IMMEDIATE`` transaction (group commit: one fsync
for many runs), run first without savepoints; if one of them fails (lease lost, a duplicate
key), the transaction is rolled back and the batch runs again with a SAVEPOINT per write, so
the conflict fails only that call. The callers are answered only after ``COMMIT`` returned, with
one wake-up of their event loop per batch, so a run proceeds only once its record is durable.
Every ``append`` is fenced in its transaction: by ``UPDATE runs SET owner = owner WHERE run_id
= ? AND owner = ?`` (0 rows: the lease is no longer ours, ``LeaseLost``, nothing written), or
from memory when that proves the same: this connection's last committed write of the run left
it owned by this execution, and no other connection has committed since (``PRAGMA
data_version``, read under the write lock). Every write of this connection that changes an
owner updates that memory.

Reads run in worker threads on their own connections (WAL: readers never wait for the writer),
so the event loop never waits on SQLite.

Bytes per step. A step's appends insert its ``journal`` rows, its ``steps`` row and its
``model_calls`` rows, and nothing else: the fence changes no byte, so SQLite writes no page for
it. The ``runs`` row, which holds ``history_json``, is rewritten only when the lease changes
hands (create, acquire, release) and when the run ends (SQLite rewrites a whole row whose size
changes); renewing a lease rewrites one page.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import operator
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

from ..types import (
    STEP_SCHEMA_VERSION,
    ConfigError,
    ErrorInfo,
    JournalError,
    Lease,
    LeaseLost,
    Limits,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelResult,
    PolyLoopError,
    Record,
    RunEnd,
    RunExists,
    RunLeased,
    RunNotFound,
    RunSpec,
    StepRecord,
    StepWritten,
    canonical_json,
    record_from_dict,
    record_json,
)
from ._owner import new_owner, owner_is_dead

if TYPE_CHECKING:
    from ..seams import Journal

__all__ = ["JOURNAL_SCHEMA_VERSION", "Durability", "SQLiteJournal"]

log = logging.getLogger("polyloop")

JOURNAL_SCHEMA_VERSION = "1.0"
"""Version of the table schema. A newer minor adds only what an older reader can ignore; a
file with another major version is refused (``JournalError``), never modified."""
_JOURNAL_MAJOR = 1
_STEP_MAJOR = 1

Durability = Literal["full", "normal"]

_T = TypeVar("_T")

# -- the schema -------------------------------------------------------------------------------

# Column order in ``runs`` is deliberate: the small, mutable columns come first and the bulky,
# immutable ones (goal, limits, metadata, history) last, so reading the lease never walks the
# overflow pages of a long history.
_RUNS_DDL = """CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT,
    lease_expires_at REAL,
    status TEXT NOT NULL CHECK (status IN ('running', 'ended')),
    stop_reason TEXT,
    steps_used INTEGER NOT NULL DEFAULT 0,
    actions_executed INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    ended_at REAL,
    journal_schema_version TEXT NOT NULL,
    wording_version TEXT NOT NULL,
    stop_detail TEXT,
    final_answer TEXT,
    goal TEXT NOT NULL,
    limits_json TEXT NOT NULL,
    metadata_json TEXT,
    history_json TEXT NOT NULL
)"""

# One column per StepRecord field, same names and order (kernel.md §7).
_STEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("step_idx", "INTEGER NOT NULL"),
    ("raw_response", "TEXT NOT NULL"),
    ("response_chars", "INTEGER NOT NULL"),
    ("reasoning_chars", "INTEGER NOT NULL"),
    ("action", "TEXT"),
    ("parse_ok", "INTEGER NOT NULL"),
    ("parse_error", "TEXT"),
    ("observation", "TEXT"),
    ("observation_synthetic", "INTEGER NOT NULL"),
    ("observation_truncated_chars", "INTEGER NOT NULL"),
    ("prompt_chars", "INTEGER NOT NULL"),
    ("llm_call_id", "TEXT"),
    ("step_wall_ms", "REAL NOT NULL"),
    ("tool_name", "TEXT"),
    ("tool_args_json", "TEXT"),
    ("action_status", "TEXT"),
    ("completed", "INTEGER NOT NULL"),
    ("schema_version", "TEXT NOT NULL"),
)
_STEP_NAMES = tuple(name for name, _ in _STEP_COLUMNS)
_STEP_BOOLS = frozenset({"parse_ok", "observation_synthetic", "completed"})
assert tuple(f.name for f in fields(StepRecord)) == _STEP_NAMES, (
    "the steps table must have one column per StepRecord field: update _STEP_COLUMNS"
)

_DDL: tuple[str, ...] = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)",
    _RUNS_DDL,
    "CREATE INDEX runs_by_status ON runs (status, lease_expires_at)",
    "CREATE TABLE steps (\n    run_id TEXT NOT NULL,\n"
    + "".join(f"    {name} {decl},\n" for name, decl in _STEP_COLUMNS)
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
    PRIMARY KEY (intent_id, attempt)
)""",
    "CREATE INDEX model_calls_by_run ON model_calls (run_id, step_idx)",
)
_TABLES = frozenset({"meta", "runs", "steps", "journal", "model_calls"})

_INSERT_RUN = """INSERT INTO runs (run_id, owner, lease_expires_at, status, created_at,
    journal_schema_version, wording_version, goal, limits_json, metadata_json, history_json)
    VALUES (?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (run_id) DO NOTHING"""
_INSERT_JOURNAL = "INSERT INTO journal (run_id, seq, kind, body, written_at) VALUES (?, ?, ?, ?, ?)"
_INSERT_STEP = (
    f"INSERT INTO steps (run_id, {', '.join(_STEP_NAMES)}) VALUES (?{', ?' * len(_STEP_NAMES)})"
)
_MARK_UNCERTAIN = """UPDATE model_calls SET state = 'uncertain'
    WHERE intent_id = ? AND attempt < ? AND state = 'pending'"""
_INSERT_INTENT = """INSERT INTO model_calls (run_id, step_idx, intent_id, attempt, state)
    VALUES (?, ?, ?, ?, 'pending')"""
_UPSERT_CALL = """INSERT INTO model_calls (run_id, step_idx, intent_id, attempt, llm_call_id,
        state, input_tokens, output_tokens, latency_ms, error)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (intent_id, attempt) DO UPDATE SET llm_call_id = excluded.llm_call_id,
        state = excluded.state, input_tokens = excluded.input_tokens,
        output_tokens = excluded.output_tokens, latency_ms = excluded.latency_ms,
        error = excluded.error"""
_END_PENDING = "UPDATE model_calls SET state = 'uncertain' WHERE run_id = ? AND state = 'pending'"
_RELEASE = "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE run_id = ? AND owner = ?"
_LEASE_OF = "SELECT owner, lease_expires_at FROM runs WHERE run_id = ?"
_READ_RUN = """SELECT goal, history_json, metadata_json, limits_json, wording_version,
    created_at, journal_schema_version FROM runs WHERE run_id = ?"""
_READ_RECORDS = "SELECT seq, kind, body FROM journal WHERE run_id = ? ORDER BY seq"
_READ_STEPS = f"SELECT {', '.join(_STEP_NAMES)} FROM steps WHERE run_id = ? ORDER BY step_idx"
_END_RUN = """UPDATE runs SET status = 'ended', stop_reason = ?, stop_detail = ?,
    final_answer = ?, steps_used = ?, actions_executed = ?, ended_at = ?, owner = NULL,
    lease_expires_at = NULL WHERE run_id = ?"""


# -- helpers ----------------------------------------------------------------------------------


def _major(version: object) -> int | None:
    if not isinstance(version, str):
        return None
    head = version.partition(".")[0]
    return int(head) if head.isdigit() else None


def _check_journal_version(version: object, where: str) -> None:
    if _major(version) != _JOURNAL_MAJOR:
        raise JournalError(
            f"{where} has journal schema version {version!r}; this PolyLoop reads journal "
            f"schema {JOURNAL_SCHEMA_VERSION} (major {_JOURNAL_MAJOR}): upgrade polyloop to "
            "read it (the file was not modified)"
        )


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-ready")


def _dumps(value: object, what: str, run_id: str, backend: str = "SQLite") -> str:
    """Canonical JSON of a run's history or metadata (mappings become objects); TypeError
    naming the run and the backend when ``value`` is not JSON-ready."""
    try:
        return json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            default=_json_default,
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"run {run_id!r}: the {what} must be JSON-ready to be journaled in {backend} ({exc})"
        ) from exc


def _damaged(run_id: str, seq: int, why: str) -> JournalError:
    return JournalError(
        f"run {run_id!r}: journal record {seq} {why}; the journal is damaged and was not modified"
    )


def _lease_lost(conn: sqlite3.Cursor, lease: Lease) -> PolyLoopError:
    row = conn.execute("SELECT owner FROM runs WHERE run_id = ?", (lease.run_id,)).fetchone()
    if row is None:
        return RunNotFound(lease.run_id)
    return LeaseLost(
        f"run {lease.run_id!r}: this execution ({lease.owner}) no longer holds the lease "
        f"(held by {row[0] or 'nobody'}); stop without writing"
    )


def _error_text(error: ErrorInfo) -> str:
    return f"{error.type}: {error.message} [kind={error.kind}, retryable={error.retryable}]"


_STEP_FIELDS = operator.attrgetter(*_STEP_NAMES)
_ROW_BOOLS = tuple(i for i, name in enumerate(_STEP_NAMES) if name in _STEP_BOOLS)
_ROW_STATUS = _STEP_NAMES.index("action_status")


def _step_row(step: StepRecord) -> list[Any]:
    """A ``steps`` row (without its run_id): the fields in column order, booleans as 0/1,
    ``action_status`` as its string (as ``StepRecord.to_dict()`` gives them)."""
    row = list(_STEP_FIELDS(step))
    for i in _ROW_BOOLS:
        row[i] = int(row[i])
    status = row[_ROW_STATUS]
    if status is not None:
        row[_ROW_STATUS] = status.value
    return row


def _step_from_row(row: Sequence[Any]) -> StepRecord:
    d = dict(zip(_STEP_NAMES, row, strict=True))
    for name in _STEP_BOOLS:
        d[name] = bool(d[name])
    return StepRecord.from_dict(d)


# -- the writer thread ------------------------------------------------------------------------


class _Seqs:
    """The next-``seq`` cache as one job sees it: its own changes over the batch's (not yet
    committed) over the committed cache. ``None`` drops an entry (reload from the table)."""

    def __init__(
        self, committed: dict[str, tuple[str, int]], batch: dict[str, tuple[str, int] | None]
    ) -> None:
        self._committed = committed
        self._batch = batch
        self.changes: dict[str, tuple[str, int] | None] = {}

    def get(self, run_id: str) -> tuple[str, int] | None:
        if run_id in self.changes:
            return self.changes[run_id]
        if run_id in self._batch:
            return self._batch[run_id]
        return self._committed.get(run_id)

    def set(self, run_id: str, value: tuple[str, int] | None) -> None:
        self.changes[run_id] = value


_Fn = Callable[[sqlite3.Cursor, _Seqs], Any]
"""A write, run by the writer thread on its one cursor inside the batch transaction."""


class _Job:
    """One write: its function, and its answer once its transaction ended (set on the event
    loop's thread). ``fut`` is what the writer awaits; if that wait is cancelled, ``waiter``
    (made on demand) tells when the answer arrived."""

    __slots__ = ("answered", "fn", "fut", "loop", "ok", "run_id", "value", "waiter")

    def __init__(
        self,
        fn: _Fn,
        run_id: str | None,
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[Any],
    ) -> None:
        self.fn = fn
        self.run_id = run_id
        self.loop = loop
        self.fut = fut
        self.answered = False
        self.ok = False
        self.value: Any = None
        self.waiter: asyncio.Future[None] | None = None


def _settle(answers: list[tuple[_Job, bool, Any]]) -> None:
    """Give a batch's jobs their answers (on their event loop's thread: one wake per batch)."""
    for job, ok, value in answers:
        job.answered, job.ok, job.value = True, ok, value
        fut = job.fut
        if not fut.done():
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        waiter = job.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _wrap_sqlite(exc: sqlite3.Error, path: str, what: str) -> JournalError:
    err = JournalError(f"SQLite journal {path}: {what} failed: {type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


class _Writer:
    """The thread that owns the write connection. Jobs are batched into one ``BEGIN
    IMMEDIATE`` transaction, each inside its own savepoint; futures are resolved only after
    ``COMMIT`` returned. Holds no reference to the :class:`SQLiteJournal` (so it can be
    garbage collected)."""

    def __init__(self, conn: sqlite3.Connection, path: str, *, group_commit: bool) -> None:
        self._conn = conn
        self._cur = conn.cursor()  # one cursor for every statement: cheaper than conn.execute
        self._path = path
        self._max_batch = 512 if group_commit else 1
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._seqs: dict[str, tuple[str, int]] = {}
        self._data_version: int | None = None
        self.commits = 0
        """Transactions committed (for tests and benchmarks: shows batching)."""
        self._thread = threading.Thread(
            target=self._main, name=f"polyloop-journal-writer:{path}", daemon=True
        )
        self._thread.start()

    def submit(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise JournalError(f"the SQLite journal {self._path} is closed")
            self._queue.put(job)

    def stop(self, timeout: float | None = None) -> None:
        """Finish every job submitted so far, then close the connection and end the thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _main(self) -> None:
        try:
            stopping = False
            while not stopping:
                job = self._queue.get()
                if job is None:
                    break
                jobs = [job]
                while len(jobs) < self._max_batch:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        stopping = True
                        break
                    jobs.append(nxt)
                try:
                    self._run_batch(jobs)
                except BaseException as exc:  # a bug here must not strand the waiters
                    log.exception("SQLite journal %s: the writer failed a batch", self._path)
                    if self._conn.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self._conn.execute("ROLLBACK")
                    self._seqs.clear()
                    self._abort(
                        jobs, functools.partial(RuntimeError, f"journal writer bug: {exc!r}")
                    )
        finally:
            closed = JournalError(f"the SQLite journal {self._path} is closed")
            while True:
                try:
                    left = self._queue.get_nowait()
                except queue.Empty:
                    break
                if left is not None:
                    self._resolve([(left, False, closed)])
            self._conn.close()

    def _begin(self, jobs: list[_Job]) -> bool:
        """``BEGIN IMMEDIATE``; False (every job failed) if it could not start. Drops the
        next-``seq`` cache when another connection committed since this one last looked
        (``PRAGMA data_version``): the cache is then no proof of who owns a run."""
        cur = self._cur
        try:
            cur.execute("BEGIN IMMEDIATE")
            version = cur.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    cur.execute("ROLLBACK")
            err = exc
            self._abort(jobs, lambda: _wrap_sqlite(err, self._path, "starting a write transaction"))
            return False
        if version != self._data_version:
            self._seqs.clear()
            self._data_version = version
        return True

    def _run_batch(self, jobs: list[_Job]) -> None:
        """Every job in one transaction. First without savepoints (the common case: nothing
        fails); if a job fails, roll back and run the batch again with a savepoint per job,
        so only the failing job fails. A batch of one job just fails."""
        if not self._begin(jobs):
            return
        conn = self._cur
        batch: dict[str, tuple[str, int] | None] = {}
        done: list[tuple[_Job, bool, Any]] = []
        for job in jobs:
            seqs = _Seqs(self._seqs, batch)
            try:
                value = job.fn(conn, seqs)
            except Exception as exc:
                self._rollback()
                if len(jobs) > 1:
                    self._run_batch_isolated(jobs)
                    return
                if job.run_id is not None:
                    self._seqs.pop(job.run_id, None)
                self._resolve([(job, False, self._job_error(job, exc))])
                return
            batch.update(seqs.changes)
            done.append((job, True, value))
        self._commit(jobs, batch, done)

    def _run_batch_isolated(self, jobs: list[_Job]) -> None:
        """The batch again, each job in its own savepoint: one job's failure (lease lost, a
        duplicate key) rolls back only that job."""
        if not self._begin(jobs):
            return
        conn = self._cur
        batch: dict[str, tuple[str, int] | None] = {}
        done: list[tuple[_Job, bool, Any]] = []
        try:
            for job in jobs:
                conn.execute("SAVEPOINT job")
                seqs = _Seqs(self._seqs, batch)
                try:
                    value = job.fn(conn, seqs)
                except Exception as exc:
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    if job.run_id is not None:
                        batch[job.run_id] = None  # reload the next seq before trusting it
                    done.append((job, False, self._job_error(job, exc)))
                else:
                    conn.execute("RELEASE job")
                    batch.update(seqs.changes)
                    done.append((job, True, value))
        except sqlite3.Error as exc:  # a savepoint statement failed: nothing lands
            self._rollback()
            err = exc
            self._abort(jobs, lambda: _wrap_sqlite(err, self._path, "a write transaction"))
            return
        self._commit(jobs, batch, done)

    def _commit(
        self,
        jobs: list[_Job],
        batch: dict[str, tuple[str, int] | None],
        done: list[tuple[_Job, bool, Any]],
    ) -> None:
        try:
            self._cur.execute("COMMIT")
        except sqlite3.Error as exc:  # the transaction as a whole failed: nothing landed
            self._rollback()
            for job in jobs:
                if job.run_id is not None:
                    self._seqs.pop(job.run_id, None)
            err = exc
            self._abort(jobs, lambda: _wrap_sqlite(err, self._path, "a write transaction"))
            return
        self.commits += 1
        for run_id, value in batch.items():
            if value is None:
                self._seqs.pop(run_id, None)
            else:
                self._seqs[run_id] = value
        self._resolve(done)

    def _rollback(self) -> None:
        if self._conn.in_transaction:
            try:
                self._cur.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("SQLite journal %s: rollback failed", self._path)

    def _job_error(self, job: _Job, exc: Exception) -> Exception:
        if isinstance(exc, sqlite3.Error):
            return _wrap_sqlite(exc, self._path, f"writing run {job.run_id!r}")
        return exc

    def _abort(self, jobs: list[_Job], error: Callable[[], Exception]) -> None:
        """Fail every job, each with its own exception instance."""
        self._resolve([(job, False, error()) for job in jobs])

    @staticmethod
    def _resolve(answers: list[tuple[_Job, bool, Any]]) -> None:
        """Hand the answers to their event loops: one wake-up per loop, not per job."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, bool, Any]]] = {}
        for answer in answers:
            by_loop.setdefault(answer[0].loop, []).append(answer)
        for loop, mine in by_loop.items():
            with contextlib.suppress(RuntimeError):  # a closed event loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, mine)


# -- read connections -------------------------------------------------------------------------


class _Readers:
    """A pool of read-only connections, each used by one worker thread at a time."""

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        self._path = path
        self._timeout = busy_timeout_s
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Call ``fn`` with an idle connection inside one read transaction (one snapshot)."""
        with self._lock:
            if self._closed:
                raise JournalError(f"the SQLite journal {self._path} is closed")
            conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = sqlite3.connect(
                    self._path,
                    timeout=self._timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.execute("PRAGMA query_only = ON")
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise _wrap_sqlite(exc, self._path, "reading") from exc
        finally:
            if conn is not None:
                with self._lock:
                    if self._closed:
                        conn.close()
                    else:
                        self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _shutdown(writer: _Writer, readers: _Readers) -> None:
    writer.stop(timeout=30.0)
    readers.close()


# -- opening a file ---------------------------------------------------------------------------


def _open_writer(path: str, durability: Durability, busy_timeout_s: float) -> sqlite3.Connection:
    """Connect, check the file is a PolyLoop journal of a readable version (creating the
    schema only in an empty database), then switch to WAL. Nothing is written to a file that
    is refused."""
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
            raise JournalError(
                f"{path} is not a SQLite database ({exc}); refusing to use it as a PolyLoop "
                "journal (it was not modified). Pass the path of a PolyLoop journal or of a "
                "new file."
            ) from exc
        if names:
            _check_polyloop(conn, path, names)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.warning(
                "SQLite journal %s: WAL mode is unavailable (journal_mode=%s); "
                "writers will block readers",
                path,
                mode,
            )
        conn.execute(f"PRAGMA synchronous = {'FULL' if durability == 'full' else 'NORMAL'}")
        if not names:
            _create_schema(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _schema_names(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


def _check_meta(meta: Mapping[str, Any], where: str) -> None:
    """Refuse a journal whose ``meta`` lacks the journal schema version or holds an unknown
    major version of either schema (the journal's or the step record's). Any backend."""
    version = meta.get("journal_schema_version")
    if version is None:
        raise JournalError(
            f"{where} has a 'meta' table without journal_schema_version: not a PolyLoop "
            "journal (it was not modified)"
        )
    _check_journal_version(version, f"the journal {where}")
    step_version = meta.get("step_schema_version", STEP_SCHEMA_VERSION)
    if _major(step_version) != _STEP_MAJOR:
        raise JournalError(
            f"the journal {where} has step record schema version {step_version!r}; this "
            f"PolyLoop reads step record schema {STEP_SCHEMA_VERSION} (major {_STEP_MAJOR}): "
            "upgrade polyloop to read it (it was not modified)"
        )


def _check_polyloop(conn: sqlite3.Connection, path: str, names: set[str]) -> None:
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
        raise JournalError(
            f"{path} has a 'meta' table that is not PolyLoop's ({exc}); refusing to touch it "
            "(it was not modified)"
        ) from None
    _check_meta(meta, str(path))
    missing = _TABLES - names
    if missing:
        raise JournalError(
            f"the PolyLoop journal {path} lacks the tables {sorted(missing)}: it is damaged "
            "(it was not modified)"
        )
    for table, columns in _table_columns().items():
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        lacking = [c for c in columns if c not in have]
        if lacking:
            raise JournalError(
                f"the PolyLoop journal {path}: table {table} lacks the columns {lacking}: it is "
                "damaged (it was not modified)"
            )


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


# -- preparing writes (on the caller's thread) ------------------------------------------------


@dataclass(slots=True)
class _Append:
    """One ``append``, serialized: every row it writes, ready for the writer."""

    lease: Lease
    rows: list[tuple[str, str]] = field(default_factory=list)
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    end: RunEnd | None = None


def _prepare(lease: Lease, records: Sequence[Record]) -> _Append:
    run_id = lease.run_id
    p = _Append(lease)
    for r in records:
        p.rows.append((r.kind, record_json(r)))
        match r:
            case ModelIntent():
                p.calls.append(("intent", (run_id, r.step_idx, r.intent_id, r.attempt)))
            case ModelResult():
                usage = r.reply.usage
                p.calls.append(
                    (
                        "upsert",
                        (
                            run_id,
                            r.step_idx,
                            r.intent_id,
                            r.attempt,
                            r.llm_call_id,
                            "ok",
                            None if usage is None else usage.input_tokens,
                            None if usage is None else usage.output_tokens,
                            r.latency_ms,
                            None,
                        ),
                    )
                )
            case ModelAttemptFailed() | ModelFailure():
                state = "retried" if isinstance(r, ModelAttemptFailed) else "failed"
                p.calls.append(
                    (
                        "upsert",
                        (
                            run_id,
                            r.step_idx,
                            r.intent_id,
                            r.attempt,
                            None,
                            state,
                            None,
                            None,
                            r.latency_ms,
                            _error_text(r.error),
                        ),
                    )
                )
            case StepWritten(step):
                p.steps.append((run_id, *_step_row(step)))
            case RunEnd():
                p.end = r
            case _:
                pass
    return p


def _append_fn(p: _Append, clock: Callable[[], float]) -> _Fn:
    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> None:
        run_id, owner = p.lease.run_id, p.lease.owner
        cached = seqs.get(run_id)
        if cached is not None and cached[0] == owner:
            # The fence, from memory: this connection's last committed write of the run left
            # it owned by this execution, no write of this connection changed the owner since
            # (those update the cache), and no other connection committed anything since
            # (``PRAGMA data_version``, checked under the write lock this transaction holds).
            nxt = cached[1]
        else:
            # The fence: it matches only while this execution holds the lease. It changes no
            # byte of the row (owner = owner), so it writes nothing and never copies the history.
            cur = conn.execute(
                "UPDATE runs SET owner = owner WHERE run_id = ? AND owner = ?", (run_id, owner)
            )
            if cur.rowcount != 1:
                raise _lease_lost(conn, p.lease)
            nxt = conn.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM journal WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
        now = clock()
        conn.executemany(
            _INSERT_JOURNAL,
            [(run_id, nxt + i, kind, body, now) for i, (kind, body) in enumerate(p.rows)],
        )
        if p.steps:
            conn.executemany(_INSERT_STEP, p.steps)
        for op, args in p.calls:
            if op == "intent":
                if args[3] > 1:  # earlier attempts of this intent still pending: lost
                    conn.execute(_MARK_UNCERTAIN, (args[2], args[3]))
                conn.execute(_INSERT_INTENT, args)
            else:
                conn.execute(_UPSERT_CALL, args)
        end = p.end
        if end is None:
            seqs.set(run_id, (owner, nxt + len(p.rows)))
            return
        conn.execute(_END_PENDING, (run_id,))
        conn.execute(
            _END_RUN,
            (
                end.stop_reason.value,
                end.stop_detail,
                end.final_answer,
                end.steps_used,
                end.actions_executed,
                end.ended_at,
                run_id,
            ),
        )
        seqs.set(run_id, None)  # the lease is released with the end record

    return run


# -- the journal ------------------------------------------------------------------------------


class SQLiteJournal:
    """The Journal seam in one SQLite file (durability.md "Storage"): WAL mode, group commit
    through one writer thread, leases and fenced writes; several journal objects or processes
    may share one file.

    Args:
        path: the database file. A new or empty database gets the PolyLoop schema; an existing
            PolyLoop journal of a readable version is opened; anything else (another
            application's database, a file that is not SQLite, an unknown major version of
            the journal schema) raises ``JournalError`` and the file is not modified.
        durability: ``"full"`` (default): ``synchronous=FULL``, every commit is fsynced before
            ``append`` returns, so a record whose ``append`` returned survives a power loss.
            ``"normal"``: ``synchronous=NORMAL``, faster; in WAL mode a power loss or OS crash
            can lose the last commits (never corrupt the file), while a process crash still
            loses nothing. Choose it only if re-doing the last steps after a power cut is
            acceptable (actions whose intent is lost may then run again).
        busy_timeout_s: how long a write waits for another writer of the file (another journal
            object or process) before failing with ``JournalError``.
        group_commit: concurrent appends of many runs share one transaction and one fsync
            (each append still succeeds or fails alone, and returns only after the commit that
            holds it). ``False`` commits every write alone (for benchmarks).
        clock: epoch seconds for lease expiry and ``written_at`` (injectable for tests).

    Opening reads the file synchronously (construct it before the hot path); after that no
    method blocks the event loop: writes go to the writer thread, reads to worker threads.
    Close it with :meth:`close`, ``await`` :meth:`aclose`, or ``async with``; an unclosed
    journal is closed when garbage collected or at interpreter exit.

    Raises:
        ConfigError: a bad ``durability``, ``busy_timeout_s`` or an in-memory path.
        JournalError: the file cannot be opened as a PolyLoop journal (see ``path``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        busy_timeout_s: float = 30.0,
        group_commit: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if durability not in ("full", "normal"):
            raise ConfigError(f"durability must be 'full' or 'normal', got {durability!r}")
        if busy_timeout_s < 0:
            raise ConfigError(f"busy_timeout_s must be >= 0, got {busy_timeout_s}")
        spath = os.fspath(path)
        if spath in ("", ":memory:") or spath.startswith("file::memory:"):
            raise ConfigError(
                "SQLiteJournal needs a file path (an in-memory SQLite database is not shared "
                "between connections); use polyloop.journal.MemoryJournal for throwaway runs"
            )
        self.path = spath
        self.durability: Durability = durability
        self._clock = clock
        conn = _open_writer(spath, durability, busy_timeout_s)
        self._writer = _Writer(conn, spath, group_commit=group_commit)
        self._readers = _Readers(spath, busy_timeout_s)
        self._finalizer = weakref.finalize(self, _shutdown, self._writer, self._readers)

    def __repr__(self) -> str:
        return f"SQLiteJournal({self.path!r}, durability={self.durability!r})"

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Finish the writes already submitted, stop the writer thread, close the connections.
        Idempotent. Later calls raise ``JournalError``. Blocks until the last commit returned
        (use :meth:`aclose` inside an event loop)."""
        self._finalizer()

    async def aclose(self) -> None:
        """:meth:`close` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the seam -----------------------------------------------------------------------------
    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease:
        run_id = spec.run_id
        history = _dumps(list(spec.history), "history", run_id)
        metadata = (
            None if spec.metadata is None else _dumps(dict(spec.metadata), "metadata", run_id)
        )
        limits = canonical_json(spec.limits.to_dict())
        owner = new_owner()
        clock = self._clock

        def run(conn: sqlite3.Cursor, seqs: _Seqs) -> Lease:
            expires = clock() + ttl_s
            cur = conn.execute(
                _INSERT_RUN,
                (
                    run_id,
                    owner,
                    expires,
                    spec.created_at,
                    JOURNAL_SCHEMA_VERSION,
                    spec.wording_version,
                    spec.goal,
                    limits,
                    metadata,
                    history,
                ),
            )
            if cur.rowcount != 1:
                raise RunExists(run_id)
            seqs.set(run_id, (owner, 1))
            return Lease(run_id, owner, expires)

        lease: Lease = await self._write(run, run_id, give_back=True)
        return lease

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]:
        return await asyncio.to_thread(self._readers.run, lambda c: _read_run(c, run_id))

    async def acquire(
        self, run_id: str, *, ttl_s: float
    ) -> tuple[Lease, RunSpec, Sequence[Record]]:
        owner = new_owner()
        clock = self._clock

        def run(conn: sqlite3.Cursor, seqs: _Seqs) -> Lease:
            row = conn.execute(_LEASE_OF, (run_id,)).fetchone()
            if row is None:
                raise RunNotFound(run_id)
            old_owner, old_expiry = row
            now = clock()
            if old_owner is not None and (old_expiry or 0.0) > now and not owner_is_dead(old_owner):
                raise RunLeased(run_id, old_owner, old_expiry)
            expires = now + ttl_s
            cur = conn.execute(
                "UPDATE runs SET owner = ?, lease_expires_at = ? "
                "WHERE run_id = ? AND owner IS ? AND lease_expires_at IS ?",
                (owner, expires, run_id, old_owner, old_expiry),
            )
            if cur.rowcount != 1:  # cannot happen under the write lock; lose cleanly if it does
                now_owner = conn.execute(_LEASE_OF, (run_id,)).fetchone()
                raise RunLeased(run_id, str(now_owner[0]), float(now_owner[1] or 0.0))
            nxt = conn.execute(
                "SELECT coalesce(max(seq), 0) + 1 FROM journal WHERE run_id = ?", (run_id,)
            ).fetchone()[0]
            seqs.set(run_id, (owner, nxt))
            return Lease(run_id, owner, expires)

        lease: Lease = await self._write(run, run_id, give_back=True)
        try:
            spec, records = await self.read(run_id)  # nobody else can write it now
        except BaseException:
            await self._give_back(lease)
            raise
        return lease, spec, records

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        await self._write(_append_fn(_prepare(lease, records), self._clock), lease.run_id)

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        clock = self._clock

        def run(conn: sqlite3.Cursor, seqs: _Seqs) -> Lease:
            expires = clock() + ttl_s
            cur = conn.execute(
                "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND owner = ?",
                (expires, lease.run_id, lease.owner),
            )
            if cur.rowcount != 1:
                raise _lease_lost(conn, lease)
            return Lease(lease.run_id, lease.owner, expires)

        renewed: Lease = await self._write(run, lease.run_id)
        return renewed

    async def release(self, lease: Lease) -> None:
        await self._write(_release_fn(lease), lease.run_id)

    # -- read-only helpers (never write; for the CLI and tests) -------------------------------
    async def list_runs(
        self, *, status: str | None = None, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every run (or those with ``status`` 'running'/'ended'; or only ``run_id``: a list
        of one or none, read by its key), oldest first, as dicts of the ``runs`` columns
        except ``history_json``, with ``metadata`` and ``limits`` decoded. For a running
        run, ``steps_used``/``actions_executed`` are counted from ``steps``. Read-only."""
        return await asyncio.to_thread(self._readers.run, lambda c: _list_runs(c, status, run_id))

    async def steps(self, run_id: str) -> list[StepRecord]:
        """A run's step records from the ``steps`` table, by ``step_idx``. Read-only.
        Raises ``RunNotFound``."""
        return await asyncio.to_thread(self._readers.run, lambda c: _read_steps(c, run_id))

    @property
    def commits(self) -> int:
        """Write transactions committed by this object so far (group commit shares one
        between many appends)."""
        return self._writer.commits

    # -- writing ------------------------------------------------------------------------------
    async def _write(self, fn: _Fn, run_id: str, *, give_back: bool = False) -> Any:
        """Run ``fn`` in the writer thread and wait for its commit. If cancelled while waiting,
        the write still completes before ``CancelledError`` propagates (its own error, if it
        failed, propagates instead). ``give_back``: a lease the cancelled write took is
        released, since the caller never gets it."""
        loop = asyncio.get_running_loop()
        job = _Job(fn, run_id, loop, loop.create_future())
        self._writer.submit(job)
        try:
            return await job.fut
        except asyncio.CancelledError:
            await _wait_answer(job)
            if not job.ok:
                raise job.value from job.value.__cause__
            if give_back and isinstance(job.value, Lease):
                await self._give_back(job.value)
            raise

    async def _give_back(self, lease: Lease) -> None:
        loop = asyncio.get_running_loop()
        job = _Job(_release_fn(lease), lease.run_id, loop, loop.create_future())
        try:
            self._writer.submit(job)
        except JournalError:
            return
        await _wait_answer(job)
        if not job.ok:
            log.warning("run %s: could not release its lease", lease.run_id, exc_info=job.value)


async def _wait_uninterrupted(fut: asyncio.Future[Any]) -> None:
    """Wait for ``fut`` even through repeated cancellation (the caller re-raises after)."""
    while not fut.done():
        try:
            await asyncio.wait({fut})
        except asyncio.CancelledError:
            continue


async def _wait_answer(job: _Job) -> None:
    """Wait for ``job``'s answer even through repeated cancellation (the caller re-raises
    after)."""
    fut = job.fut
    if not fut.done():
        fut.cancel()  # the answer goes to job.value alone
    elif not fut.cancelled():
        fut.exception()  # retrieved here: the caller reads job.value
    while not job.answered:
        if job.waiter is None:
            job.waiter = job.loop.create_future()
        try:
            await asyncio.wait({job.waiter})
        except asyncio.CancelledError:
            continue


def _release_fn(lease: Lease) -> _Fn:
    def run(conn: sqlite3.Cursor, seqs: _Seqs) -> None:
        conn.execute(_RELEASE, (lease.run_id, lease.owner))
        seqs.set(lease.run_id, None)

    return run


# -- reading (in worker threads) --------------------------------------------------------------


def _read_run(conn: sqlite3.Connection, run_id: str) -> tuple[RunSpec, tuple[Record, ...]]:
    row = conn.execute(
        _READ_RUN,
        (run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    rows = conn.execute(_READ_RECORDS, (run_id,)).fetchall()
    return _parse_run(run_id, row, rows)


def _parse_run(
    run_id: str, row: Sequence[Any], rows: Sequence[Sequence[Any]]
) -> tuple[RunSpec, tuple[Record, ...]]:
    """A run's spec and records from its ``runs`` row and ``journal`` rows (any backend).

    Raises:
        JournalError: a field, a record or the ``seq`` numbering is damaged.
    """
    goal, history_json, metadata_json, limits_json, wording, created_at, version = row
    _check_journal_version(version, f"run {run_id!r}")
    try:
        history = json.loads(history_json)
        metadata = None if metadata_json is None else json.loads(metadata_json)
        limits = Limits.from_dict(json.loads(limits_json))
        if not isinstance(history, list) or not (metadata is None or isinstance(metadata, dict)):
            raise TypeError("history must be a list and metadata an object")
    except (TypeError, ValueError) as exc:
        raise JournalError(
            f"run {run_id!r}: its runs row is damaged ({type(exc).__name__}: {exc}); "
            "the journal was not modified"
        ) from exc
    spec = RunSpec(run_id, goal, limits, created_at, tuple(history), metadata, wording)
    records: list[Record] = []
    for expected, (seq, kind, body) in enumerate(rows, start=1):
        if seq != expected:
            raise _damaged(
                run_id, expected, f"is out of order or missing (seq {seq} stands in its place)"
            )
        try:
            data = json.loads(body)
        except (TypeError, ValueError) as exc:
            raise _damaged(run_id, seq, f"is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("kind") != kind:
            raise _damaged(run_id, seq, f"does not match its kind {kind!r}")
        try:
            records.append(record_from_dict(data))
        except JournalError as exc:
            raise _damaged(run_id, seq, f"cannot be read ({exc})") from exc
    return spec, tuple(records)


def _list_runs(
    conn: sqlite3.Connection, status: str | None, run_id: str | None
) -> list[dict[str, Any]]:
    cur = conn.execute(
        """SELECT run_id, status, stop_reason, stop_detail, final_answer,
            CASE WHEN status = 'ended' THEN steps_used
                 ELSE (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) END
                AS steps_used,
            CASE WHEN status = 'ended' THEN actions_executed
                 ELSE (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id
                       AND s.action_status = 'executed') END AS actions_executed,
            created_at, ended_at, owner, lease_expires_at, wording_version,
            journal_schema_version, goal, limits_json, metadata_json
        FROM runs r WHERE (? IS NULL OR status = ?) AND (? IS NULL OR run_id = ?)
        ORDER BY created_at, run_id""",
        (status, status, run_id, run_id),
    )
    names = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        d = dict(zip(names, row, strict=True))
        d["limits"] = json.loads(d.pop("limits_json"))
        meta = d.pop("metadata_json")
        d["metadata"] = None if meta is None else json.loads(meta)
        out.append(d)
    return out


def _read_steps(conn: sqlite3.Connection, run_id: str) -> list[StepRecord]:
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        raise RunNotFound(run_id)
    rows = conn.execute(
        _READ_STEPS,
        (run_id,),
    ).fetchall()
    try:
        return [_step_from_row(row) for row in rows]
    except TypeError as exc:
        raise JournalError(f"run {run_id!r}: a steps row is damaged ({exc})") from exc


if TYPE_CHECKING:

    def _conforms(journal: SQLiteJournal) -> Journal:
        return journal
