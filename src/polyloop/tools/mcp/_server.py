"""``MCPServer``: one connection to an MCP server, over stdio or Streamable HTTP, whose tools
join a :class:`~polyloop.tools.ToolRegistry`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import mcp_types
import pydantic
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from polyloop.types import (
    ActionStatus,
    ConfigError,
    EnvironmentFailure,
    Outcome,
    PolyLoopError,
    ReplayPolicy,
    ToolContext,
    check_number,
)

from .._deadline import within
from .._output import DEFAULT_MAX_OUTPUT_CHARS, check_max_output_chars
from .._threads import in_thread
from ..registry import ReconcileHook, Tool, ToolRegistry
from ._answers import refused
from ._failures import Unreachable, failed, find, reason
from ._lines import DEFAULT_MAX_LINE_BYTES, check_max_line_bytes
from ._ops import Tracking, op_of_message, request_meta
from ._results import result_outcome, write_stored
from ._stdio import StdioProcess, stdio_transport
from ._texts import DEFAULT_MCP_TEXTS, MCPTexts
from ._tools import MCPTool, listed_tool, register_listed

# JSON-RPC errors that say the server did not run the call (it could not parse or route it).
_NOT_RUN_CODES = frozenset({-32700, -32600, -32601, -32602})
_CLIENT_INFO = mcp_types.Implementation(name="polyloop", version="0.1.0")
_CLOSE_TIMEOUT_S = 10.0


class MCPServerError(PolyLoopError):
    """An MCP server could not be started, connected to, or listed (its message names the
    server and the reason, with the server's last stderr line for a stdio server)."""


@dataclass(eq=False)
class _Connection:
    task: asyncio.Task[None] | None = None
    session: ClientSession | None = None
    process: StdioProcess | None = None
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    broken: bool = False
    server_name: str | None = None

    @property
    def alive(self) -> bool:
        if self.broken or self.session is None:
            return False
        return self.process is None or self.process.alive


class _NotSent(Exception):
    """The connection could not be made again: a call did not reach the server."""


class MCPServer:
    """One MCP server: started (stdio) or connected to (Streamable HTTP) by :meth:`connect`
    or ``async with``, its tools registered on a ``ToolRegistry`` by :meth:`register`.

    Make one with :meth:`stdio`, :meth:`http` or :meth:`from_spec`. A call:

    * carries the action's ``op_id`` (the same on a replay after a crash) in
      ``params._meta["polyloop/op_id"]`` (:data:`OP_ID_META_KEY`);
    * returns the server's result as the observation (see ``result_outcome``); ``isError``
      is an executed failure the model sees;
    * finds a stdio server that died since the last call and starts it again, once: if that
      start fails, the step is ``env_error`` (the run stops). An HTTP connection that broke
      is made again the same way; if the server cannot be reached, the call was never sent:
      ``not_executed``;
    * whose answer cannot be read (a stdio line over ``max_line_bytes`` too) or is refused by
      the SDK (not a tool result; no valid ``structuredContent`` from a tool with an output
      schema) is an **executed** failure at once: "its answer was malformed (why)";
    * that is lost — the server exits or the connection breaks after the request was written
      to it, or no answer comes within ``timeout_s`` — is an **executed** failure: side effects
      may have happened. A request is *sent* once its first byte is written to the server's
      stdin, or once its HTTP connection is open; before that, it is ``not_executed``;
    * cancelled (a cancelled run, once its grace period is over) sends MCP
      ``notifications/cancelled`` for the request and stops waiting.

    :meth:`aclose` stops a stdio server by its pid: stdin closed, then SIGTERM to its process
    group after 2 s, then SIGKILL after 2 more. If PolyLoop itself is killed, the server sees
    its stdin close (most servers then exit), and on Linux it gets SIGKILL as well (also one
    that ignores its stdin; see ``_stdio.server_command``).

    Args:
        argv: the stdio server's command line (one of ``argv`` / ``url``).
        url: the Streamable HTTP endpoint.
        headers: HTTP headers for every request (authentication); ``${VAR}`` in a value is
            replaced by that environment variable when connecting (so the secret need not be
            stored where the spec is, e.g. in a run's metadata).
        env: the stdio server's environment (default: PolyLoop's own).
        cwd: the stdio server's working folder (default: PolyLoop's).
        timeout_s: how long one call may wait for its answer (None: no limit).
        connect_timeout_s: how long starting, connecting and listing may take.
        store_dir: where images, audio and binary resources in results are saved (by content
            hash); None keeps only their summary line.
        max_output_chars: the most characters of one answer the observation keeps (an int
            >= 100; default 20,000, as the workspace tools): of a longer one, the first and
            the last half, with ``texts.omitted`` between them, and the characters cut in
            ``Outcome.truncated_chars`` (so in the step's ``observation_truncated_chars``).
            None: no cap, the journal keeps every character (three times: in the action's
            result record, the step record and ``steps.observation``).
        max_line_bytes: the longest line read whole from a stdio server, in bytes (an int >=
            65,536; default 64 MiB). A longer one is dropped as it arrives, but for its first
            and last 4 KiB: the call its ``id`` names fails at once as a malformed answer
            (executed). Not used by HTTP servers.
        texts: the wording of PolyLoop's own observations about calls.
    """

    def __init__(
        self,
        *,
        argv: Sequence[str] | None = None,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        timeout_s: float | None = 120.0,
        connect_timeout_s: float = 30.0,
        store_dir: str | Path | None = None,
        max_output_chars: int | None = DEFAULT_MAX_OUTPUT_CHARS,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        texts: MCPTexts = DEFAULT_MCP_TEXTS,
    ) -> None:
        if (argv is None) == (url is None):
            raise ConfigError("MCPServer needs exactly one of argv= (stdio) or url= (HTTP)")
        if argv is not None and (not argv or not all(isinstance(a, str) for a in argv)):
            raise ConfigError(f"MCPServer argv must be a non-empty list of strings, got {argv!r}")
        if url is not None and not re.match(r"^https?://", url):
            raise ConfigError(f"MCPServer url must start with http:// or https://, got {url!r}")
        check_number(
            "MCPServer timeout_s", timeout_s, above=True, none="no limit", unit=" of seconds"
        )
        check_number(
            "MCPServer connect_timeout_s", connect_timeout_s, above=True, unit=" of seconds"
        )
        check_max_output_chars("MCPServer", max_output_chars, optional=True)
        check_max_line_bytes("MCPServer", max_line_bytes)
        self.kind: Literal["stdio", "http"] = "stdio" if argv is not None else "http"
        self.argv = tuple(argv) if argv is not None else None
        self.url = url
        self._headers = dict(headers or {})
        self._env = dict(env) if env is not None else None
        self._cwd = str(cwd) if cwd is not None else None
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._store_dir = Path(store_dir) if store_dir is not None else None
        self.max_output_chars = max_output_chars
        self.max_line_bytes = max_line_bytes
        self.texts = texts
        self._conn: _Connection | None = None
        self._lock = asyncio.Lock()
        self._sent: set[str] = set()
        self._closed = False

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def stdio(cls, command: str | Sequence[str], **options: Any) -> MCPServer:
        """A server PolyLoop starts: ``command`` is a command line (split as a shell would,
        without running a shell) or an argv list. ``options`` as for the constructor."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        return cls(argv=argv, **options)

    @classmethod
    def http(cls, url: str, **options: Any) -> MCPServer:
        """A server at a Streamable HTTP ``url``. ``options`` as for the constructor."""
        return cls(url=url, **options)

    @classmethod
    def from_spec(cls, spec: str, **options: Any) -> MCPServer:
        """``https://…`` or ``http://…`` is an HTTP server, anything else a stdio command
        line (what ``polyloop run --mcp`` takes)."""
        if re.match(r"^https?://", spec.strip()):
            return cls.http(spec.strip(), **options)
        try:
            argv = shlex.split(spec)
        except ValueError as exc:
            raise ConfigError(f"cannot split the MCP command line {spec!r}: {exc}") from None
        if not argv:
            raise ConfigError("an MCP server spec must be a command line or an http(s) URL")
        return cls(argv=argv, **options)

    @property
    def spec(self) -> str:
        """The command line (shell-quoted) or the URL: what :meth:`from_spec` takes back."""
        if self.argv is None:
            assert self.url is not None
            return self.url
        return shlex.join(self.argv)

    @property
    def pid(self) -> int | None:
        """The stdio server's process id while it runs; None otherwise (and for HTTP)."""
        conn = self._conn
        if conn is None or conn.process is None:
            return None
        return conn.process.pid

    @property
    def server_name(self) -> str | None:
        """The name the server gave itself (``serverInfo.name``) once connected."""
        return self._conn.server_name if self._conn is not None else None

    def __repr__(self) -> str:
        return f"MCPServer({self.kind}: {self.spec})"

    # --- lifecycle --------------------------------------------------------------------------

    async def connect(self) -> None:
        """Start (stdio) or connect to (HTTP) the server and initialise the MCP session.
        Idempotent while connected.

        Raises:
            MCPServerError: it cannot be started or reached, or it did not answer the
                initialisation within ``connect_timeout_s``; nothing is left running then.
        """
        async with self._lock:
            if self._closed:
                raise MCPServerError(f"{self!r} is closed; make a new one")
            if self._conn is None or not self._conn.alive:
                await self._reconnect()

    async def aclose(self) -> None:
        """Close the session and stop a stdio server (by its pid; see the class). Idempotent."""
        self._closed = True
        async with self._lock:
            await self._drop()

    async def __aenter__(self) -> MCPServer:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # --- tools ------------------------------------------------------------------------------

    async def list_tools(self) -> tuple[MCPTool, ...]:
        """The tools the server offers now (all pages), with their derived replay policies.

        Raises:
            MCPServerError: not connected, or the listing failed.
        """
        session = await self._session()
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        try:
            with anyio.fail_after(self.connect_timeout_s):
                while True:
                    params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
                    page = await session.list_tools(params=params)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except (MCPError, TimeoutError, anyio.BrokenResourceError, anyio.ClosedResourceError) as e:
            raise MCPServerError(f"{self!r}: listing its tools failed: {reason(e)}") from None
        return tuple(listed_tool(t) for t in tools)

    async def register(
        self,
        registry: ToolRegistry,
        *,
        prefix: str = "",
        include: Sequence[str] | None = None,
        replay: Mapping[str, str | ReplayPolicy] | None = None,
        reconcile: Mapping[str, ReconcileHook] | None = None,
        completion_markers: Sequence[str] = (),
        on_skipped: Callable[[str, str], object] | None = None,
        approval: Collection[str] = (),
    ) -> tuple[Tool, ...]:
        """List the server's tools and register them on ``registry`` (connecting first if
        needed), beside whatever is registered there. Each is named ``prefix + its name``,
        with the server's JSON schema as given (arguments are validated against it before any
        call), and the replay policy :func:`replay_from_annotations` derives, unless
        ``replay`` names it (``{"git_reset": "never"}``), or ``reconcile`` gives it a hook.
        Every call of a tool ``approval`` names waits for a person's decision (the run parks,
        as for a Python tool declared with ``approval=True``; :func:`approval_from_annotations`
        picks the tools whose annotations do not say read-only). Keys of ``include``,
        ``replay``, ``reconcile``, ``completion_markers`` and ``approval`` are the server's
        names (without the prefix).

        A tool whose name (with the prefix) is not ``^[a-zA-Z0-9_-]{1,64}$``, which model APIs
        refuse, cannot be registered: by default that is an error; with ``on_skipped``, each
        such tool is left out, ``on_skipped(its name, why)`` is called for it (the name is the
        server's, ``why`` one line), and the others are registered.

        All or nothing: on an error, no tool of this server is registered (and ``on_skipped``
        was not called).

        Raises:
            ConfigError: a name is already registered or two tools would get one name (pass
                ``prefix=``), a name is not ``^[a-zA-Z0-9_-]{1,64}$`` and ``on_skipped`` is
                None (leave it out with ``include=``), or a key names no tool of the server.
            MCPServerError: the server cannot be reached or listed.
        """
        offered = {t.name: t for t in await self.list_tools()}
        registered = register_listed(
            registry,
            offered,
            server=repr(self),
            origin=f"MCP server {self.spec}",
            call=self._call_tool,
            prefix=prefix,
            include=include,
            replay=replay,
            reconcile=reconcile,
            completion_markers=completion_markers,
            on_skipped=on_skipped,
            approval=approval,
        )
        registry.add_wording_version(self.texts.version)
        return registered

    async def call_tool(self, name: str, arguments: Mapping[str, Any], ctx: ToolContext) -> Outcome:
        """Call the server's tool ``name`` (its own name) with ``arguments`` (not validated
        here) as the action of ``ctx``; what the registered tools do. See the class for what
        each failure becomes.

        Raises:
            EnvironmentFailure: a stdio server that died could not be started again.
            asyncio.CancelledError: the call was cancelled (``notifications/cancelled`` sent).
        """
        return await self._call_tool(name, arguments, ctx)

    # --- internals --------------------------------------------------------------------------

    async def _call_tool(
        self, name: str, arguments: Mapping[str, Any], ctx: ToolContext
    ) -> Outcome:
        op_id = ctx.op_id
        try:
            session = await self._live()
        except _NotSent as exc:
            text = self.texts.not_sent.format(tool=name, server=self.spec, reason=exc)
            return Outcome(ActionStatus.not_executed, text, synthetic=True)
        self._sent.discard(op_id)
        timeout = within(self.timeout_s, ctx.timeout_s)  # the run's time budget, if smaller
        try:
            result = await session.call_tool(
                name, dict(arguments), read_timeout_seconds=timeout, meta=request_meta(op_id)
            )
        except MCPError as exc:
            return self._error_outcome(name, exc, op_id in self._sent, timeout)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            return self._lost(name, reason(exc), sent=op_id in self._sent)
        except (RuntimeError, pydantic.ValidationError) as exc:  # the SDK refused the result
            return self._error_outcome(name, refused(exc), op_id in self._sent, None)
        finally:
            self._sent.discard(op_id)
        store = self._store if self._store_dir is not None else None
        return await result_outcome(
            result,
            tool=name,
            store=store,
            empty_error=self.texts.empty_error,
            max_chars=self.max_output_chars,
            omitted=self.texts.omitted,
        )

    def _error_outcome(self, name: str, exc: MCPError, sent: bool, limit: float | None) -> Outcome:
        code = exc.error.code
        if code == mcp_types.REQUEST_TIMEOUT:
            timeout = limit or 0.0
            text = self.texts.timed_out.format(tool=name, server=self.spec, timeout_s=timeout)
            return failed(text, "MCPTimeout", text)
        if code == mcp_types.CONNECTION_CLOSED:
            self._mark_broken()
            return self._lost(name, self._gone_reason(), sent=sent)
        message = exc.error.message
        if code in _NOT_RUN_CODES:
            text = self.texts.refused.format(tool=name, server=self.spec, message=message)
            return Outcome(ActionStatus.not_executed, text, synthetic=True)
        text = self.texts.failed.format(tool=name, server=self.spec, message=message)
        return failed(text, "MCPError", message)

    def _lost(self, name: str, reason: str, *, sent: bool) -> Outcome:
        if not sent:
            text = self.texts.not_sent.format(tool=name, server=self.spec, reason=reason)
            return Outcome(ActionStatus.not_executed, text, synthetic=True)
        text = self.texts.lost.format(tool=name, server=self.spec, reason=reason)
        return failed(text, "MCPConnectionLost", reason)

    def _gone_reason(self) -> str:
        conn = self._conn
        if conn is not None and conn.process is not None:
            return f"the server process exited ({conn.process.last_words()})"
        return "the connection closed"

    def _mark_broken(self) -> None:
        if self._conn is not None:
            self._conn.broken = True

    async def _store(self, raw: bytes, mime: str | None) -> Path:
        assert self._store_dir is not None
        path: Path = await in_thread(write_stored, self._store_dir, raw, mime)
        return path

    async def _session(self) -> ClientSession:
        conn = self._conn
        if conn is None or conn.session is None or not conn.alive:
            await self.connect()
            conn = self._conn
        assert conn is not None and conn.session is not None
        return conn.session

    async def _live(self) -> ClientSession:
        """The session, after starting the server again (once) if it died since the last
        call. Raises EnvironmentFailure (stdio: it cannot be started) or _NotSent (HTTP:
        it cannot be reached)."""
        conn = self._conn
        if conn is not None and conn.alive and conn.session is not None:
            return conn.session
        async with self._lock:
            if self._closed:
                raise EnvironmentFailure(f"{self!r} was closed; its tools cannot be called")
            if self._conn is None or not self._conn.alive:
                try:
                    await self._reconnect()
                except MCPServerError as exc:
                    if self.kind == "http" and isinstance(exc.__cause__, Unreachable):
                        raise _NotSent(str(exc.__cause__)) from None
                    raise EnvironmentFailure(str(exc)) from None
            assert self._conn is not None and self._conn.session is not None
            return self._conn.session

    async def _reconnect(self) -> None:
        await self._drop()
        conn = _Connection()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.task = asyncio.ensure_future(self._serve(conn, ready))
        try:
            await ready
        except BaseException as exc:
            await _finish(conn)
            if isinstance(exc, Exception):
                raise MCPServerError(self._start_failure(conn, exc)) from exc
            raise
        self._conn = conn

    def _start_failure(self, conn: _Connection, exc: BaseException) -> str:
        verb = "start" if self.kind == "stdio" else "connect to"
        why = reason(exc)
        if conn.process is not None:
            why += f"; its last words: {conn.process.last_words()}"
        return f"cannot {verb} the MCP server {self.spec}: {why}"

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await _finish(conn)

    async def _serve(self, conn: _Connection, ready: asyncio.Future[None]) -> None:
        """The connection's own task: it enters the transport and the session (anyio scopes
        must be left by the task that entered them), and holds them until ``conn.closing``."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams: tuple[Any, Any]
                if self.argv is not None:
                    streams, conn.process = await stack.enter_async_context(
                        stdio_transport(
                            self.argv,
                            env=self._env,
                            cwd=self._cwd,
                            on_write=self._on_write,
                            max_line_bytes=self.max_line_bytes,
                        )
                    )
                else:
                    assert self.url is not None
                    client = httpx2.AsyncClient(
                        headers=_expand(self._headers),
                        timeout=httpx2.Timeout(30.0, read=300.0),
                        transport=Tracking(httpx2.AsyncHTTPTransport(), self._sent),
                    )
                    await stack.enter_async_context(client)
                    streams = await stack.enter_async_context(
                        streamable_http_client(self.url, http_client=client)
                    )
                session = await stack.enter_async_context(
                    ClientSession(streams[0], streams[1], client_info=_CLIENT_INFO)
                )
                with anyio.fail_after(self.connect_timeout_s):
                    init = await session.initialize()
                conn.session = session
                conn.server_name = init.server_info.name
                ready.set_result(None)
                await conn.closing.wait()
        except BaseException as exc:
            if not ready.done():
                connect = find(exc, (httpx2.ConnectError, httpx2.ConnectTimeout))
                if connect is not None:
                    ready.set_exception(Unreachable(reason(connect)))
                elif isinstance(exc, Exception):
                    ready.set_exception(exc)
                else:
                    ready.set_exception(RuntimeError(reason(exc)))
            if not isinstance(exc, Exception):
                raise
        finally:
            conn.broken = True

    def _on_write(self, message: Any, sent: bool) -> None:
        """Mark a ``tools/call`` request as sent (its bytes go to the server now), or not
        (writing them failed)."""
        op = op_of_message(message)
        if op is not None:
            if sent:
                self._sent.add(op)
            else:
                self._sent.discard(op)


async def _finish(conn: _Connection) -> None:
    conn.closing.set()
    task = conn.task
    if task is None:
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), _CLOSE_TIMEOUT_S)
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    elif not task.cancelled():
        task.exception()  # retrieved: its failure was reported through `ready`


def _expand(headers: Mapping[str, str]) -> dict[str, str]:
    """``${VAR}`` / ``$VAR`` in header values from the environment.

    Raises:
        MCPServerError: a variable is not set.
    """
    out = {}
    for key, value in headers.items():
        try:
            out[key] = string.Template(value).substitute(os.environ)
        except (KeyError, ValueError) as exc:
            raise MCPServerError(
                f"the MCP header {key!r} names the environment variable {exc}, which is not set"
            ) from None
    return out
