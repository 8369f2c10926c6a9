"""The embedded durable journal: one SQLite file, standard library ``sqlite3`` only.

Tables (their names and columns are public: downstream SQL reads them directly)::

    runs         one row per run: run_id, owner, lease_expires_at, status ('running'|'ended'|
                 'awaiting_approval': journal schema 1.4, a run parked until a person decides
                 on an action; see SQLiteJournal.decide),
                 stop_reason (NULL until ended), steps_used, actions_executed, tokens_used,
                 cost_usd, active_seconds, usage_missing (journal schema 1.3: the run's totals,
                 ``RunTotals``, set with the end record; NULL before it), created_at,
                 ended_at, journal_schema_version, wording_version, stop_detail, final_answer,
                 request, request_reason, requested_by, requested_at (journal schema 1.3: a
                 request to end the run, see below; NULL when none was made), goal,
                 limits_json, metadata_json, history_json
    steps        one row per step record: run_id plus a column per StepRecord field, same
                 names (booleans as 0/1); PRIMARY KEY (run_id, step_idx). replaced_chars
                 arrived with journal schema 1.1, model with 1.2, wrap_up (1 for the wrap-up
                 step of ``Loop(wrap_up=True)``) with 1.3, outcome_unknown (``replayed`` or
                 ``reconciled`` on the step of an action whose live execution raised
                 ``OutcomeUnknown``) with 1.4 (a writer adds them to an older file)
    journal      the append-only records: run_id, seq (1, 2, ... per run), kind, body (the
                 canonical JSON of ``record_to_dict``; since journal schema 2.0 a ``step``
                 whose observation is over 4,096 characters leaves it to the ``action_result``
                 before it: :mod:`polyloop.journal._observations`), written_at; PRIMARY KEY
                 (run_id, seq)
    model_calls  the accounts, one row per model-call attempt: run_id, step_idx, intent_id,
                 attempt, llm_call_id, state, input_tokens, output_tokens, latency_ms, error,
                 and (journal schema 1.2) model (the ``name`` of the model the attempt asked,
                 written with its intent), response_model (the provider's name for the model
                 that answered), cached_tokens (of input_tokens, read from the provider's
                 cache), reasoning_tokens (of output_tokens), and (1.3) cost_usd (the
                 attempt's price by the adapter's ``Pricing``, or the provider's reported
                 cost; NULL when neither is known), and (2.1) logprobs (the reply's
                 log-probabilities as one JSON array, NULL when none were recorded: their
                 only copy, see :func:`polyloop.journal._rows.logprobs_text`); PRIMARY KEY
                 (intent_id, attempt)
    meta         key/value: journal_schema_version, step_schema_version

``model_calls.state`` is ``pending`` (intent written, no answer yet), ``ok``, ``retried`` (failed,
retried), ``failed`` (the step's final failure) or ``uncertain``: the attempt's answer was lost
(a crash between intent and result, found when the next attempt of the same intent arrives, or
a run that ended while the call was in flight). The provider may have served and billed it.

``runs.steps_used`` and ``runs.actions_executed`` are current after every step, also while the
run is in progress or detached: a step's append moves them in its own transaction, and the end
record's transaction sets them to the end record's counters. ``runs.status`` stays ``running``
until the end record; whether such a run is advancing, detached or stale is told by its lease
(``owner``, ``lease_expires_at``): :meth:`SQLiteJournal.list_runs` derives it as ``state``
(:mod:`polyloop.journal._state` gives the SQL).

Writes. One writer thread owns the write connection. A write is queued at once; the thread is
woken once per turn of the event loop that wrote, at the end of that turn (not once per write).
The writes queued meanwhile (``append``, ``create``, lease changes) share one ``BEGIN
IMMEDIATE`` transaction (group commit: one fsync for many runs), run first without savepoints;
if one of them fails (lease lost, a duplicate key), the transaction is rolled back and the batch
runs again with a SAVEPOINT per write, so the conflict fails only that call. The callers are
answered only after ``COMMIT`` returned, with one wake-up of their event loop per batch, so a
run proceeds only once its record is durable. Every ``append`` is fenced in its transaction: by
``UPDATE runs SET owner = owner WHERE run_id = ? AND owner = ?`` (a step's append: by the update
of the counters, ``... WHERE run_id = ? AND owner = ?`` alike) (0 rows: the lease is no longer
ours, ``LeaseLost``, nothing written), or from memory when that proves the same: this
connection's last committed write of the run left it owned by this execution, and no other
connection has committed since (``PRAGMA data_version``, read under the write lock). Every write
of this connection that changes an owner updates that memory.

``SQLiteJournal(path, writer="process")`` moves the appends' SQL (the same statements, batched
and fenced the same way) into a child process with its own connection, so at hundreds of
concurrent runs it runs on another core; the other writes stay with the writer thread, which
hands each batch of appends to the child and answers their callers after its ``COMMIT``
(:mod:`polyloop.journal._sqlite_process`).

Requests to end a run (``Loop.stop`` / ``Loop.cancel``, ``polyloop stop`` / ``cancel``, from any
process) are columns of the ``runs`` row: ``request`` ('stop'|'cancel'), ``request_reason``,
``requested_by``, ``requested_at`` (epoch seconds). :meth:`SQLiteJournal.request_end` writes one,
unfenced (the requester holds no lease), in a transaction that reads the lease under the write
lock: with a live owner the row is all it writes (the owner reads it back with its next
``renew``, which returns it in ``Lease.request``: no query of its own); with none it also writes
the end record, fenced as any append, so the run ends exactly once. The columns stay after the
run ended, naming the request that ended it (or that came too late)::

    SELECT run_id, request, request_reason, requested_by FROM runs
    WHERE status = 'running' AND request IS NOT NULL      -- requests not yet honoured

Reads run in worker threads on their own connections (WAL: readers never wait for the writer),
so the event loop never waits on SQLite.

Bytes per step. A step's appends insert its ``journal`` rows, its ``steps`` row and its
``model_calls`` rows, and move the two counters of its ``runs`` row: SQLite overwrites a row of
unchanged size in place, writing only the page that changed (the first one: the small columns
come first), so the ``runs`` row costs one page per commit. SQLite rewrites a whole row whose
size changes, ``history_json`` included: when the lease changes hands (create, acquire,
release), when the run ends, and when a counter's integer needs one byte more (its value
reaches 2, 128 or 32768), so at most three times per counter in a run's life, never at other
steps. Renewing a lease rewrites one page.

The modules: ``_sqlite_schema`` (the tables, opening a file), ``_sqlite_writes`` (each write
transaction; the statements both journals speak are in :mod:`polyloop.journal._sql`),
``_sqlite_writer`` / ``_sqlite_process`` (the writer thread and process), ``_sqlite_read``
(reads), ``_sqlite_check`` (``check_integrity``); this module is the seam.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self

from ..types import (
    ApprovalDecided,
    ConfigError,
    EndRequest,
    JournalError,
    Lease,
    LimitsRequest,
    Record,
    RequestResult,
    RunEnd,
    RunExists,
    RunSpec,
    StepRecord,
    check_number,
)
from . import _approvals
from . import _sql as sql
from ._limit_rows import request_dict
from ._owner import new_owner
from ._reading import check_page
from ._rows import _prepare, spec_json
from ._sqlite_check import IntegrityReport, check_integrity, quick_check
from ._sqlite_damage import _Health
from ._sqlite_process import _ProcessWriter
from ._sqlite_read import _list_runs, _read_only_pool, _read_run, _read_steps, _step_usage
from ._sqlite_schema import (
    _INSERT_RUN,
    Durability,
    _open_writer,
)
from ._sqlite_writer import (
    _Fn,
    _Job,
    _Readers,
    _ReadOnlyWriter,
    _Seqs,
    _shutdown,
    _wait_answer,
    _Writer,
)
from ._sqlite_writes import (
    _acquire_fn,
    _append_fn,
    _decide_fn,
    _payload,
    _release_fn,
    _renew_fn,
    _request_end_fn,
    _request_limits_fn,
    _settle_fn,
)
from ._versions import JOURNAL_SCHEMA_VERSION

if TYPE_CHECKING:
    from ..seams import Journal

__all__ = [
    "JOURNAL_SCHEMA_VERSION",
    "Durability",
    "IntegrityReport",
    "SQLiteJournal",
    "check_integrity",
    "quick_check",
]

log = logging.getLogger("polyloop")


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
        read_only: open the journal only to read it (``list_runs``, ``steps``, ``read``): no
            writer thread, a ``mode=ro`` connection, the journal never created or written (a
            missing file raises ``JournalError``; in a writable folder SQLite itself leaves
            the empty ``-wal`` and ``-shm`` files every reader of a WAL-mode file makes, which
            the next writer removes when it closes), and every write (``create``, ``acquire``,
            ``append``, ``renew``, ``release``) raises ``JournalError``. It needs no write
            access to the file, and none to its folder while a writer holds the file open (or
            its ``-shm`` file exists). In a read-only folder where SQLite cannot create the
            ``-shm`` file, the file is opened ``immutable=1`` (:attr:`immutable` is then True):
            SQLite assumes nobody changes it, so commits a writer makes later are not seen
            (and a ``-wal`` file still holding commits is refused: immutable would not read
            them).
        writer: who runs the appends' SQL. ``"thread"`` (default): the writer thread, in this
            process. ``"process"``: a child process on its own connection (the other writes,
            ``create`` and the lease changes, stay with the thread), so at hundreds of
            concurrent runs that SQL takes another core instead of this process's interpreter
            lock: in the bench, 1,000 runs × 20 steps against a 50 ms model take 5.6–5.8×
            ideal instead of 7.7–7.8× (at 200 runs the gain is within the spread; see
            bench/results/writer_process.md). Starting it costs about 0.2 s
            (waited for at the first append), and ``written_at`` is then the time the append
            was made, not the time of its commit. A child that dies fails the appends it held
            and every later one with ``JournalError`` (their outcome unknown, as after a
            crash); see :mod:`polyloop.journal._sqlite_process`. POSIX only (``ConfigError``
            elsewhere). Ignored with ``read_only``.

    A writable journal needs write access to the file and to its folder (SQLite creates the
    ``-wal`` and ``-shm`` files next to it); without them it is refused at open with
    ``JournalError`` saying which is not writable.

    Damage. When SQLite reports the file damaged (``SQLITE_CORRUPT``, ``SQLITE_NOTADB``) on any
    read or write, this object stops using it: that call, every write already queued (its
    transaction rolled back, never retried) and every later call raise ``JournalError`` naming
    the file, ``polyloop check`` and how to recover. SQLite notices damage only in the pages a
    statement touches, and opening checks only the schema: the full check is
    :func:`check_integrity` (``polyloop check``), not done at open because it reads the whole
    file (``PRAGMA quick_check`` ≈ 5 s per GB, ``integrity_check`` ≈ 13 s per GB, measured on
    a 1 GB journal; see the README).

    Opening reads the file synchronously (construct it before the hot path); after that no
    method blocks the event loop: writes go to the writer thread, reads to worker threads.
    Close it with :meth:`close`, ``await`` :meth:`aclose`, or ``async with``; an unclosed
    journal is closed when garbage collected or at interpreter exit.

    Raises:
        ConfigError: a bad ``durability``, ``busy_timeout_s`` or an in-memory path.
        JournalError: the file cannot be opened as a PolyLoop journal (see ``path``), is
            damaged, or is not writable (and ``read_only`` is False).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "full",
        busy_timeout_s: float = 30.0,
        group_commit: bool = True,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
        writer: Literal["thread", "process"] = "thread",
    ) -> None:
        if durability not in ("full", "normal"):
            raise ConfigError(f"durability must be 'full' or 'normal', got {durability!r}")
        if writer not in ("thread", "process"):
            raise ConfigError(f"writer must be 'thread' or 'process', got {writer!r}")
        if writer == "process" and os.name != "posix":
            raise ConfigError("writer='process' needs a POSIX system; use writer='thread'")
        check_number("SQLiteJournal busy_timeout_s", busy_timeout_s, unit=" of seconds")
        spath = os.fspath(path)
        if spath in ("", ":memory:") or spath.startswith("file::memory:"):
            raise ConfigError(
                "SQLiteJournal needs a file path (an in-memory SQLite database is not shared "
                "between connections); use polyloop.journal.MemoryJournal for throwaway runs"
            )
        self.path = spath
        self.durability: Durability = durability
        self.read_only = read_only
        self.writer: Literal["thread", "process"] = writer
        self._clock = clock
        health = _Health(spath)
        self._writer: _Writer | _ReadOnlyWriter
        self._remote = writer == "process" and not read_only
        """Appends go to the writer process (``writer="process"``)."""
        immutable = False
        if read_only:
            self._writer = _ReadOnlyWriter(spath, health)
            self._readers, immutable = _read_only_pool(spath, busy_timeout_s, health)
        else:
            conn = _open_writer(spath, durability, busy_timeout_s)
            if self._remote:
                try:
                    self._writer = _ProcessWriter(
                        conn,
                        spath,
                        durability=durability,
                        busy_timeout_s=busy_timeout_s,
                        group_commit=group_commit,
                        health=health,
                    )
                except BaseException:
                    conn.close()
                    raise
            else:
                self._writer = _Writer(conn, spath, group_commit=group_commit, health=health)
            self._readers = _Readers(spath, busy_timeout_s, health)
        self.immutable = immutable
        """True when a read-only journal had to open the file ``immutable=1`` (see
        ``read_only``): later commits by a writer are not seen."""
        self._waking: set[asyncio.AbstractEventLoop] = set()
        self._finalizer = weakref.finalize(self, _shutdown, self._writer, self._readers)

    def __repr__(self) -> str:
        if self.read_only:
            return f"SQLiteJournal({self.path!r}, read_only=True)"
        if self.writer == "process":
            return f"SQLiteJournal({self.path!r}, durability={self.durability!r}, writer='process')"
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
        limits, metadata, history = spec_json(spec)
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
        run = _acquire_fn(run_id, owner, ttl_s, self._clock)
        lease: Lease = await self._write(run, run_id, give_back=True)
        try:
            spec, records = await self.read(run_id)  # nobody else can write it now
        except BaseException:
            await self._give_back(lease)
            raise
        return lease, spec, records

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        p = _prepare(lease, records)
        if self._remote:
            await self._write(None, lease.run_id, payload=_payload(p, self._clock()))
        else:
            await self._write(_append_fn(p, self._clock), lease.run_id)

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        run = _renew_fn(lease, ttl_s, self._clock)
        renewed: Lease = await self._write(run, lease.run_id)
        return renewed

    async def request_end(
        self,
        run_id: str,
        request: EndRequest,
        *,
        seen: int,
        end: Callable[[EndRequest], RunEnd],
    ) -> RequestResult | None:
        """The ``EndRequests`` seam (:class:`polyloop.seams.EndRequests`): store ``request`` in
        the run's row and, when no live execution holds the run, append the end record
        ``end(...)`` (fenced: the transaction takes the lease and the end record releases it),
        all in one transaction under the write lock, so two requests racing are decided one
        after the other and the run ends exactly once. Raises ``RunNotFound``."""
        run = _request_end_fn(run_id, request, seen, end, self._clock)
        answer: RequestResult | None = await self._write(run, run_id)
        return answer

    async def request_limits(self, request: LimitsRequest) -> LimitsRequest:
        """The ``LimitRequests`` seam (:class:`polyloop.seams.LimitRequests`): store
        ``request`` as the run's next ``requests`` row (no lease needed); it comes back with
        its ``seq``. Raises ``RunNotFound``."""
        stored: LimitsRequest = await self._write(_request_limits_fn(request), request.run_id)
        return stored

    async def settle_requests(
        self, run_id: str, settled: Sequence[tuple[int, str]], *, at: float
    ) -> None:
        """The ``LimitRequests`` seam: mark the run's requests (seq, outcome) settled."""
        await self._write(_settle_fn(run_id, settled, at), run_id)

    async def requests(self, run_id: str) -> list[dict[str, Any]]:
        """The run's rows of the ``requests`` table by ``seq``, as dicts of its columns with
        ``values`` decoded (see ``_limit_rows.request_dict``); none in a journal of 2.0 a
        writer has not opened yet. Read-only."""

        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            try:
                rows = conn.execute(sql.RUN_REQUESTS, (run_id,)).fetchall()
            except sqlite3.OperationalError:  # no such table: journal schema 2.0
                return []
            return [request_dict(r) for r in rows]

        return await asyncio.to_thread(self._readers.run, read)

    async def decide(self, run_id: str, decision: ApprovalDecided) -> ApprovalDecided:
        """The ``Approvals`` seam (:class:`polyloop.seams.Approvals`): in one transaction
        under the write lock, read the run's approval records and append ``decision`` only if
        its action awaits one (setting ``runs.status`` back to ``'running'``), so two deciders
        racing, in any processes, are decided one after the other. Needs no lease: a parked run
        has no owner, and nothing else writes to it while it waits."""
        run = _decide_fn(run_id, decision, self._clock)
        decided: ApprovalDecided = await self._write(run, run_id)
        return decided

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """The ``Approvals`` seam: the actions awaiting a decision (runs with ``status =
        'awaiting_approval'``), oldest request first. Read-only."""

        def read(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return _approvals.pending_of(conn.execute(sql.PENDING_APPROVALS).fetchall())

        return await asyncio.to_thread(self._readers.run, read)

    async def release(self, lease: Lease) -> None:
        await self._write(_release_fn(lease), lease.run_id)

    # -- read-only helpers (never write; for the CLI and tests) -------------------------------
    async def list_runs(
        self,
        *,
        status: str | None = None,
        run_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Every run (or those with ``status`` 'running'/'ended'; or only ``run_id``: a list
        of one or none, read by its key), oldest first, as dicts of the ``runs`` columns
        except ``history_json``, with ``metadata`` and ``limits`` decoded, and ``state``: what
        the run is doing now (``ended``, ``running``, ``detached`` or ``stale``, see
        :mod:`polyloop.journal._state`). ``steps_used``/``actions_executed`` are current
        after every step. What the run spent: ``tokens_used``, ``cost_usd`` (USD),
        ``active_seconds``, ``usage_missing`` (the ``runs`` totals the end record set; for a
        run without them, not ended yet, tokens, cost and replies without usage summed from
        its ``model_calls``, ``active_seconds`` None), and ``input_tokens``,
        ``output_tokens``, ``cached_tokens``, ``reasoning_tokens`` summed over its attempts
        (None: none reported), in one aggregate query. Read-only.
        A page (both optional; without them, every run at once): ``limit`` (an int >= 1)
        the first so many, ``after`` (the ``(created_at, run_id)`` of the last run of the
        previous page) only the runs after it, keyset on the order of the list
        (``created_at``, then ``run_id``; equal times are split by the run id, so no run is
        listed twice or skipped between pages). A run created while paging with an earlier
        ``created_at`` than the page read is not listed. Raises ``ValueError`` for a
        malformed ``after`` or ``limit``."""
        after, limit = check_page(after, limit)
        now = self._clock()
        return await asyncio.to_thread(
            self._readers.run, lambda c: _list_runs(c, status, run_id, now, after, limit)
        )

    async def steps(self, run_id: str) -> list[StepRecord]:
        """A run's step records from the ``steps`` table, by ``step_idx``. Read-only.
        Raises ``RunNotFound``."""
        return await asyncio.to_thread(self._readers.run, lambda c: _read_steps(c, run_id))

    async def step_usage(self, run_id: str) -> dict[int, dict[str, Any]]:
        """What each step of the run spent, by ``step_idx`` (steps with a model call only):
        ``input_tokens``, ``output_tokens``, ``cached_tokens``, ``reasoning_tokens``,
        ``cost_usd`` (USD), each the sum over the step's ``model_calls`` attempts, None when
        no attempt reported it. One aggregate query. Read-only. Raises ``RunNotFound``."""
        return await asyncio.to_thread(self._readers.run, lambda c: _step_usage(c, run_id))

    @property
    def commits(self) -> int:
        """Write transactions committed by this object so far (group commit shares one
        between many appends)."""
        return self._writer.commits

    # -- writing ------------------------------------------------------------------------------
    async def _write(
        self,
        fn: _Fn | None,
        run_id: str,
        *,
        give_back: bool = False,
        payload: tuple[Any, ...] | None = None,
    ) -> Any:
        """Run ``fn`` in the writer thread and wait for its commit. If cancelled while waiting,
        the write still completes before ``CancelledError`` propagates (its own error, if it
        failed, propagates instead). ``give_back``: a lease the cancelled write took is
        released, since the caller never gets it. ``payload`` (instead of ``fn``): an append
        for the writer process."""
        loop = asyncio.get_running_loop()
        job = _Job(fn, run_id, loop, loop.create_future(), payload)
        self._writer.submit(job, wake=False)
        if loop not in self._waking:  # the first write of this turn of the event loop
            self._waking.add(loop)
            loop.call_soon(self._wake_writer, loop)
        try:
            return await job.fut
        except asyncio.CancelledError:
            await _wait_answer(job)
            if not job.ok:
                raise job.value from job.value.__cause__
            if give_back and isinstance(job.value, Lease):
                await self._give_back(job.value)
            raise

    def _wake_writer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the writer thread once for the writes ``loop`` made in this turn: one wake-up
        (and one hand-over of the interpreter lock) for all of them, not one per write."""
        self._waking.discard(loop)
        self._writer.wake()

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


if TYPE_CHECKING:

    def _conforms(journal: SQLiteJournal) -> Journal:
        return journal
