"""The HTTP machinery the scripted provider servers share (``openai_server``,
``anthropic_server``, ``gemini_server``): a threaded server on 127.0.0.1 that answers each POST
with the next scripted :class:`Reply` and records the request.

A reply is sent whole (``respond``), cut in half (``drop``), held back (``hang``), or streamed
(``stream``) as server-sent events, one HTTP chunk per event, the way the providers send them
(``Transfer-Encoding: chunked``). A stream ends as its ``end`` says: ``complete`` (the last chunk
of the body is sent: a clean end, whatever the events said), ``drop`` (the socket closes without
it, as when a connection breaks mid-stream: the client sees an incomplete body), or ``stall``
(nothing more until the client goes away or the server stops). Each provider's module builds
its recorded event shapes; :func:`cut` and :func:`then` reshape any streamed reply.

A request held by ``hang`` or ``stall`` notices when the client closes the connection and sets
its :attr:`Received.disconnected`. ``stop()`` releases every held request and joins every
handler thread, so nothing outlives the test.
"""

from __future__ import annotations

import json
import select
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Literal, Self

__all__ = [
    "SSE_HEADERS",
    "Received",
    "Reply",
    "ScriptedServer",
    "cut",
    "hang",
    "json_reply",
    "pieces",
    "sse",
    "then",
]

SSE_HEADERS: tuple[tuple[str, str], ...] = (
    ("Content-Type", "text/event-stream; charset=utf-8"),
    ("Cache-Control", "no-cache"),
)

_POLL_S = 0.01


@dataclass(frozen=True)
class Reply:
    """One scripted response.

    ``mode``: ``respond`` sends ``status``/``headers``/``body`` whole; ``drop`` sends the
    headers (announcing the full length) and half the body, then closes the socket; ``hang``
    sends nothing until the client goes away or the server stops (for timeouts and
    cancellation); ``stream`` sends ``events`` one chunk each, then ends as ``end`` says (see
    the module docstring).
    """

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    mode: Literal["respond", "drop", "hang", "stream"] = "respond"
    events: tuple[bytes, ...] = field(default=(), kw_only=True)
    end: Literal["complete", "drop", "stall"] = field(default="complete", kw_only=True)


@dataclass(frozen=True)
class Received:
    """One request as the server saw it (header names in lowercase). ``disconnected`` is set
    when the client closed the connection while the server held the request (``hang``, or a
    ``stall`` stream)."""

    path: str
    headers: dict[str, str]
    body: Any
    disconnected: threading.Event = field(default_factory=threading.Event, compare=False)


def json_reply(
    status: int,
    obj: Any,
    headers: tuple[tuple[str, str], ...] = (),
    *,
    content_type: str = "application/json",
) -> Reply:
    """``obj`` as a JSON response with ``status``, ``content_type`` and then ``headers``."""
    return Reply(
        status=status,
        body=json.dumps(obj).encode(),
        headers=(("Content-Type", content_type), *headers),
    )


def hang() -> Reply:
    """No response until the client goes away or the server stops."""
    return Reply(mode="hang")


def sse(data: Any, event: str | None = None, *, newline: str = "\n") -> bytes:
    """One server-sent event: an ``event:`` line when given, ``data:`` with ``data`` as
    compact JSON (a str is sent as given), and the blank line that ends the event."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    lines = ([f"event: {event}"] if event is not None else []) + [f"data: {text}", "", ""]
    return newline.join(lines).encode()


def pieces(text: str, size: int = 4) -> list[str]:
    """``text`` in pieces of ``size`` characters, the way a model streams it (none for "")."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def cut(reply: Reply, after: int, end: Literal["complete", "drop", "stall"] = "drop") -> Reply:
    """A streamed ``reply`` that stops after its first ``after`` events and then ends as
    ``end`` says: ``drop`` (the connection breaks), ``complete`` (the server ends the body
    cleanly, without the rest) or ``stall`` (it goes silent)."""
    assert reply.mode == "stream" and 0 <= after < len(reply.events), "cut a stream short"
    return Reply(
        reply.status, reply.body, reply.headers, "stream", events=reply.events[:after], end=end
    )


def then(reply: Reply, after: int, *events: bytes) -> Reply:
    """A streamed ``reply`` whose first ``after`` events are followed by ``events`` (such as
    an error event) and a clean end."""
    assert reply.mode == "stream" and 0 <= after <= len(reply.events), "extend a stream"
    return Reply(
        reply.status, reply.body, reply.headers, "stream", events=reply.events[:after] + events
    )


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        fake = self.server.fake
        headers = {name.lower(): value for name, value in self.headers.items()}
        received = Received(self.path, headers, body)
        reply = fake._take(received)
        self.close_connection = True
        if reply.mode == "hang":
            self._hold(received)
            return
        self.send_response(reply.status)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.mode == "stream":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("Connection", "close")
        self.end_headers()
        if reply.mode == "stream":
            self._stream(reply, received)
        elif reply.mode == "drop":
            self.wfile.write(reply.body[: len(reply.body) // 2])
            self.wfile.flush()
            self.connection.close()
        else:
            self.wfile.write(reply.body)

    def _stream(self, reply: Reply, received: Received) -> None:
        try:
            for event in reply.events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
        except OSError:  # the client went away mid-stream
            received.disconnected.set()
            return
        if reply.end == "complete":
            self.wfile.write(b"0\r\n\r\n")
        elif reply.end == "drop":
            self.connection.close()
        else:
            self._hold(received)

    def _hold(self, received: Received) -> None:
        """Wait, sending nothing, until the client closes the connection or the server
        stops."""
        stopping = self.server.fake._stopping
        while not stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], _POLL_S)
            if not readable:
                continue
            try:
                data = self.connection.recv(4096)
            except OSError:
                data = b""
            if not data:
                received.disconnected.set()
                return


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads: a clean shutdown
    block_on_close = True
    fake: ScriptedServer


@dataclass
class ScriptedServer:
    """The server. ``url`` is the base URL to give the SDK: the root plus :attr:`ROOT`."""

    ROOT: ClassVar[str] = ""
    requests: list[Received] = field(default_factory=list)
    _script: deque[Reply] = field(default_factory=deque)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _server: _Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}{self.ROOT}"

    def script(self, *replies: Reply) -> None:
        """Queue replies, served one per request in order."""
        with self._lock:
            self._script.extend(replies)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def exhausted(self) -> Reply:
        """The answer to a request with nothing left in the script (a 500 saying so)."""
        return Reply(500, b'{"error": "fake server: the script is exhausted"}')

    def _take(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            if self._script:
                return self._script.popleft()
        return self.exhausted()

    def start(self) -> Self:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": _POLL_S}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
