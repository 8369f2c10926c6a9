"""The viewer as a WSGI application (standard library only), and the server that runs it."""

from __future__ import annotations

import json
import os
import re
import socketserver
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from polyloop import PolyLoopError

from . import _pages, _runs_pages
from ._data import ReadableJournal, Runner, Source
from ._filters import BadQuery, parse_query, select
from ._html import asset

StartResponse = Callable[..., Any]

STATS_MAX_RUNS = 200
"""The stats page reads the step times of at most this many (most recent) selected runs."""

_STEP_FIELD = re.compile(r"^/runs/(?P<run>.+)/steps/(?P<idx>\d+)/(?P<field>[a-z_]+)$")
_FIELDS = ("observation", "text", "raw_response", "reasoning", "action")
_CSP = (
    "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


class _Response(Exception):
    """A finished response raised from inside a handler (errors, mostly)."""

    def __init__(self, status: str, body: str, content_type: str = "text/html") -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.content_type = content_type


def _not_found(message: str) -> _Response:
    return _Response("404 Not Found", _pages.error_page("Not found", message))


class ViewerApp:
    """The viewer: a WSGI callable over one journal. Read-only: it never writes the journal.

    Pages: ``/`` (runs list), ``/runs/<id>`` (run page), ``/stats``; JSON for live updates:
    ``/api/runs`` and ``/api/runs/<id>``; full texts: ``/runs/<id>/steps/<n>/<field>``.

    Args:
        journal: an object with the journal read API (``list_runs`` with its ``run_id``
            keyword, ``steps``, ``read``; see ``ReadableJournal``).
        allowed_hosts: when given, requests whose ``Host`` header names another host are
            refused (protects a local server from DNS rebinding). None: no check.
        owns_journal: close the journal with the app.
    """

    def __init__(
        self,
        journal: ReadableJournal,
        *,
        allowed_hosts: Iterable[str] | None = None,
        owns_journal: bool = False,
    ) -> None:
        self.source = Source(journal)
        self._runner = Runner()
        self._allowed = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self._owns = owns_journal
        self._closed = False

    def close(self) -> None:
        """Stop the app's event loop thread (and close the journal it opened). Idempotent."""
        if self._closed:
            return
        self._closed = True
        journal = self.source.journal
        if self._owns and hasattr(journal, "aclose"):
            self._runner.call(journal.aclose())
        self._runner.close()

    def __enter__(self) -> ViewerApp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- WSGI ---------------------------------------------------------------------------------
    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        try:
            status, ctype, body = self._handle(environ)
        except _Response as r:
            status, ctype, body = r.status, r.content_type, r.body
        except (PolyLoopError, OSError) as exc:
            status, ctype = "500 Internal Server Error", "text/html"
            body = _pages.error_page(
                "The journal could not be read", f"{type(exc).__name__}: {exc}"
            )
        data = body.encode("utf-8")
        headers = [
            ("Content-Type", f"{ctype}; charset=utf-8"),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"),
            ("Content-Security-Policy", _CSP),
        ]
        start_response(status, headers)
        return [b""] if environ.get("REQUEST_METHOD") == "HEAD" else [data]

    def _handle(self, environ: dict[str, Any]) -> tuple[str, str, str]:
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            raise _Response(
                "405 Method Not Allowed",
                _pages.error_page("Method not allowed", "The viewer is read-only."),
            )
        if self._allowed is not None:
            host = (environ.get("HTTP_HOST") or "").lower()
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if host not in self._allowed and name not in self._allowed:
                raise _Response(
                    "403 Forbidden",
                    _pages.error_page("Forbidden", f"unexpected Host header {host!r}"),
                )
        raw = environ.get("PATH_INFO") or "/"
        try:  # WSGI hands the path over as latin-1 decoded bytes
            path = raw.encode("latin-1").decode("utf-8")
        except UnicodeError:
            path = raw
        params = parse_qs(environ.get("QUERY_STRING") or "", keep_blank_values=False)
        now = time.time()
        if path == "/":
            return self._runs(params, now)
        if path == "/stats":
            return self._stats(params)
        if path == "/api/runs":
            return self._runs_api(params, now)
        if path.startswith("/api/runs/"):
            return self._run_api(path[len("/api/runs/") :])
        if path.startswith("/static/"):
            return self._static(path[len("/static/") :])
        if path == "/favicon.ico":
            raise _Response("204 No Content", "", "text/plain")
        match = _STEP_FIELD.match(path)
        if match:
            return self._field(match["run"], int(match["idx"]), match["field"])
        if path.startswith("/runs/") and len(path) > len("/runs/"):
            return self._run(path[len("/runs/") :], params, now)
        raise _not_found(f"no page at {path}")

    # -- pages --------------------------------------------------------------------------------
    def _query(self, params: dict[str, list[str]]) -> Any:
        try:
            return parse_query(params)
        except BadQuery as exc:
            raise _Response("400 Bad Request", _pages.error_page("Bad request", str(exc))) from None

    def _runs(self, params: dict[str, list[str]], now: float) -> tuple[str, str, str]:
        query = self._query(params)
        everything = self._runner.call(self.source.runs())
        selected = select(everything, query, now)
        return "200 OK", "text/html", _runs_pages.runs_page(selected, everything, query, now)

    def _runs_api(self, params: dict[str, list[str]], now: float) -> tuple[str, str, str]:
        try:
            query = parse_query(params)
        except BadQuery as exc:
            raise _Response(
                "400 Bad Request", json.dumps({"error": str(exc)}), "application/json"
            ) from None
        everything = self._runner.call(self.source.runs())
        selected = select(everything, query, now)
        return (
            "200 OK",
            "application/json",
            json.dumps(_runs_pages.runs_api(selected, everything, query, now)),
        )

    def _run_api(self, run_id: str) -> tuple[str, str, str]:
        run = self._runner.call(self.source.run(run_id))
        if run is None:
            raise _Response(
                "404 Not Found", json.dumps({"error": f"no run {run_id!r}"}), "application/json"
            )
        body = {
            "run_id": run.run_id,
            "state": run.state,
            "stop_reason": run.stop_reason,
            "steps_used": run.steps_used,
            "actions_executed": run.actions_executed,
            "token": _pages.token_text(run),
        }
        return "200 OK", "application/json", json.dumps(body)

    def _run(self, run_id: str, params: dict[str, list[str]], now: float) -> tuple[str, str, str]:
        run = self._runner.call(self.source.run(run_id))
        if run is None:
            raise _not_found(f"no run {run_id!r} in this journal")
        page_no = _int_param(params, "page", 1, 1, 10**9)
        per = _int_param(params, "per", _pages.STEPS_PER_PAGE, 1, _pages.MAX_STEPS_PER_PAGE)
        detail = self._runner.call(self.source.detail(run))
        html = _pages.run_page(detail, page_no=page_no, per_page=per, now=now)
        return "200 OK", "text/html", html

    def _field(self, run_id: str, step_idx: int, field: str) -> tuple[str, str, str]:
        if field not in _FIELDS:
            raise _not_found(f"no field {field!r}: use one of {', '.join(_FIELDS)}")
        run = self._runner.call(self.source.run(run_id))
        if run is None:
            raise _not_found(f"no run {run_id!r} in this journal")
        detail = self._runner.call(self.source.detail(run))
        view = next((v for v in detail.steps if v.step.step_idx == step_idx), None)
        if view is None:
            raise _not_found(f"run {run_id!r} has no step {step_idx}")
        s = view.step
        texts = {
            "observation": s.observation,
            "text": view.text,
            "raw_response": s.raw_response,
            "reasoning": view.reasoning,
            "action": s.tool_args_json if s.tool_args_json is not None else s.action,
        }
        text = texts[field]
        if text is None:
            raise _not_found(f"step {step_idx} of run {run_id!r} has no {field}")
        hidden = view.hidden_tail if field == "observation" else 0
        return "200 OK", "text/html", _pages.full_text_page(run_id, step_idx, field, text, hidden)

    def _stats(self, params: dict[str, list[str]]) -> tuple[str, str, str]:
        query = self._query(params)
        now = time.time()
        everything = self._runner.call(self.source.runs())
        selected = select(everything, query, now)
        recent = sorted(selected, key=lambda r: r.created_at, reverse=True)[:STATS_MAX_RUNS]
        walls = self._runner.call(self.source.step_walls(recent))
        html = _runs_pages.stats_page(selected, everything, query, walls, len(recent))
        return "200 OK", "text/html", html

    def _static(self, name: str) -> tuple[str, str, str]:
        types = {"viewer.css": "text/css", "viewer.js": "text/javascript"}
        if name not in types:
            raise _not_found(f"no static file {name!r}")
        return "200 OK", types[name], asset(name)


def _int_param(params: dict[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    values = params.get(name)
    if not values:
        return default
    text = values[-1].strip()
    if not text.isdigit():
        raise _Response(
            "400 Bad Request",
            _pages.error_page("Bad request", f"{name} must be a number, got {text!r}"),
        )
    return min(max(int(text), lo), hi)


def make_app(
    journal: str | os.PathLike[str] | ReadableJournal,
    *,
    allowed_hosts: Iterable[str] | None = None,
) -> ViewerApp:
    """The viewer over ``journal``: a SQLite journal file's path, or a journal object with
    the read API (``list_runs(run_id=...)``, ``steps``, ``read``). Test it without a network
    by calling it as a WSGI application; close it with ``app.close()``. A path is opened
    read-only (``SQLiteJournal(path, read_only=True)``): the viewer never writes a journal.

    Raises:
        FileNotFoundError: no file at the path (the viewer never creates a journal).
        JournalError: the file is not a PolyLoop journal this version can read.
    """
    if isinstance(journal, str | os.PathLike):
        path = Path(journal)
        if not path.is_file():
            raise FileNotFoundError(f"no journal at {path}")
        from polyloop.journal import SQLiteJournal

        return ViewerApp(
            SQLiteJournal(path, read_only=True), allowed_hosts=allowed_hosts, owns_journal=True
        )
    return ViewerApp(journal, allowed_hosts=allowed_hosts)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("POLYLOOP_VIEW_LOG"):
            super().log_message(format, *args)


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


def local_hosts(host: str, port: int) -> list[str]:
    """The Host header values a local viewer answers to."""
    names = {host, "localhost", "127.0.0.1", "[::1]"}
    return [*names, *(f"{n}:{port}" for n in names)]


class Server:
    """A running viewer: ``url``, ``serve_forever()``, ``close()``."""

    def __init__(self, app: ViewerApp, host: str, port: int) -> None:
        self.app = app
        self._server = make_server(
            host, port, app, server_class=_ThreadingServer, handler_class=_Quiet
        )
        self.host = host
        self.port = int(self._server.server_address[1])
        if app._allowed is not None:
            app._allowed |= {h.lower() for h in local_hosts(host, self.port)}

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def serve_forever(self) -> None:
        self._server.serve_forever(poll_interval=0.2)

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (from another thread)."""
        self._server.shutdown()

    def close(self) -> None:
        self._server.server_close()
        self.app.close()


def serve(journal: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8765) -> Server:
    """A viewer server bound to ``host:port`` (port 0: any free port), not yet serving.
    Bound to a loopback address it answers only to local host names.

    Raises:
        FileNotFoundError, JournalError: see :func:`make_app`.
        OSError: the address cannot be bound (in use, not local, ...).
    """
    loopback = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
    app = make_app(journal, allowed_hosts=[] if loopback else None)
    try:
        return Server(app, host, port)
    except BaseException:
        app.close()
        raise
