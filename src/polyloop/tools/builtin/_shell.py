"""Running one shell command: a supervisor, a timeout, and an output cap.

The command runs as ``<shell> -c command`` under a small supervisor process (``_supervisor.py``,
started with the running Python, one per command), in its own process group, with the
workspace root as working directory, stdin from ``/dev/null`` and stderr merged into stdout.
The supervisor enforces the timeout, and when the command times out, when the call is
cancelled, when PolyLoop dies and also when the command returns normally, it kills with SIGKILL
everything the command started that is still running:

- On Linux every descendant, also one that made itself a new session with ``setsid`` (the
  supervisor is a child subreaper), and the supervisor gets SIGTERM when PolyLoop dies, even of
  SIGKILL (``PR_SET_PDEATHSIG``), and kills the tree then. :class:`ShellResult` counts what was
  killed.
- Elsewhere the command's process group only (a process that left it survives), and PolyLoop
  dying is noticed only through the supervisor's stdin reaching end of file (it does not if a
  process PolyLoop forked still holds the pipe).

Nothing can clean up after the supervisor itself is killed with SIGKILL. Starting it costs a
Python start-up (about 10-20 ms) per command. Everything runs on the event loop with asyncio
subprocesses; nothing blocks it.

Output is decoded as UTF-8 (invalid bytes become U+FFFD) and capped as :mod:`.._output` says.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from polyloop.types import EnvironmentFailure

from .._output import HeadTail

__all__ = ["ShellResult", "default_shell", "run_shell"]

_SUPERVISOR = str(Path(__file__).with_name("_supervisor.py"))
_REPORT_PREFIX = "polyloop-supervisor"
_REPORT_CAP = 8192  # bytes of the supervisor's stderr kept (its report is the last line)
_DRAIN_S = 1.0  # after the supervisor exits, how long to wait for the output pipe to close
_STOP_S = 5.0  # on cancellation, how long to wait for the supervisor to kill the tree


def default_shell() -> tuple[str, str]:
    """``(program, name)``: bash if it is on PATH, else ``/bin/sh``."""
    bash = shutil.which("bash")
    return (bash, "bash") if bash else ("/bin/sh", "sh")


@dataclass(frozen=True, slots=True)
class ShellResult:
    """What a command did.

    Attributes:
        head: the start of the output (all of it when nothing was omitted).
        tail: the end of the output ("" when nothing was omitted).
        omitted: characters between ``head`` and ``tail`` that were not kept.
        returncode: the exit code; negative: killed by that signal; None when it timed out.
        timed_out: the command was killed at the timeout (one that exited on its own at the
            same moment did not time out).
        killed: processes that died of the SIGKILL the supervisor sent: at a timeout the
            command and its descendants still running, after a normal return the background
            processes it left behind. Without ``whole_tree``, only the command itself is
            counted (what its process group held is not known).
        unkillable: descendants the supervisor was not permitted to signal (they changed
            user, e.g. through ``sudo``); they may still run.
        whole_tree: every descendant was found (Linux); False: only the command's process
            group was killed, and processes that left it may still run.
    """

    head: str
    tail: str
    omitted: int
    returncode: int | None
    timed_out: bool
    killed: int
    unkillable: int
    whole_tree: bool


class _HeadTail(HeadTail):
    """The capped output (see :class:`~polyloop.tools._output.HeadTail`), fed as bytes and
    decoded as UTF-8 (invalid bytes become U+FFFD)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes, *, final: bool = False) -> None:
        self.add(self._decoder.decode(data, final=final))


class _Protocol(asyncio.SubprocessProtocol):
    """Feeds the command's output (the supervisor's stdout) to a sink, keeps the end of the
    supervisor's stderr (its report), and tells when it exited and when each pipe closed.

    (``asyncio.subprocess.Process.wait`` waits for the pipes to close as well, which a
    process that escaped the supervisor could hold open.)"""

    def __init__(self, sink: _HeadTail) -> None:
        loop = asyncio.get_running_loop()
        self.sink = sink
        self.report = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()
        self.reported: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        data = data.encode() if isinstance(data, str) else data
        if fd == 1:
            self.sink.feed(data)
        else:
            self.report += data
            del self.report[:-_REPORT_CAP]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        closed = {1: self.drained, 2: self.reported}.get(fd)
        if closed is not None and not closed.done():
            closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def _stop(transport: asyncio.SubprocessTransport, protocol: _Protocol) -> None:
    """Tell the supervisor to kill the tree and exit (end of file on its stdin), and give it
    ``_STOP_S`` seconds to do so."""
    stdin = transport.get_pipe_transport(0)
    if stdin is not None:
        stdin.close()
    await asyncio.wait({protocol.exited}, timeout=_STOP_S)


async def _start(
    sink: _HeadTail, command: str, program: str, cwd: str, timeout_s: float
) -> tuple[asyncio.SubprocessTransport, _Protocol]:
    loop = asyncio.get_running_loop()
    try:
        return await loop.subprocess_exec(
            lambda: _Protocol(sink),
            sys.executable,
            "-I",
            "-S",
            _SUPERVISOR,
            str(os.getpid()),
            repr(timeout_s),
            program,
            command,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:  # no Python, no root directory: nothing the model can fix
        raise EnvironmentFailure(f"cannot start {program!r} in {cwd!r}: {exc}") from exc


async def run_shell(
    command: str, *, program: str, cwd: str, timeout_s: float, max_chars: int
) -> ShellResult:
    """Run ``command`` and collect its capped output (see the module docstring).

    Raises:
        asyncio.CancelledError: the call was cancelled; the supervisor was told to kill the
            tree first and given up to 5 seconds to do so (after a second cancellation, or
            if it does not exit in time, it is killed with SIGKILL and what it started may
            survive).
        EnvironmentFailure: the shell could not be started (it or the root is missing), or
            the supervisor failed or was killed before it reported.
    """
    sink = _HeadTail(max_chars)
    # Cancelled while starting, asyncio would kill the supervisor alone, with SIGKILL, and
    # leave what it started running: the start is shielded and the supervisor stopped after.
    starting = asyncio.ensure_future(_start(sink, command, program, cwd, timeout_s))
    try:
        transport, protocol = await asyncio.shield(starting)
    except asyncio.CancelledError:
        await asyncio.wait({starting}, timeout=_STOP_S)
        if starting.done() and not starting.cancelled() and starting.exception() is None:
            transport, protocol = starting.result()
            try:
                await _stop(transport, protocol)
            finally:
                transport.close()
        raise
    try:
        try:
            # (asyncio.wait, not await: cancelling the call must not cancel these futures,
            # the cleanup below waits for one of them.)
            await asyncio.wait({protocol.exited})  # the supervisor enforces the timeout
            await asyncio.wait({protocol.reported})  # it alone holds its stderr: no hang
            # Output still in the pipe is read until it closes, unless a process that escaped
            # the supervisor holds it open.
            await asyncio.wait({protocol.drained}, timeout=_DRAIN_S)
        except BaseException:
            await _stop(transport, protocol)
            raise
    finally:
        transport.close()  # kills the supervisor with SIGKILL if it still runs
    sink.feed(b"", final=True)
    return _result(sink, bytes(protocol.report), transport.get_returncode(), program, cwd)


def _result(
    sink: _HeadTail, report: bytes, exit_status: int | None, program: str, cwd: str
) -> ShellResult:
    """The result from the supervisor's report (its last line on stderr, see
    ``_supervisor.py``)."""
    lines = report.decode("utf-8", "replace").splitlines()
    last = lines[-1] if lines else ""
    prefix, _, rest = last.partition(" ")
    kind, _, rest = rest.partition(" ")
    if prefix == _REPORT_PREFIX and kind == "error":
        raise EnvironmentFailure(f"cannot start {program!r} in {cwd!r}: {rest}")
    if prefix == _REPORT_PREFIX and kind == "stopped":  # a signal from outside PolyLoop
        raise EnvironmentFailure(
            f"the supervisor of a shell command ({_SUPERVISOR}) was told to stop by a signal "
            "from another process, and killed the command; find what signals PolyLoop's "
            "child processes"
        )
    fields = rest.split(" ")
    if prefix != _REPORT_PREFIX or kind not in ("exited", "timeout") or len(fields) != 4:
        how = (
            f"was killed by signal {-exit_status}"
            if exit_status is not None and exit_status < 0
            else f"failed ({last.strip() or f'exit code {exit_status}, no report'})"
        )
        raise EnvironmentFailure(
            f"the supervisor of a shell command ({sys.executable} {_SUPERVISOR}) {how}; the "
            "processes the command started may still run: check the Python installation"
        )
    code, killed, unkillable, tree = fields
    return ShellResult(
        head=sink.head,
        tail=sink.tail,
        omitted=sink.omitted,
        returncode=int(code) if kind == "exited" else None,
        timed_out=kind == "timeout",
        killed=int(killed),
        unkillable=int(unkillable),
        whole_tree=tree == "1",
    )
