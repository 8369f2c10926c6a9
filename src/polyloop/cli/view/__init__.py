"""The run viewer: a local web app over a journal, and self-contained run reports.

* :func:`make_app` — the viewer as a WSGI application (standard library only; no framework,
  nothing built at install time). Pages are rendered on the server; one small bundled script
  adds live updates and expand/collapse. Test it by calling it, no network needed.
* :func:`serve` — the viewer on ``127.0.0.1:PORT`` (``polyloop view``).
* :func:`build_report` — one run as one HTML file to share (``polyloop report``): safe data
  only unless content is opted in, and then scrubbed (:mod:`polyloop.observe.redact`).

The viewer itself is the owner's: it shows every run's content in full.
"""

from __future__ import annotations

from ._app import Server, ViewerApp, make_app, serve
from ._report import build_report

__all__ = ["Server", "ViewerApp", "build_report", "make_app", "serve"]
