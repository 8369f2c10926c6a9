"""The real viewer in headless Chromium (Debian's ``chromium``, driven by Playwright through
``executable_path``: no browser is ever downloaded).

Open the runs list of a journal with a run of every stop reason, filter it, sort it, open a
run, expand steps, page through a long run, open the stats; a run in progress updates live.
Screenshots go to a temporary folder and are checked. ``POLYLOOP_UPDATE_SCREENSHOT=1`` also
runs ``test_readme_screenshot``, which views the offline demo's journal and writes the README's
``docs/viewer.png``.

Without Chromium or Playwright these tests skip, saying what to install; under CI
(``CI=true``) they fail instead, since CI installs Chromium (``.ci/chromium.sh``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import Loop, ToolRegistry
from polyloop.cli.view import Server, serve
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from tests.viewer.journal_factory import ALL_REASONS, MARKERS, call

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
DOCS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "viewer.png"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed: pip install -e '.[viewer-test]'"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM}: run .ci/chromium.sh (apt-get install chromium)"
    return None


def _serve(path: Path) -> Iterator[Server]:
    server = serve(path, port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(5)
        server.close()


@pytest.fixture(scope="module")
def browser_context() -> Iterator[Any]:
    why = _missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why} (CI runs the browser tests)")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="polyloop-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile,
                executable_path=CHROMIUM,
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1280, "height": 900},
            )
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def server(journal_path: Path, browser_context: Any) -> Iterator[Server]:
    yield from _serve(journal_path)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


class Page:
    """A browser tab that records console errors (a CSP violation is one)."""

    def __init__(self, context: Any, base: str) -> None:
        self.page = context.new_page()
        self.base = base.rstrip("/")
        self.errors: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def goto(self, path: str) -> Any:
        self.page.goto(self.base + path)
        return self.page

    def shot(self, where: Path, name: str) -> Path:
        path = where / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000, f"{name}: an empty screenshot?"
        return path

    def close(self) -> None:
        self.page.close()
        assert self.errors == [], self.errors


@pytest.fixture
def tab(browser_context: Any, server: Server) -> Iterator[Page]:
    page = Page(browser_context, server.url)
    yield page
    page.close()


def rows(page: Any) -> list[str]:
    return [
        str(x)
        for x in page.locator("#runs-body tr[data-run]").evaluate_all(
            "els => els.map(e => e.dataset.run)"
        )
    ]


def test_runs_list_shows_a_run_of_every_stop_reason(tab: Page, shots: Path) -> None:
    page = tab.goto("/")
    page.wait_for_selector("table.runs")
    assert len(rows(page)) == 14
    for reason in ALL_REASONS:
        badges = page.locator(f'#runs-body .badge[data-reason="{reason}"]')
        assert badges.count() == (3 if reason == "agent_finished" else 1), reason
        assert badges.first.is_visible()
    assert page.locator("#runs-body .badge.state-detached").count() == 1
    tab.shot(shots, "runs")


def test_filter_by_stop_reason_then_by_metadata_then_sort(tab: Page) -> None:
    page = tab.goto("/")
    page.locator('input[name="reason"][value="step_budget"]').check()
    page.locator('input[name="reason"][value="env_error"]').check()
    page.locator('form.filters button[type="submit"]').click()
    page.wait_for_url("**/?*reason=step_budget*")
    assert sorted(rows(page)) == ["run-env_error", "run-step_budget"]
    page.locator('input[name="reason"][value="step_budget"]').uncheck()
    page.locator('input[name="reason"][value="env_error"]').uncheck()
    page.fill('input[name="meta"]', "team.name=blue")
    page.locator('form.filters button[type="submit"]').click()
    page.wait_for_url("**meta=team.name*")
    assert rows(page) == ["run-task_completed"]
    page.locator("a.clear").click()
    page.wait_for_url(tab.base + "/")
    assert len(rows(page)) == 14
    page.locator('th[data-sort="steps"] a').click()
    page.wait_for_url("**sort=steps*")
    assert rows(page)[0] == "run-long"
    page.locator('th[data-sort="steps"] a').click()
    page.wait_for_url("**order=asc*")
    assert rows(page)[-1] == "run-long"


def test_open_a_run_and_expand_its_steps(tab: Page, shots: Path) -> None:
    page = tab.goto("/")
    page.locator('#runs-body a[href="/runs/run-task_completed"]').click()
    page.wait_for_selector("h1 .run-id")
    assert page.locator("details.step").count() == 4
    step = page.locator("#step-1")
    assert step.get_attribute("open") is None
    step.locator("summary").first.click()
    assert step.get_attribute("open") is not None
    unseen = step.locator(".unseen")
    assert unseen.is_visible() and "did not see the 180 chars" in unseen.inner_text()
    first = page.locator("#step-0")
    first.locator("summary").first.click()
    assert MARKERS["text"] in first.locator(".model-text pre").inner_text()
    reasoning = first.locator("details.reasoning")
    assert not reasoning.locator("pre").is_visible()  # collapsed until asked
    reasoning.locator("summary").click()
    assert MARKERS["reasoning"] in reasoning.locator("pre").inner_text()
    invalid = page.locator("#step-2")
    assert "k-invalid" in (invalid.get_attribute("class") or "")
    invalid.locator("summary").first.click()
    assert invalid.locator(".parse-error").is_visible()
    assert page.locator('#ending .badge[data-reason="task_completed"]').is_visible()
    tab.shot(shots, "run")


def test_a_long_run_pages_and_expands(tab: Page) -> None:
    page = tab.goto("/runs/run-long")
    assert page.locator("details.step").count() == 100
    page.locator("nav.pager a.next").first.click()
    page.wait_for_url("**page=2*")
    assert page.locator("#step-100").count() == 1
    page.locator('button[data-expand="all"]').click()
    assert page.locator("details.step[open]").count() == 100
    page.locator('button[data-expand="none"]').click()
    assert page.locator("details.step[open]").count() == 0
    page.locator('svg.strip a[href$="#step-249"]').click()
    page.wait_for_url("**page=3#step-249")
    assert page.locator("#step-249").get_attribute("open") is not None
    assert page.locator("#ending").is_visible()


def test_stats_page_has_its_charts(tab: Page, shots: Path) -> None:
    page = tab.goto("/")
    page.locator('nav.top a[href="/stats"]').click()
    page.wait_for_selector("#chart-reasons svg")
    assert page.locator("svg.chart").count() == 3
    assert page.locator("#chart-reasons g.bar").count() == len(ALL_REASONS)
    assert page.locator("#chart-steps g.bin").count() >= 2
    assert page.locator("#chart-step-time g.bin").count() >= 1
    tab.shot(shots, "stats")


def _live_run(path: Path, entered: threading.Event, release: threading.Event) -> None:
    async def main() -> None:
        tools = ToolRegistry()

        @tools.tool
        async def slow() -> str:
            """Waits to be released."""
            entered.set()
            await asyncio.to_thread(release.wait, 60)
            return "done"

        @tools.tool(completion_marker=True)
        def submit(answer: str) -> str:
            """Submit."""
            return "ok"

        model = ScriptedModel([call("slow"), call("submit", {"answer": "x"})])
        async with SQLiteJournal(path) as journal:
            await Loop(model, tools=tools, journal=journal).run("a live run", run_id="live")

    asyncio.run(main())


def test_a_run_in_progress_updates_live(browser_context: Any, tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    entered, release = threading.Event(), threading.Event()
    worker = threading.Thread(target=_live_run, args=(path, entered, release), daemon=True)
    worker.start()
    try:
        assert entered.wait(20)
        for server in _serve(path):
            listing = Page(browser_context, server.url)
            run = Page(browser_context, server.url)
            try:
                page = listing.goto("/")
                page.wait_for_selector('#runs-body tr[data-run="live"] .badge.state-live')
                run_page = run.goto("/runs/live")
                run_page.wait_for_selector("section.ending.running")
                release.set()
                page.wait_for_selector(
                    '#runs-body tr[data-run="live"] .badge[data-reason="task_completed"]',
                    timeout=15_000,
                )
                run_page.wait_for_selector(
                    '#ending .badge[data-reason="task_completed"]', timeout=15_000
                )
                assert run_page.locator("details.step").count() == 2
            finally:
                listing.close()
                run.close()
    finally:
        release.set()
        worker.join(20)


@pytest.mark.skipif(
    not os.environ.get("POLYLOOP_UPDATE_SCREENSHOT"),
    reason="writes docs/viewer.png; run with POLYLOOP_UPDATE_SCREENSHOT=1 to refresh it",
)
def test_readme_screenshot(browser_context: Any) -> None:
    from polyloop.cli.demo import run_demo

    root = Path(tempfile.mkdtemp(prefix="polyloop-demo-"))  # a short path in the picture
    codes: list[int] = []  # in a thread of its own: Playwright's loop runs in this one
    demo = threading.Thread(
        target=lambda: codes.append(asyncio.run(run_demo(say=lambda _: None, root=root)))
    )
    demo.start()
    demo.join(120)
    assert codes == [0]
    for server in _serve(root / "demo.sqlite"):
        tab = Page(browser_context, server.url)
        try:
            page = tab.goto("/?sort=created&order=asc")
            page.locator("#runs-body td.id a").first.click()
            page.wait_for_selector("details.step")
            for i in (2, 3):
                page.locator(f"#step-{i} > summary").click()
            page.set_viewport_size({"width": 1280, "height": 1440})
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(DOCS_SCREENSHOT), full_page=False)
        finally:
            tab.close()
    shutil.rmtree(root, ignore_errors=True)
    assert DOCS_SCREENSHOT.stat().st_size > 20_000
