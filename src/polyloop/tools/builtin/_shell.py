"""Running one shell command: its own process group, a timeout, and an output cap.

The command runs as ``<shell> -c command`` in a new session (so in its own process group),
with the workspace root as working directory, stdin from ``/dev/null`` and stderr merged into
stdout. When it times out, when the call is cancelled, and also when it returns normally, the
whole process group is killed with SIGKILL: nothing it started outlives the call (a process
that made itself a new session with ``setsid`` escapes this; the sandbox is the caller's).
Everything runs on the event loop with asyncio subprocesses; nothing blocks it.

Output is decoded as UTF-8 (invalid bytes become U+FFFD). Of output longer than the cap, the
first half and the last half are kept (the end of a build or a test run says the most) and
the characters in between are counted.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

from polyloop.types import EnvironmentFailure

__all__ = ["ShellResult", "default_shell", "run_shell"]

_DRAIN_S = 1.0  # after the group is killed, how long to wait for the pipe to close


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
        timed_out: the command was killed at the timeout.
    """

    head: str
    tail: str
    omitted: int
    returncode: int | None
    timed_out: bool


class _HeadTail:
    """Keeps the first ``limit // 2`` and the last ``limit - limit // 2`` characters."""

    def __init__(self, limit: int) -> None:
        self._head_cap = limit // 2
        self._tail_cap = limit - self._head_cap
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.head = ""
        self.tail = ""
        self.total = 0

    def feed(self, data: bytes, *, final: bool = False) -> None:
        text = self._decoder.decode(data, final=final)
        self.total += len(text)
        if len(self.head) < self._head_cap:
            room = self._head_cap - len(self.head)
            self.head += text[:room]
            text = text[room:]
        if text:
            self.tail = (self.tail + text)[-self._tail_cap :]

    @property
    def omitted(self) -> int:
        return self.total - len(self.head) - len(self.tail)


class _Protocol(asyncio.SubprocessProtocol):
    """Feeds the output to a sink and tells when the shell exited and when the pipe closed.

    (``asyncio.subprocess.Process.wait`` waits for the pipes to close as well, which a
    background process can hold open; the exit alone is what the timeout is about.)"""

    def __init__(self, sink: _HeadTail) -> None:
        loop = asyncio.get_running_loop()
        self.sink = sink
        self.exited: asyncio.Future[None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.sink.feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if not self.drained.done():
            self.drained.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def _kill_group(pgid: int) -> None:
    # ProcessLookupError: the group is gone; PermissionError: only a zombie leader is left
    # (macOS reports EPERM then).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run_shell(
    command: str, *, program: str, cwd: str, timeout_s: float, max_chars: int
) -> ShellResult:
    """Run ``command`` and collect its capped output (see the module docstring).

    Raises:
        asyncio.CancelledError: the call was cancelled; the process group was killed first.
        EnvironmentFailure: the shell could not be started (it or the root is missing).
    """
    sink = _HeadTail(max_chars)
    loop = asyncio.get_running_loop()
    try:
        transport, protocol = await loop.subprocess_exec(
            lambda: _Protocol(sink),
            program,
            "-c",
            command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:  # no shell, no root directory: nothing the model can fix
        raise EnvironmentFailure(f"cannot start {program!r} in {cwd!r}: {exc}") from exc
    pid = transport.get_pid()
    timed_out = False
    try:
        done, _ = await asyncio.wait({protocol.exited}, timeout=timeout_s)
        timed_out = not done
        _kill_group(pid)  # on timeout, and what it left in the background otherwise
        await protocol.exited
        # Output still in the pipe is read until it closes, unless a process that left the
        # group holds it open.
        await asyncio.wait({protocol.drained}, timeout=_DRAIN_S)
    except BaseException:
        _kill_group(pid)
        raise
    finally:
        transport.close()
    sink.feed(b"", final=True)
    return ShellResult(
        head=sink.head,
        tail=sink.tail,
        omitted=sink.omitted,
        returncode=None if timed_out else transport.get_returncode(),
        timed_out=timed_out,
    )
