"""The stdio transport PolyLoop runs an MCP server through: it starts the server process itself
so that it knows its pid (to stop it by pid, to see that it died) and which ``tools/call``
requests were written to it (``sent``), which the SDK's own ``stdio_client`` does not tell."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from ._answers import AnswerReader
from ._lines import DEFAULT_MAX_LINE_BYTES, MIN_LINE_BYTES, LineSplitter, TooLong

log = logging.getLogger("polyloop.tools.mcp")

# After stdin closes, how long a server may take to exit on its own, then after SIGTERM to its
# process group before SIGKILL (the MCP lifecycle's shutdown order).
_EXIT_GRACE_S = 2.0
_TERM_GRACE_S = 2.0
_STDERR_LINES = 20
_STDERR_LINE_BYTES = MIN_LINE_BYTES  # of a longer stderr line, its first KEPT_BYTES are kept
# The shell tool's supervisor: its ``--exec`` mode arms the parent-death signal, then execs.
_SUPERVISOR = Path(__file__).resolve().parents[1] / "builtin" / "_supervisor.py"


@dataclass(eq=False)
class StdioProcess:
    """The running server: its process, whether its stdout has ended, and its last stderr
    lines (for error messages)."""

    process: anyio.abc.Process
    eof: bool = False
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=_STDERR_LINES)
    )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        """The process runs and its stdout is open (a server that closed stdout is gone)."""
        return self.process.returncode is None and not self.eof

    def last_words(self) -> str:
        """The server's last stderr line, or its exit status, for a one-line message."""
        for line in reversed(self.stderr_tail):
            if line.strip():
                return line.strip()[:300]
        code = self.process.returncode
        return f"exit status {code}" if code is not None else "no output on stderr"


Streams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


@contextlib.asynccontextmanager
async def stdio_transport(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: str | None,
    on_write: Callable[[Any, bool], None],
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> AsyncIterator[tuple[Streams, StdioProcess]]:
    """Start ``argv`` in a new process group (what ends it when PolyLoop dies: see
    :func:`server_command`) and bridge its stdin/stdout to the session's streams (the lines it
    writes are read by :class:`~._answers.AnswerReader`). At most ``max_line_bytes`` of one
    stdout line are held (a longer one is dropped as it arrives and fails the request it
    names: :meth:`~._answers.AnswerReader.too_long`); a stderr line is kept to its first
    :data:`_STDERR_LINE_BYTES` bytes.
    ``on_write(message, True)`` is called for each JSON-RPC message just before its bytes are
    written to the server (a request it names may reach the server from then on), and
    ``on_write(message, False)`` if that write then fails (the server has stopped reading: a
    line it never read whole is a request it cannot run). On exit: stdin is closed, then the
    process group gets SIGTERM, then SIGKILL, each after a grace period, all shielded from
    cancellation.

    Raises:
        OSError: the command cannot be started (not found, not executable).
    """
    process = await anyio.open_process(
        server_command(argv, env=env, cwd=cwd),
        env=dict(env) if env is not None else None,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: stopping it stops its children
    )
    server = StdioProcess(process)
    reader = AnswerReader()
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def stdout_reader() -> None:
        assert process.stdout is not None
        lines = LineSplitter(max_line_bytes)
        try:
            async with read_in:
                async for chunk in process.stdout:
                    for line in lines.feed(chunk):
                        if isinstance(line, TooLong):
                            await read_in.send(reader.too_long(line, max_line_bytes))
                        elif line.strip():
                            await read_in.send(reader.read(line))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            server.eof = True

    async def stderr_reader() -> None:
        assert process.stderr is not None
        lines = LineSplitter(_STDERR_LINE_BYTES)
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                for line in lines.feed(chunk):
                    raw = line.head if isinstance(line, TooLong) else line
                    text = raw.decode("utf-8", "replace")
                    server.stderr_tail.append(text)
                    log.debug("mcp server %d: %s", process.pid, text)

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_out:
                async for item in write_out:
                    message = item.message
                    data = message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    on_write(message, True)
                    reader.written(message, True)
                    try:
                        await process.stdin.send(data.encode("utf-8"))
                    except BaseException:
                        on_write(message, False)
                        reader.written(message, False)
                        raise
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server stopped reading: end the session's stream so no request waits on.
            await read_in.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stderr_reader)
        tg.start_soon(stdin_writer)
        try:
            yield (read_out, write_in), server
        finally:
            with anyio.CancelScope(shield=True):
                write_in.close()
                read_out.close()
                await stop_process(process)
            tg.cancel_scope.cancel()


def server_command(
    argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None
) -> list[str]:
    """The command line that starts ``argv`` so that it does not outlive PolyLoop.

    On Linux: ``argv`` behind the shell supervisor's ``--exec`` mode, which sets the
    parent-death signal (``PR_SET_PDEATHSIG``) to SIGKILL and then execs ``argv`` in its own
    process (the server keeps that pid): when PolyLoop dies, even of SIGKILL, the server gets
    SIGKILL, also one that ignores the end of its stdin. It costs one Python start-up per
    server start (what the shell tool's supervisor costs per command). The signal comes when
    the *thread* that started the server ends: PolyLoop starts it from the event loop's
    thread, so a server also ends with its event loop's thread (it could not be used from
    another loop anyway). It does not reach what the server starts itself (an ``npx``
    wrapper's ``node``): those see their stdin close when PolyLoop dies, as a server does
    elsewhere; nor a set-user-ID program, which loses it at ``exec``.

    Elsewhere ``argv`` as it is: macOS has no parent-death signal (nothing a process can arm
    before ``exec`` that ends it when its parent dies), and FreeBSD's
    ``procctl(PROC_PDEATHSIG_CTL)`` is not used; there a server learns that PolyLoop died only
    from the end of its stdin, and one that ignores it keeps running. ``argv`` is also started
    as it is when its program is not found (so that starting it raises the same ``OSError``)
    and when ``sys.executable`` is unknown.
    """
    program = argv[0]
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(argv)
    if os.sep in program:
        found = os.access(os.path.join(cwd or "", program), os.X_OK)
    else:
        path = (env if env is not None else os.environ).get("PATH", os.defpath)
        found = shutil.which(program, path=path) is not None
    if not found:
        return list(argv)
    return [sys.executable, "-I", "-S", str(_SUPERVISOR), "--exec", str(os.getpid()), *argv]


async def stop_process(process: anyio.abc.Process) -> None:
    """Close its stdin; if it has not exited after a grace period, SIGTERM its process group;
    then SIGKILL it. Returns once it exited (or after the last grace period)."""
    if process.stdin is not None:
        with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    for sig, grace in ((None, _EXIT_GRACE_S), (signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, 2)):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        with anyio.move_on_after(grace):
            await process.wait()
        if process.returncode is not None:
            break
    # What the server started and left behind in its group (an ``npx`` wrapper's node) goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    for stream in (process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, anyio.BrokenResourceError):
                await stream.aclose()
