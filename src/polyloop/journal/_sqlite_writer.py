"""The SQLite journal's threads and connections: the writer thread that batches writes into
one transaction (group commit) and answers their callers after ``COMMIT``, the pool of read
connections used by worker threads, and waiting for a write's answer on the event loop."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ..types import JournalError
from ._sqlite_damage import _Health, _is_damage

log = logging.getLogger("polyloop")

_T = TypeVar("_T")


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
    (made on demand) tells when the answer arrived. ``payload``: an append for the writer
    process (``SQLiteJournal(writer="process")``), which then runs instead of ``fn``."""

    __slots__ = ("answered", "fn", "fut", "loop", "ok", "payload", "run_id", "value", "waiter")

    def __init__(
        self,
        fn: _Fn | None,
        run_id: str | None,
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[Any],
        payload: tuple[Any, ...] | None = None,
    ) -> None:
        self.fn = fn
        self.payload = payload
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
    garbage collected).

    Once ``health`` says the file is damaged (found by this writer or by a reader), every job
    fails with the damage error: those queued, those of the batch that met it (rolled back,
    never retried), and every later ``submit``."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        *,
        group_commit: bool,
        health: _Health,
        start: bool = True,
    ) -> None:
        self._health = health
        self._conn = conn
        self._cur = conn.cursor()  # one cursor for every statement: cheaper than conn.execute
        self._path = path
        self._max_batch = 512 if group_commit else 1
        self._jobs: collections.deque[_Job] = collections.deque()
        self._wake: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._seqs: dict[str, tuple[str, int]] = {}
        self._data_version: int | None = None
        self.commits = 0
        """Transactions committed (for tests and benchmarks: shows batching)."""
        self._thread = threading.Thread(
            target=self._main, name=f"polyloop-journal-writer:{path}", daemon=True
        )
        if start:  # not started: the writer process runs batches with it (_sqlite_process)
            self._thread.start()

    def submit(self, job: _Job, *, wake: bool = True) -> None:
        """Queue ``job``; ``wake=False`` leaves waking the writer to a later :meth:`wake`
        (one wake-up for several jobs). Raises ``JournalError`` once stopped."""
        with self._lock:
            if self._closed:
                raise JournalError(f"the SQLite journal {self._path} is closed")
            if self._health.cause is not None:
                raise self._damaged()
            self._jobs.append(job)
        if wake:
            self._wake.put(True)

    def wake(self) -> None:
        """Have the writer run the jobs queued so far (if it is not already running)."""
        self._wake.put(True)

    def stop(self, timeout: float | None = None) -> None:
        """Finish every job submitted so far, then close the connection and end the thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._wake.put(False)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _main(self) -> None:
        jobs = self._jobs
        try:
            stopping = False
            while True:
                if not jobs:
                    if stopping:
                        break
                    stopping = not self._wake.get()  # False: stop once the queue is empty
                    continue
                batch = [jobs.popleft() for _ in range(min(len(jobs), self._max_batch))]
                self._run_guarded(batch)
        finally:
            with self._lock:  # no job is queued after this: submit raises instead
                self._closed = True
            closed = JournalError(f"the SQLite journal {self._path} is closed")
            self._resolve([(job, False, closed) for job in jobs])
            jobs.clear()
            self._conn.close()

    def _run_guarded(self, jobs: list[_Job]) -> None:
        """:meth:`_run_batch`; a bug in it fails the batch's jobs instead of stranding them.
        On a damaged file every job fails with the damage error, nothing is begun."""
        if self._health.cause is not None:
            self._abort(jobs, self._damaged)
            return
        try:
            self._run_batch(jobs)
        except BaseException as exc:
            log.exception("SQLite journal %s: the writer failed a batch", self._path)
            if self._conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            self._seqs.clear()
            self._abort(jobs, functools.partial(RuntimeError, f"journal writer bug: {exc!r}"))

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
            if self._health.note(exc) is not None:
                self._abort(jobs, self._damaged)
            else:
                self._abort(
                    jobs, lambda: _wrap_sqlite(err, self._path, "starting a write transaction")
                )
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
                value = job.fn(conn, seqs)  # type: ignore[misc]  # None only for the process
            except Exception as exc:
                self._rollback()
                if self._health.note(exc) is not None:  # never retried into a damaged file
                    self._seqs.clear()
                    self._abort(jobs, self._damaged)
                    return
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
                    value = job.fn(conn, seqs)  # type: ignore[misc]
                except Exception as exc:
                    if _is_damage(exc):
                        raise  # the whole batch fails with it, below
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
            self._fail_transaction(jobs, exc)
            return
        self._commit(jobs, batch, done)

    def _commit(
        self,
        jobs: list[_Job],
        batch: dict[str, tuple[str, int] | None],
        done: list[tuple[_Job, bool, Any]],
    ) -> None:
        if self._health.cause is not None:  # a reader found the damage meanwhile
            self._rollback()
            self._abort(jobs, self._damaged)
            return
        try:
            self._cur.execute("COMMIT")
        except sqlite3.Error as exc:  # the transaction as a whole failed: nothing landed
            self._rollback()
            for job in jobs:
                if job.run_id is not None:
                    self._seqs.pop(job.run_id, None)
            self._fail_transaction(jobs, exc)
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

    def _fail_transaction(self, jobs: list[_Job], exc: sqlite3.Error) -> None:
        """Fail every job of a transaction that failed as a whole (it was rolled back)."""
        if self._health.note(exc) is not None:
            self._seqs.clear()
            self._abort(jobs, self._damaged)
            return
        self._abort(jobs, lambda: _wrap_sqlite(exc, self._path, "a write transaction"))

    def _damaged(self) -> Exception:
        return self._health.error()

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


class _ReadOnlyWriter:
    """The writer of a read-only journal: it refuses every write (and starts no thread)."""

    commits = 0

    def __init__(self, path: str, health: _Health) -> None:
        self._path = path
        self._health = health

    def submit(self, job: _Job, *, wake: bool = True) -> None:
        if self._health.cause is not None:
            raise self._health.error()
        raise JournalError(
            f"the SQLite journal {self._path} was opened read-only (read_only=True): it is "
            f"never written to; open it without read_only to write run {job.run_id!r}"
        )

    def wake(self) -> None:
        pass

    def stop(self, timeout: float | None = None) -> None:
        pass


# -- read connections -------------------------------------------------------------------------


class _Readers:
    """A pool of read-only connections, each used by one worker thread at a time.

    ``connect`` opens one more (default: the file itself, as ``path``); ``idle``: connections
    already open. A read that SQLite finds damaged marks ``health`` damaged, and from then on
    every read raises the damage error."""

    def __init__(
        self,
        path: str,
        busy_timeout_s: float,
        health: _Health,
        *,
        connect: Callable[[], sqlite3.Connection] | None = None,
        idle: list[sqlite3.Connection] | None = None,
    ) -> None:
        self._path = path
        self._timeout = busy_timeout_s
        self._health = health
        self._connect = connect if connect is not None else self._connect_file
        self._idle: list[sqlite3.Connection] = idle if idle is not None else []
        self._lock = threading.Lock()
        self._closed = False

    def _connect_file(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self._path,
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
        )

    def run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Call ``fn`` with an idle connection inside one read transaction (one snapshot)."""
        with self._lock:
            if self._closed:
                raise JournalError(f"the SQLite journal {self._path} is closed")
            conn = self._idle.pop() if self._idle else None
        try:
            if self._health.cause is not None:
                raise self._health.error()
            if conn is None:
                conn = self._connect()
                conn.execute("PRAGMA query_only = ON")
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            damaged = self._health.note(exc)
            if damaged is not None:
                raise damaged from exc
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


def _shutdown(writer: _Writer | _ReadOnlyWriter, readers: _Readers) -> None:
    writer.stop(timeout=30.0)
    readers.close()


# -- waiting for an answer (on the event loop) ------------------------------------------------


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
