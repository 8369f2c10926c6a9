"""The viewer's pages, called as a WSGI application (no network): status codes, filters,
sorting, pagination, capping, live state, and what is never allowed."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import time
from pathlib import Path

import pytest

from polyloop import Limits, Loop, ModelReply
from polyloop.cli.view import ViewerApp, make_app
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from polyloop.types import RunSpec
from tests.viewer.conftest import BIG_OBSERVATION, LONG_STEPS
from tests.viewer.journal_factory import ALL_REASONS, MARKERS, call, tools
from tests.viewer.wsgi import get


def run_ids(html: str) -> list[str]:
    """The runs listed in a runs table, in order."""
    return re.findall(r'<tr data-run="([^"]+)"', html)


# --- runs list -------------------------------------------------------------------------------


def test_runs_list_shows_every_run_with_its_stop_reason(app: ViewerApp) -> None:
    r = get(app, "/")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    ids = run_ids(r.text)
    assert {f"run-{reason}" for reason in ALL_REASONS} <= set(ids)
    assert {"run-paused", "run-long", "run-bigobs"} <= set(ids)
    for reason in ALL_REASONS:
        assert f'data-reason="{reason}">{reason}</span>' in r.text
    assert "detached (resumable)" in r.text


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_filter_by_stop_reason_keeps_only_those_runs(app: ViewerApp, reason: str) -> None:
    ids = run_ids(get(app, f"/?reason={reason}").text)
    also = {"run-long", "run-bigobs"} if reason == "agent_finished" else set()
    assert set(ids) == {f"run-{reason}", *also}


def test_filter_by_several_stop_reasons_keeps_any_of_them(app: ViewerApp) -> None:
    ids = run_ids(get(app, "/?reason=env_error&reason=llm_error").text)
    assert sorted(ids) == ["run-env_error", "run-llm_error"]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("detached", {"run-paused"}),
        ("running", {"run-paused"}),
        ("live", set()),
        ("stale", set()),
    ],
)
def test_filter_by_state(app: ViewerApp, state: str, expected: set[str]) -> None:
    assert set(run_ids(get(app, f"/?state={state}").text)) == expected


def test_filter_ended_leaves_out_unended_runs(app: ViewerApp) -> None:
    ids = run_ids(get(app, "/?state=ended").text)
    assert "run-paused" not in ids and "run-task_completed" in ids


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ("suite=other", ["run-paused"]),
        ("team.name=blue", ["run-task_completed"]),
        ("model", ["run-task_completed"]),
        ("suite=viewer%20%26%20reason=llm_error", ["run-llm_error"]),
        ("suite=nope", []),
    ],
)
def test_filter_by_metadata(app: ViewerApp, meta: str, expected: list[str]) -> None:
    assert run_ids(get(app, f"/?meta={meta}").text) == expected


def test_filter_by_date(app: ViewerApp) -> None:
    today = time.strftime("%Y-%m-%d")
    assert len(run_ids(get(app, f"/?since={today}&until={today}").text)) >= 12
    assert run_ids(get(app, "/?since=2999-01-01").text) == []
    assert run_ids(get(app, "/?until=2000-01-01").text) == []


def test_search_matches_goal_text_and_run_id_prefix(app: ViewerApp) -> None:
    assert run_ids(get(app, f"/?q={MARKERS['goal'].lower()}").text) == ["run-task_completed"]
    assert run_ids(get(app, "/?q=run-big").text) == ["run-bigobs"]


def test_sorting_by_steps(app: ViewerApp) -> None:
    desc = run_ids(get(app, "/?sort=steps").text)
    assert desc[0] == "run-long"
    asc = run_ids(get(app, "/?sort=steps&order=asc").text)
    assert asc[-1] == "run-long"
    assert asc[0] in ("run-context_overflow", "run-resume_state_unknown")


@pytest.mark.parametrize("key", ["actions", "duration", "stop_reason", "created"])
def test_every_sortable_column_sorts(app: ViewerApp, key: str) -> None:
    r = get(app, f"/?sort={key}&order=asc")
    assert r.status == 200 and len(run_ids(r.text)) == 14
    assert f'class="sortable sorted" data-sort="{key}"' in r.text


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("since=yesterday", "since takes a date as YYYY-MM-DD"),
        ("sort=goal", "sort must be one of"),
        ("order=up", "order must be asc or desc"),
        ("state=sleeping", "state must be one of"),
        ("page=0", "page must be a number from 1"),
        ("meta==x", "meta takes key=value"),
    ],
)
def test_bad_query_is_a_400_with_one_line(app: ViewerApp, query: str, message: str) -> None:
    r = get(app, f"/?{query}")
    assert r.status == 400
    assert message in r.text


def test_runs_api_has_a_version_that_changes_when_runs_do(tmp_path: Path) -> None:
    path = tmp_path / "j.db"

    async def one(run_id: str) -> None:
        async with SQLiteJournal(path) as journal:
            loop = Loop(ScriptedModel([ModelReply("hi")]), journal=journal)
            await loop.run("g", run_id=run_id)

    asyncio.run(one("a"))
    with make_app(path) as viewer:
        first = get(viewer, "/api/runs").json()
        assert first["count"] == 1 and first["live"] == 0 and 'data-run="a"' in first["tbody"]
        assert get(viewer, "/api/runs").json()["version"] == first["version"]
        asyncio.run(one("b"))
        second = get(viewer, "/api/runs").json()
        assert second["version"] != first["version"] and second["count"] == 2


def test_runs_api_rejects_a_bad_query_as_json(app: ViewerApp) -> None:
    r = get(app, "/api/runs?sort=bad")
    assert r.status == 400 and "sort must be one of" in r.json()["error"]


# --- run page --------------------------------------------------------------------------------


def test_run_page_shows_the_timeline(app: ViewerApp) -> None:
    r = get(app, "/runs/run-task_completed")
    assert r.status == 200
    html = r.text
    for i in range(4):
        assert f'id="step-{i}"' in html
    assert 'data-kind="executed"' in html and 'data-kind="invalid"' in html
    assert 'class="parse-error"' in html  # highlighted
    assert MARKERS["text"] in html and MARKERS["reasoning"] in html  # the owner sees it all
    assert '<details class="block reasoning">' in html  # reasoning collapsed
    assert 'class="unseen"' in html and "did not see the 180 chars" in html
    assert 'svg class="mini wall"' in html and 'svg class="mini prompt"' in html
    assert 'id="ending"' in html and 'data-reason="task_completed"' in html
    assert "data-poll-run" not in html  # ended: nothing to poll


def test_run_page_of_resume_state_unknown_names_the_pending_action(app: ViewerApp) -> None:
    html = get(app, "/runs/run-resume_state_unknown").text
    assert "Action of unknown outcome" in html and "<code>charge</code>" in html
    assert "policy=never" in html  # the stop detail


def test_run_page_of_repeated_failure_shows_the_escalation_report(app: ViewerApp) -> None:
    html = get(app, "/runs/run-repeated_failure").text
    assert "Escalation report" in html and "the same failure again" in html


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_every_run_page_renders_with_its_stop_reason(app: ViewerApp, reason: str) -> None:
    r = get(app, f"/runs/run-{reason}")
    assert r.status == 200
    assert '<p class="stopped">Stopped: <span class="badge' in r.text
    assert f'data-reason="{reason}"' in r.text


def test_run_page_of_an_unended_run_says_so(app: ViewerApp) -> None:
    html = get(app, "/runs/run-paused").text
    assert "Not ended" in html and "data-poll-run" in html


def test_long_runs_are_paginated(app: ViewerApp) -> None:
    first = get(app, "/runs/run-long").text
    assert first.count('<details class="step') == 100
    assert 'id="step-0"' in first and 'id="step-99"' in first and 'id="step-100"' not in first
    assert 'id="ending"' not in first and "the last page" in first
    assert first.count('<rect class="k-') == LONG_STEPS  # the strip covers every step
    last = get(app, "/runs/run-long?page=3").text
    assert 'id="step-200"' in last and f'id="step-{LONG_STEPS - 1}"' in last
    assert 'id="ending"' in last
    beyond = get(app, "/runs/run-long?page=99").text
    assert f'id="step-{LONG_STEPS - 1}"' in beyond  # clamped to the last page
    custom = get(app, "/runs/run-long?per=10&page=2").text
    assert custom.count('<details class="step') == 10 and 'id="step-10"' in custom


def test_multi_megabyte_observation_is_capped_with_an_expand_link(app: ViewerApp) -> None:
    r = get(app, "/runs/run-bigobs")
    assert r.status == 200 and len(r.text) < 150_000
    link = re.search(r'<a class="expand" href="([^"]+/observation)"', r.text)
    assert link is not None
    full = get(app, link.group(1).replace("&amp;", "&"))
    assert full.status == 200 and len(full.text) > BIG_OBSERVATION
    assert "did not see the" in full.text


@pytest.mark.parametrize(
    ("url", "status"),
    [
        ("/runs/nope", 404),
        ("/runs/run-long/steps/9999/observation", 404),
        ("/runs/run-long/steps/0/secrets", 404),
        ("/runs/run-task_completed/steps/0/reasoning", 200),
        ("/runs/run-task_completed/steps/0/action", 200),
        ("/runs/run-long?per=x", 400),
        ("/nowhere", 404),
        ("/static/viewer.js", 200),
        ("/static/viewer.css", 200),
        ("/static/../../etc/passwd", 404),
    ],
)
def test_status_codes(app: ViewerApp, url: str, status: int) -> None:
    assert get(app, url).status == status


def test_run_api(app: ViewerApp) -> None:
    data = get(app, "/api/runs/run-step_budget").json()
    assert data["state"] == "ended" and data["steps_used"] == 3
    assert data["stop_reason"] == "step_budget"
    assert get(app, "/api/runs/nope").status == 404


def test_the_viewer_is_read_only(app: ViewerApp) -> None:
    assert get(app, "/", method="POST").status == 405
    assert get(app, "/", method="HEAD").text == ""


def test_pages_are_served_with_a_strict_content_security_policy(app: ViewerApp) -> None:
    csp = get(app, "/").headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp


def test_content_is_escaped(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    goal = "<script>alert('goal')</script>"

    async def go() -> None:
        async with SQLiteJournal(path) as journal:
            model = ScriptedModel([call("lookup", {"query": "<img src=x onerror=alert(1)>"}), "ok"])
            await Loop(model, tools=tools(), journal=journal).run(goal, run_id="<b>id</b>")

    asyncio.run(go())
    with make_app(path) as viewer:
        for url in ("/", "/runs/%3Cb%3Eid%3C%2Fb%3E", "/stats"):
            r = get(viewer, url)
            assert r.status == 200, url
            assert "<script>alert" not in r.text and "<img src=x" not in r.text
            assert "<b>id</b>" not in r.text


def test_host_header_is_checked_when_hosts_are_given(journal_path: Path) -> None:
    with make_app(journal_path, allowed_hosts=["127.0.0.1:8765"]) as viewer:
        assert get(viewer, "/", host="127.0.0.1:8765").status == 200
        assert get(viewer, "/", host="evil.example:8765").status == 403


def test_make_app_refuses_a_missing_journal(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no journal at"):
        make_app(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


async def test_a_run_in_progress_is_live(tmp_path: Path) -> None:
    path = tmp_path / "live.db"
    entered, release = asyncio.Event(), asyncio.Event()
    reg = tools()

    @reg.tool
    async def slow() -> str:
        """Waits."""
        entered.set()
        await release.wait()
        return "done"

    async with SQLiteJournal(path) as journal:
        loop = Loop(ScriptedModel([call("slow"), "fine"]), tools=reg, journal=journal)
        task = asyncio.ensure_future(loop.run("wait", run_id="live-1"))
        await asyncio.wait_for(entered.wait(), 10)
        viewer = make_app(path)
        try:
            listing = await asyncio.to_thread(get, viewer, "/?state=live")
            assert run_ids(listing.text) == ["live-1"] and 'data-live="1"' in listing.text
            page = await asyncio.to_thread(get, viewer, "/runs/live-1")
            assert "data-poll-run" in page.text and "started, no result yet" in page.text
            release.set()
            await task
            ended = await asyncio.to_thread(get, viewer, "/api/runs/live-1")
            assert ended.json()["state"] == "ended"
        finally:
            viewer.close()
            release.set()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_unended_runs_are_shown_live_detached_or_stale(tmp_path: Path) -> None:
    path = tmp_path / "states.db"
    async with SQLiteJournal(path) as journal:
        for run_id in ("held", "expired", "left"):
            lease = await journal.create(
                RunSpec(run_id, f"goal {run_id}", Limits(), 1.0), ttl_s=600
            )
        await journal.release(lease)  # "left": detached
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:  # its owner stopped renewing
        conn.execute("UPDATE runs SET lease_expires_at = 1 WHERE run_id = 'expired'")
    with make_app(path) as viewer:
        listing = get(viewer, "/").text
        for run_id, state in (("held", "live"), ("expired", "stale"), ("left", "detached")):
            assert f'<tr data-run="{run_id}" data-state="{state}"' in listing
            assert run_ids(get(viewer, f"/?state={state}").text) == [run_id]
        assert "stale (resumable)" in listing and "detached (resumable)" in listing
        assert "its owner is gone" in get(viewer, "/runs/expired").text
        assert "nobody is advancing it" in get(viewer, "/runs/left").text
        assert get(viewer, "/api/runs/expired").json()["state"] == "stale"


# --- stats -----------------------------------------------------------------------------------


def test_stats_page_draws_three_charts(app: ViewerApp) -> None:
    r = get(app, "/stats")
    assert r.status == 200
    assert r.text.count('<svg class="chart') == 3
    for reason in ALL_REASONS:
        count = 3 if reason == "agent_finished" else 1  # with run-long and run-bigobs
        assert f'data-label="{reason}" data-count="{count}"' in r.text
    assert 'id="chart-steps"' in r.text and 'id="chart-step-time"' in r.text


def test_stats_follow_the_filters(app: ViewerApp) -> None:
    r = get(app, "/stats?reason=step_budget")
    assert 'data-label="step_budget" data-count="1"' in r.text
    assert 'data-label="task_completed"' not in r.text
    assert "all 3 steps of the selected runs" in r.text
    assert get(app, "/stats?since=bad").status == 400


def test_limits_are_shown(app: ViewerApp) -> None:
    assert "max_observation_chars=120" in get(app, "/runs/run-task_completed").text


def test_stopped_runs_and_pending_requests_are_shown_read_only(tmp_path: Path) -> None:
    from polyloop.cli.view import build_report

    path = tmp_path / "req.db"

    async def go() -> str:
        async with SQLiteJournal(path) as journal:
            loop = Loop(ScriptedModel([]), journal=journal)
            for run_id in ("stopped", "pending"):
                lease = await journal.create(RunSpec(run_id, "g", Limits(), time.time()), ttl_s=600)
                if run_id == "stopped":
                    await journal.release(lease)  # nobody holds it: the stop ends it now
            assert (await loop.stop("stopped", "ended by ops", by="ops")).happened == "ended"
            # 'pending' is held by a live execution (this process): the request waits for it.
            assert (await loop.cancel("pending", reason="wrong goal", by="ops")).happened == (
                "requested"
            )
            return await build_report(journal, "pending", include_content=False)

    report = asyncio.run(go())
    with make_app(path) as viewer:
        before = path.read_bytes()
        listed = get(viewer, "/").text
        assert 'class="badge reason-cancelled" data-reason="stopped">stopped</span>' in listed
        assert 'class="badge request" title="cancel requested by ops at ' in listed
        assert ">cancel requested</span>" in listed
        pending = get(viewer, "/runs/pending").text
        assert "Pending: cancel requested by ops at " in pending and "wrong goal" in pending
        ended = get(viewer, "/runs/stopped").text
        assert "Request: stop requested by ops at " in ended
        assert get(viewer, "/?reason=stopped").status == 200
        assert run_ids(get(viewer, "/?reason=stopped").text) == ["stopped"]
        assert path.read_bytes() == before  # read-only
    assert "cancel requested at " in report and "who and why withheld" in report
    assert "wrong goal" not in report and "by ops" not in report


def test_a_parked_run_is_shown_awaiting_approval_read_only(tmp_path: Path) -> None:
    from polyloop import ApprovalRequired
    from tests.contract.test_approval import Mailer, loop_of

    path = tmp_path / "parked.db"

    async def park() -> None:
        async with SQLiteJournal(path) as journal:
            with contextlib.suppress(ApprovalRequired):
                await loop_of(Mailer(), journal).run("mail the CEO", run_id="run-parked")

    asyncio.run(park())
    before = sqlite3.connect(path).execute("SELECT count(*) FROM journal").fetchone()
    with make_app(path) as viewer:
        listed = get(viewer, "/?state=awaiting_approval")
        assert listed.status == 200 and run_ids(listed.text) == ["run-parked"]
        assert "awaiting approval (parked)" in listed.text
        page = get(viewer, "/runs/run-parked")
        assert page.status == 200 and "polyloop approve / deny decide" in page.text
    after = sqlite3.connect(path).execute("SELECT count(*) FROM journal").fetchone()
    assert before == after  # read-only
