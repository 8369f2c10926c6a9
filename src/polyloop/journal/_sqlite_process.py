"""The SQLite journal's writer process: ``SQLiteJournal(path, writer="process")``.

With ``writer="thread"`` (the default) the writer thread runs every write's SQL in this
process, under the interpreter lock the event loop needs too. At hundreds of concurrent runs
that SQL is a large share of the process's CPU. With ``writer="process"`` the appends (all but a
few writes of a run: every step, model call and end record) are committed by a child process on
its own connection, so their SQL runs on another core:

- The event loop prepares an append as before (its rows, canonical JSON included) and queues
  it; the writer thread takes a batch of them, as it would, and hands it to the child (one
  pickled frame over a pipe, with the time the append was made as its ``written_at``).
- The child runs the batch exactly as the writer thread would (one ``BEGIN IMMEDIATE``, every
  append fenced, a savepoint per append only when one fails) and answers after ``COMMIT``;
  only then are the callers answered. The write-ahead protocol is unchanged: nothing an append
  carries is acted on before it is durable.
- The other writes (``create``, leases, requests, approvals) stay with the writer thread's own
  connection. That thread runs the two kinds of batches one after the other (the appends
  first), so the two connections never wait for each other's write lock; each notices the
  other's commits (``PRAGMA data_version``) before trusting what it remembers of a run.
  Damage the child meets (``SQLITE_CORRUPT``) marks this journal object damaged, and the
  other writes of the same batch fail with it unwritten, as they would in one transaction.

Failure. If the child dies (killed, out of memory), the appends of the batch it held fail with
``JournalError`` and so does every later append (the other writes still go through the
thread); their outcome is unknown, as after a crash between ``COMMIT`` and its answer, and
resume treats it so. An append whose values the child cannot take (anything but SQL values;
a subclass of str, int or float goes as its plain value) fails alone. If this process dies,
the child reads the end of its pipe, finishes the batch it holds, and exits; a batch it
commits then is one whose callers never acted on it. It runs in a session of its own and
ignores SIGINT and SIGTERM (a Ctrl-C or a ``kill`` of the process group must not end it before
this process has handed it the last appends), and ends when this process closes the journal
or exits. A process forked from this one lets go of the child's pipes (its copy of the journal
then refuses appends), so the child still ends with the process that started it. Damage a
reader finds is not seen by a batch already handed to the child (the writer thread checks
just before its own ``COMMIT``); every later batch is refused.

Cost. Starting the child takes about 0.2 s (it imports only the journal's modules), overlapped
with what the caller does next: it is waited for at the first append.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import signal
import sqlite3
import struct
import subprocess
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..types import JournalError, LeaseLost, RunNotFound
from ._sqlite_damage import _Health
from ._sqlite_writer import _Fn, _Job, _Writer

log = logging.getLogger("polyloop")

_LEN = struct.Struct("<Q")
_PICKLE = pickle.HIGHEST_PROTOCOL


_PLAIN = (int, float, str, bytes, tuple, list)


class _PlainPickler(pickle.Pickler):
    """Pickles SQL values only: None, bool, int, float, str, bytes, in tuples and lists. A
    subclass of int, float or str (a ``str`` enum, a user's own type) goes as its plain value,
    the value sqlite3 would store, so the child never imports a class of the caller's; any
    other object is refused (``TypeError``). (The C pickler asks :meth:`reducer_override`
    only for objects that are not exactly of a built-in type.)"""

    def reducer_override(self, obj: Any) -> Any:
        if obj in _PLAIN:  # the constructors named below, pickled by reference
            return NotImplemented
        if isinstance(obj, int):
            return (int, (int.__int__(obj),))
        if isinstance(obj, float):
            return (float, (float.__float__(obj),))
        if isinstance(obj, str):
            return (str, (str.__str__(obj),))
        if isinstance(obj, bytes):
            return (bytes, (bytes(obj),))
        if isinstance(obj, tuple):
            return (tuple, (tuple(obj),))
        if isinstance(obj, list):
            return (list, (list(obj),))
        raise TypeError(
            f"the writer process takes SQL values only, not {type(obj).__qualname__} objects"
        )


def _plain_dumps(value: Any) -> bytes:
    buf = io.BytesIO()
    _PlainPickler(buf, _PICKLE).dump(value)
    return buf.getvalue()


def _send(fd: int, data: bytes) -> None:
    """One frame: its length, then ``data`` (all of it, however many writes that takes)."""
    view = memoryview(_LEN.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _read_exactly(fd: int, n: int) -> bytes:
    parts: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the pipe was closed")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def _receive(fd: int) -> bytes:
    (n,) = _LEN.unpack(_read_exactly(fd, _LEN.size))
    return _read_exactly(fd, n)


# -- errors across the pipe --------------------------------------------------------------------


def _error_out(exc: BaseException) -> tuple[str, str]:
    """A failed append's error as plain data (exceptions do not all pickle faithfully)."""
    if isinstance(exc, RunNotFound):
        return ("RunNotFound", exc.run_id)
    if isinstance(exc, LeaseLost):
        return ("LeaseLost", str(exc))
    if isinstance(exc, JournalError):
        return ("JournalError", str(exc))
    return ("RuntimeError", f"journal writer process: {type(exc).__name__}: {exc}")


def _error_in(kind: str, text: str) -> Exception:
    if kind == "RunNotFound":
        return RunNotFound(text)
    if kind == "LeaseLost":
        return LeaseLost(text)
    if kind == "JournalError":
        return JournalError(text)
    return RuntimeError(text)


def _damage_cause(code: int, text: str) -> sqlite3.DatabaseError:
    """The child's damage report as the SQLite error :class:`_Health` recognises."""
    cause = sqlite3.DatabaseError(text)
    cause.sqlite_errorcode = code
    return cause


# -- this process's side -----------------------------------------------------------------------


_MARK = "polyloop-journal-writer"
"""The child's first argument: how ``ps`` (and the tests) tell a writer process."""

_BOOT = (
    # The package polyloop as an empty module of the folder it was imported from: the child
    # imports only the journal's modules, not everything polyloop/__init__.py brings (half
    # the start-up time). Its first argument is _MARK, then that folder, then _child's.
    "import sys, types\n"
    "package = types.ModuleType('polyloop')\n"
    "package.__path__ = [sys.argv[2]]\n"
    "sys.modules['polyloop'] = package\n"
    "from polyloop.journal._sqlite_process import _child\n"
    "from polyloop.journal._sqlite_writes import _append_of_payload\n"
    "sys.exit(_child(sys.argv[3:], _append_of_payload))\n"
)


class _ProcessWriter(_Writer):
    """The writer thread, handing the appends (jobs with a ``payload``) to the child process
    and running the other writes on its own connection."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: str,
        *,
        durability: str,
        busy_timeout_s: float,
        group_commit: bool,
        health: _Health,
    ) -> None:
        if not sys.executable or getattr(sys, "frozen", False):
            raise JournalError(
                f"cannot start the writer process of {path}: no Python interpreter to run it "
                "(sys.executable is empty, or this is a frozen application); use "
                "writer='thread'"
            )
        child_in, to_child = os.pipe()
        from_child, child_out = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",  # not the working directory first on sys.path: nothing of the caller's
                    "-c",
                    _BOOT,
                    _MARK,
                    str(Path(__file__).resolve().parents[1]),
                    str(child_in),
                    str(child_out),
                    path,
                    durability,
                    repr(busy_timeout_s),
                ],
                pass_fds=(child_in, child_out),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # Its own session: a Ctrl-C (or a signal to this process group) never reaches
                # it, even while it starts, before it ignores SIGINT and SIGTERM itself.
                start_new_session=True,
            )
        except OSError as exc:
            os.close(to_child)
            os.close(from_child)
            raise JournalError(f"cannot start the writer process of {path}: {exc}") from exc
        finally:
            os.close(child_in)
            os.close(child_out)
        self._to, self._from = to_child, from_child
        self._ready = False
        self._gone: str | None = None
        """Why the child can take no more appends (it died, refused the file, or this is a
        forked copy of the process that started it)."""
        try:
            super().__init__(conn, path, group_commit=group_commit, health=health)
        except BaseException:
            self._close_child()
            raise
        _ALIVE.add(self)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _run_guarded(self, jobs: list[_Job]) -> None:
        """The appends first (in the child), then the other writes (here): damage the child
        meets fails the other writes of the batch too, unwritten, as in one transaction."""
        local = [job for job in jobs if job.payload is None]
        remote = [job for job in jobs if job.payload is not None]
        if remote:
            try:
                self._remote(remote)
            except BaseException as exc:
                log.exception("SQLite journal %s: the writer failed a batch", self._path)
                bug = f"journal writer bug: {exc!r}"
                self._abort(remote, lambda: RuntimeError(bug))
        if local:
            super()._run_guarded(local)

    def _remote(self, jobs: list[_Job]) -> None:
        if self._health.cause is not None:
            self._abort(jobs, self._damaged)
            return
        # Each append pickled alone: one that cannot be sent fails alone, not its batch-mates.
        sendable: list[_Job] = []
        blobs: list[bytes] = []
        refused: list[tuple[_Job, bool, Any]] = []
        for job in jobs:
            try:
                blobs.append(_plain_dumps(job.payload))
            except Exception as exc:  # as the thread's sqlite3 refusal would: a JournalError
                err = JournalError(
                    f"SQLite journal {self._path}: writing run {job.run_id!r} failed: {exc}"
                )
                err.__cause__ = exc
                refused.append((job, False, err))
            else:
                sendable.append(job)
        if refused:
            self._resolve(refused)
        if not sendable:
            return
        if self._gone is None:
            try:
                if not self._ready:
                    self._handshake()
                if self._gone is None:
                    _send(self._to, pickle.dumps(blobs, _PICKLE))
                    answers, commits, damage = pickle.loads(_receive(self._from))
            except (OSError, EOFError) as exc:
                self._gone = self._exit_story(exc)
        gone = self._gone
        if gone is not None:
            self._abort(sendable, lambda: JournalError(gone))
            return
        self.commits += commits
        if damage is not None:
            self._health.note(_damage_cause(*damage))
        self._resolve(
            [
                (job, ok, value if ok else _error_in(*value))
                for job, (ok, value) in zip(sendable, answers, strict=True)
            ]
        )

    def _handshake(self) -> None:
        kind, detail = pickle.loads(_receive(self._from))
        if kind == "ready":
            self._ready = True
        else:
            self._gone = str(detail)

    def _exit_story(self, exc: BaseException) -> str:
        """Why the child stopped answering, for the error every later append raises."""
        code = self._reap(timeout_s=5)
        return (
            f"the SQLite journal {self._path}: its writer process (pid {self._proc.pid}) "
            f"ended with exit code {code} ({type(exc).__name__}: {exc}); the appends it held "
            f"may or may not have been committed (resume reads which), and this journal "
            f"object writes no more appends (its other writes still go through): open a new one"
        )

    def _reap(self, *, timeout_s: float) -> int:
        """The child's exit code, once it exited (killed after ``timeout_s``)."""
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            return self._proc.wait()

    def _main(self) -> None:
        try:
            super()._main()
        finally:
            self._close_child()

    def _forked(self) -> None:
        """In a process forked from this one: let go of the child's pipes (so the child sees
        their end when the process that started it exits), never to write to them."""
        self._gone = (
            f"the SQLite journal {self._path} was opened with writer='process' before this "
            "process was forked from the one that opened it: open a new one here"
        )
        for fd in (self._to, self._from):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._to = self._from = -1

    def _close_child(self) -> None:
        """End of its pipe: the child finishes and exits (killed after 30 s)."""
        if self._to < 0:  # a forked copy: the child is not ours
            return
        with contextlib.suppress(OSError):
            os.close(self._to)
        code = self._reap(timeout_s=30)
        with contextlib.suppress(OSError):
            os.close(self._from)
        if code != 0 and self._gone is None:
            log.warning(
                "SQLite journal %s: the writer process exited with code %s", self._path, code
            )


_ALIVE: weakref.WeakSet[_ProcessWriter] = weakref.WeakSet()
"""Every writer with a child, for :func:`_after_fork`."""


def _after_fork() -> None:
    for writer in list(_ALIVE):
        writer._forked()
    _ALIVE.clear()


os.register_at_fork(after_in_child=_after_fork)


# -- the child ---------------------------------------------------------------------------------


class _ChildJob:
    __slots__ = ("fn", "run_id")

    def __init__(self, fn: _Fn, run_id: str) -> None:
        self.fn = fn
        self.run_id = run_id


class _Batches(_Writer):
    """The writer's batch logic without its thread: :meth:`run` runs one batch on this
    connection and returns each job's answer (``(True, value)`` or ``(False, error)``)."""

    def __init__(self, conn: sqlite3.Connection, path: str, health: _Health) -> None:
        super().__init__(conn, path, group_commit=True, health=health, start=False)
        self._answers: dict[int, tuple[bool, Any]] = {}

    def run(self, jobs: list[_ChildJob]) -> list[tuple[bool, Any]]:
        self._answers = {}
        self._run_guarded(jobs)  # type: ignore[arg-type]
        return [self._answers[id(job)] for job in jobs]

    def _resolve(self, answers: list[tuple[Any, bool, Any]]) -> None:  # type: ignore[override]
        for job, ok, value in answers:
            self._answers[id(job)] = (True, None) if ok else (False, _error_out(value))


def _run_frame(
    frame: bytes, batches: _Batches, make: Callable[[tuple[Any, ...]], _Fn]
) -> list[tuple[bool, Any]]:
    """The answers to one frame's appends, in order. An append that cannot be read fails
    alone; nothing in a frame ends the child."""
    blobs: list[bytes] = pickle.loads(frame)
    answers: list[tuple[bool, Any] | None] = [None] * len(blobs)
    jobs: list[_ChildJob] = []
    at: list[int] = []
    for i, blob in enumerate(blobs):
        try:
            payload = pickle.loads(blob)
            jobs.append(_ChildJob(make(payload), payload[0]))
        except Exception as exc:
            answers[i] = (False, _error_out(exc))
        else:
            at.append(i)
    if jobs:
        for i, answer in zip(at, batches.run(jobs), strict=True):
            answers[i] = answer
    return [a if a is not None else (False, ("RuntimeError", "no answer")) for a in answers]


def _child(argv: list[str], make: Callable[[tuple[Any, ...]], _Fn]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from ._sqlite_schema import _open_writer

    rfd, wfd, path, durability, busy = int(argv[0]), int(argv[1]), argv[2], argv[3], argv[4]
    health = _Health(path)
    try:
        conn = _open_writer(path, durability, float(busy))  # type: ignore[arg-type]
    except JournalError as exc:
        _send(wfd, pickle.dumps(("refused", str(exc)), _PICKLE))
        return 1
    batches = _Batches(conn, path, health)
    try:
        _send(wfd, pickle.dumps(("ready", os.getpid()), _PICKLE))
        while True:
            try:
                frame = _receive(rfd)
            except EOFError:
                return 0
            before = batches.commits
            answers = _run_frame(frame, batches, make)
            cause = health.cause
            damage = None
            if cause is not None:
                damage = (getattr(cause, "sqlite_errorcode", sqlite3.SQLITE_CORRUPT), str(cause))
            _send(wfd, pickle.dumps((answers, batches.commits - before, damage), _PICKLE))
    except BrokenPipeError:  # the journal's process is gone: nobody waits for the answer
        return 0
    finally:
        conn.close()
