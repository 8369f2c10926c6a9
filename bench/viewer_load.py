"""How long the viewer takes to show a long run: a 2,000-step run page, measured, not asserted.

    python bench/viewer_load.py [--steps 2000] [--obs-chars 1000] [--big-every 500]
                                [--big-chars 2000000] [--repeat 5] [--journal PATH]

Builds a journal with one run of ``--steps`` steps made by a real ``polyloop.Loop`` (a scripted
model calling a tool whose observations are ``--obs-chars`` long, and ``--big-chars`` long on
every ``--big-every``-th step), then times:

* the WSGI app in-process: the first (cold: the run is read from the journal) and later
  (warm: an ended run is cached) loads of the first and the last page of the run, one expand
  of a multi-MB observation, and the runs list;
* the same pages over HTTP from the local server (127.0.0.1);
* when Debian's Chromium and Playwright are installed, a browser's navigation to the first and
  the last page (until the ``load`` event) and expanding all 100 steps of a page.

Prints one line per measurement (median of ``--repeat``, and the page size).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from wsgiref.util import setup_testing_defaults

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from polyloop import Limits, Loop, ModelReply, ModelRequest, ToolCall, ToolRegistry
from polyloop.cli.view import make_app, serve
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel

RUN_ID = "long-run"
CHROMIUM = os.environ.get("POLYLOOP_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


async def build(path: Path, steps: int, obs_chars: int, big_every: int, big_chars: int) -> None:
    tools = ToolRegistry()

    @tools.tool
    def read(n: int) -> str:
        """Return n characters of text."""
        line = "the quick brown fox jumps over the lazy dog 0123456789\n"
        return (line * (n // len(line) + 1))[:n]

    def reply(request: ModelRequest) -> ModelReply:
        i = request.step_idx
        if i >= steps - 1:
            return ModelReply(text="done")
        n = big_chars if big_every and i % big_every == big_every - 1 else obs_chars
        return ModelReply(
            text=f"step {i}: reading {n} characters",
            reasoning="a short reasoning " * 5,
            tool_calls=(ToolCall("read", {"n": n}),),
        )

    async with SQLiteJournal(path, durability="normal") as journal:
        loop = Loop(
            FunctionModel(reply),
            tools=tools,
            journal=journal,
            limits=Limits(max_steps=steps + 1, max_observation_chars=500),
        )
        await loop.run(f"a run of {steps} steps", run_id=RUN_ID)


def timed(fn: Callable[[], int], repeat: int) -> tuple[float, float, int]:
    """(first call's seconds, median of the next ``repeat``, bytes)."""
    t = time.perf_counter()
    size = fn()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, statistics.median(times) if times else first, size


def wsgi_get(app: Any, path: str, query: str = "") -> int:
    environ: dict[str, Any] = {}
    setup_testing_defaults(environ)
    environ["PATH_INFO"], environ["QUERY_STRING"] = path, query
    status: list[str] = []
    body = b"".join(app(environ, lambda s, h: status.append(s)))
    assert status[0].startswith("200"), (path, status)
    return len(body)


def report(label: str, first: float, warm: float, size: int) -> None:
    timing = f"first {first * 1000:8.1f} ms   then {warm * 1000:8.1f} ms"
    print(f"{label:<44} {timing}   {size / 1024:9.1f} KiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--obs-chars", type=int, default=1000)
    ap.add_argument("--big-every", type=int, default=500)
    ap.add_argument("--big-chars", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--journal", type=Path, help="reuse (or keep) the journal at this path")
    args = ap.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="polyloop-viewer-bench-"))
    path = args.journal or folder / "journal.db"
    if not path.exists():
        t = time.perf_counter()
        asyncio.run(build(path, args.steps, args.obs_chars, args.big_every, args.big_chars))
        print(
            f"built a {args.steps}-step run in {time.perf_counter() - t:.1f} s "
            f"({path.stat().st_size / 1e6:.1f} MB journal at {path})"
        )
    pages = (args.steps + 99) // 100
    big_step = args.big_every - 1 if args.big_every else 0

    with make_app(path) as app:
        print("\n-- WSGI app, in-process")
        report(
            f"run page 1 of {pages}", *timed(lambda: wsgi_get(app, f"/runs/{RUN_ID}"), args.repeat)
        )
        report(
            f"run page {pages} (last)",
            *timed(lambda: wsgi_get(app, f"/runs/{RUN_ID}", f"page={pages}"), args.repeat),
        )
        report(
            f"full observation of step {big_step}",
            *timed(
                lambda: wsgi_get(app, f"/runs/{RUN_ID}/steps/{big_step}/observation"), args.repeat
            ),
        )
        report("runs list", *timed(lambda: wsgi_get(app, "/"), args.repeat))
        report("stats", *timed(lambda: wsgi_get(app, "/stats"), args.repeat))

    server = serve(path, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only

    def http(url: str) -> Callable[[], int]:
        def go() -> int:
            with opener.open(server.url.rstrip("/") + url, timeout=60) as r:
                return len(r.read())

        return go

    try:
        print(f"\n-- HTTP, {server.url}")
        report("run page 1", *timed(http(f"/runs/{RUN_ID}"), args.repeat))
        report(
            f"run page {pages} (last)", *timed(http(f"/runs/{RUN_ID}?page={pages}"), args.repeat)
        )
        browser(server.url, pages, args.repeat)
    finally:
        server.shutdown()
        thread.join(5)
        server.close()


def browser(base: str, pages: int, repeat: int) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("\n-- browser: skipped (pip install -e '.[viewer-test]')")
        return
    if not os.access(CHROMIUM, os.X_OK):
        print(f"\n-- browser: skipped (no Chromium at {CHROMIUM}: run .ci/chromium.sh)")
        return
    print("\n-- Chromium (navigation until the load event)")
    with (
        tempfile.TemporaryDirectory(prefix="polyloop-chromium-") as profile,
        sync_playwright() as p,
    ):
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        page = context.new_page()
        base = base.rstrip("/")

        def nav(url: str) -> Callable[[], int]:
            def go() -> int:
                page.goto(base + url, wait_until="load")
                return int(page.evaluate("document.documentElement.outerHTML.length"))

            return go

        report("run page 1", *timed(nav(f"/runs/{RUN_ID}"), repeat))
        report(f"run page {pages} (last)", *timed(nav(f"/runs/{RUN_ID}?page={pages}"), repeat))

        def expand_all() -> int:
            page.click('button[data-expand="none"]')
            page.click('button[data-expand="all"]')
            page.evaluate("new Promise(r => requestAnimationFrame(() => r(0)))")
            return int(page.locator("details.step[open]").count())

        page.goto(base + f"/runs/{RUN_ID}")
        report("expand all steps of a page (clicks + paint)", *timed(expand_all, repeat))
        context.close()


if __name__ == "__main__":
    main()
