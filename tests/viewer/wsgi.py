"""Calling the viewer as a WSGI application, without a network."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit
from wsgiref.util import setup_testing_defaults

from polyloop.cli.view import ViewerApp


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


def get(app: ViewerApp, url: str, *, method: str = "GET", host: str | None = None) -> Response:
    parts = urlsplit(url)
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ["REQUEST_METHOD"] = method
    environ["PATH_INFO"] = unquote(parts.path, encoding="latin-1")  # as wsgiref does
    environ["QUERY_STRING"] = parts.query
    if host is not None:
        environ["HTTP_HOST"] = host
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(app(environ, start_response))
    return Response(int(seen["status"].split()[0]), seen["headers"], body.decode("utf-8"))
