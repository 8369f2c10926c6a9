"""The stdio transport PolyLoop runs an MCP server through: it starts the server process itself
so that it knows its pid (to stop it by pid, to see that it died) and which ``tools/call``
requests were written to it (``sent``), which the SDK's own ``stdio_client`` does not tell."""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

from ._answers import AnswerReader

log = logging.getLogger("polyloop.tools.mcp")

# After stdin closes, how long a server may take to exit on its own, then after SIGTERM to its
# process group before SIGKILL (the MCP lifecycle's shutdown order).
_EXIT_GRACE_S = 2.0
_TERM_GRACE_S = 2.0
_STDERR_LINES = 20


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
) -> AsyncIterator[tuple[Streams, StdioProcess]]:
    """Start ``argv`` in a new process group and bridge its stdin/stdout to the session's
    streams (the lines it writes are read by :class:`~._answers.AnswerReader`).
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
        list(argv),
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
        buffer = b""
        try:
            async with read_in:
                async for chunk in process.stdout:
                    lines = (buffer + chunk).split(b"\n")
                    buffer = lines.pop()
                    for line in lines:
                        if line.strip():
                            await read_in.send(reader.read(line))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            server.eof = True

    async def stderr_reader() -> None:
        assert process.stderr is not None
        buffer = b""
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async for chunk in process.stderr:
                lines = (buffer + chunk).split(b"\n")
                buffer = lines.pop()
                for line in lines:
                    text = line.decode("utf-8", "replace")
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
