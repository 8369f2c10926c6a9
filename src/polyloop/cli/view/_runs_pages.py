"""The pages about many runs: the runs list (and its JSON for live updates) and stats."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from . import _charts, _usage
from ._data import KNOWN_STOP_REASONS, RunRow
from ._filters import RUNS_PER_PAGE, SORTS, Query, meta_text
from ._html import (
    REASON_CLASS,
    badge,
    esc,
    ms,
    nav_links,
    page,
    pager_links,
    q,
    request_text,
    run_duration,
    short,
    when,
)

# -- runs list --------------------------------------------------------------------------------


def filter_form(query: Query, action: str, reasons: Sequence[str]) -> str:
    boxes = "".join(
        f'<label class="chip reason-{REASON_CLASS.get(r, "unknown")}"><input type="checkbox" '
        f'name="reason" value="{esc(r)}"{" checked" if r in query.reasons else ""}> '
        f"{esc(r)}</label>"
        for r in reasons
    )
    states = "".join(
        f'<option value="{v}"{" selected" if query.state == v else ""}>{label}</option>'
        for v, label in [
            ("", "any state"),
            ("ended", "ended"),
            ("running", "not ended"),
            ("live", "in progress"),
            ("detached", "detached (resumable)"),
            ("stale", "stale: owner gone (resumable)"),
            ("awaiting_approval", "awaiting approval (parked)"),
        ]
    )
    meta = " & ".join(k if v is None else f"{k}={v}" for k, v in query.meta)
    hidden = ""
    if action == "/":
        hidden = (
            f'<input type="hidden" name="sort" value="{esc(query.sort)}">'
            f'<input type="hidden" name="order" value="{esc(query.order)}">'
        )
    return (
        f'<form class="filters" method="get" action="{action}" id="filters">'
        f'<fieldset class="reasons"><legend>Stop reason</legend>{boxes}</fieldset>'
        '<div class="row">'
        f'<label>State <select name="state">{states}</select></label>'
        f'<label>From <input type="date" name="since" value="{esc(query.since or "")}"></label>'
        f'<label>To <input type="date" name="until" value="{esc(query.until or "")}"></label>'
        f'<label>Metadata <input type="text" name="meta" value="{esc(meta)}" '
        'placeholder="key=value & other.key=value" size="28"></label>'
        f'<label>Search <input type="search" name="q" value="{esc(query.text)}" '
        'placeholder="run id or goal text"></label>'
        f"{hidden}"
        '<button type="submit">Filter</button>'
        f'<a class="clear" href="{action}">Clear</a></div></form>'
    )


def _meta_chips(metadata: dict[str, object] | None) -> str:
    if not metadata:
        return ""
    out = []
    for key, value in list(metadata.items())[:4]:
        text = short(meta_text(value), 40)
        out.append(f'<span class="meta-chip">{esc(key)}={esc(text)}</span>')
    if len(metadata) > 4:
        out.append(f'<span class="dim">+{len(metadata) - 4}</span>')
    return "".join(out)


def runs_tbody(rows: Sequence[RunRow], now: float) -> str:
    if not rows:
        return '<tr class="none"><td colspan="11">No runs match.</td></tr>'
    out = []
    for r in rows:
        out.append(
            f'<tr data-run="{esc(r.run_id)}" data-state="{r.state}" '
            f'data-reason="{esc(r.stop_reason or "")}">'
            f'<td class="id"><a href="/runs/{q(r.run_id)}">{esc(short(r.run_id, 24))}</a></td>'
            f'<td class="when">{esc(when(r.created_at))}</td>'
            f'<td class="reason">{badge(r.stop_reason, state=r.state)}{_pending(r)}</td>'
            f'<td class="num steps">{r.steps_used}</td>'
            f'<td class="num actions">{r.actions_executed}</td>'
            f'<td class="num duration">{esc(run_duration(r, now))}</td>'
            f"{_usage.runs_cells(r.usage)}"
            f'<td class="goal" title="{esc(short(r.goal, 300))}">{esc(short(r.goal, 70))}</td>'
            f'<td class="meta">{_meta_chips(r.metadata)}</td></tr>'
        )
    return "".join(out)


def _pending(r: RunRow) -> str:
    """A badge for a request to end a run that has not ended yet (read-only: the viewer
    shows it, ``polyloop stop``/``cancel`` make it)."""
    if r.request is None or r.status == "ended":
        return ""
    return (
        f' <span class="badge request" title="{esc(request_text(r))}">'
        f"{esc(r.request)} requested</span>"
    )


def rows_version(rows: Sequence[RunRow]) -> str:
    h = hashlib.sha1(usedforsecurity=False)
    for r in rows:
        h.update(repr((r.run_id, r.token())).encode())
    return h.hexdigest()[:16]


def page_of(rows: Sequence[RunRow], query: Query) -> list[RunRow]:
    start = (query.page - 1) * RUNS_PER_PAGE
    return list(rows[start : start + RUNS_PER_PAGE])


def runs_page(
    selected: Sequence[RunRow], everything: Sequence[RunRow], query: Query, now: float
) -> str:
    present = {r.stop_reason for r in everything if r.stop_reason}
    reasons = [*KNOWN_STOP_REASONS, *sorted(present - set(KNOWN_STOP_REASONS))]
    rows = page_of(selected, query)
    pages = max(1, math.ceil(len(selected) / RUNS_PER_PAGE))
    live = sum(1 for r in selected if r.state == "live")

    def head(key: str, label: str) -> str:
        if key not in SORTS:
            return f"<th>{label}</th>"
        order = "asc" if query.sort == key and query.order == "desc" else "desc"
        arrow = ""
        if query.sort == key:
            arrow = " ▾" if query.order == "desc" else " ▴"
        href = "/?" + query.params(sort=key, order=order, page=1)
        return (
            f'<th class="sortable{" sorted" if query.sort == key else ""}" data-sort="{key}">'
            f'<a href="{esc(href)}">{label}{arrow}</a></th>'
        )

    summary = f"{len(selected)} runs" + (f" of {len(everything)}" if query.filtered else "")
    table = (
        '<table class="runs"><thead><tr>'
        f"{head('id', 'Run')}{head('created', 'Created')}{head('stop_reason', 'Stop reason')}"
        f"{head('steps', 'Steps')}{head('actions', 'Actions')}{head('duration', 'Duration')}"
        f"{_usage.RUNS_HEADERS}"
        f"<th>Goal</th><th>Metadata</th></tr></thead>"
        f'<tbody id="runs-body">{runs_tbody(rows, now)}</tbody></table>'
    )
    pager = pager_links(query.page, pages, lambda p: "/?" + query.params(page=p))
    body = (
        "<h1>Runs</h1>"
        f"{filter_form(query, '/', reasons)}"
        f'<p class="summary"><span id="run-count">{esc(summary)}</span>'
        f'<span id="live-count" class="live-note">{_live_note(live)}</span></p>'
        f"{table}{pager}"
    )
    attrs = (
        f' data-poll="/api/runs?{esc(query.params())}" data-version="{rows_version(rows)}"'
        f' data-live="{live}"'
    )
    return page("PolyLoop runs", body, nav=nav_links("runs"), body_attrs=attrs)


def _live_note(live: int) -> str:
    return f" · {live} in progress (updating live)" if live else ""


def runs_api(
    selected: Sequence[RunRow], everything: Sequence[RunRow], query: Query, now: float
) -> dict[str, object]:
    rows = page_of(selected, query)
    live = sum(1 for r in selected if r.state == "live")
    summary = f"{len(selected)} runs" + (f" of {len(everything)}" if query.filtered else "")
    return {
        "version": rows_version(rows),
        "live": live,
        "count": len(selected),
        "summary": summary,
        "live_note": _live_note(live),
        "tbody": runs_tbody(rows, now),
        "runs": [
            {
                "run_id": r.run_id,
                "state": r.state,
                "stop_reason": r.stop_reason,
                "steps_used": r.steps_used,
                "actions_executed": r.actions_executed,
                **r.usage,
                "created_at": r.created_at,
                "ended_at": r.ended_at,
            }
            for r in rows
        ],
    }


# -- stats ------------------------------------------------------------------------------------


def stats_page(
    selected: Sequence[RunRow],
    everything: Sequence[RunRow],
    query: Query,
    walls: Sequence[float],
    sampled: int,
) -> str:
    present = {r.stop_reason for r in everything if r.stop_reason}
    reasons = [*KNOWN_STOP_REASONS, *sorted(present - set(KNOWN_STOP_REASONS))]
    ended = [r for r in selected if r.status == "ended"]
    counts: dict[str, int] = {}
    for r in ended:
        key = r.stop_reason or "unknown"
        counts[key] = counts.get(key, 0) + 1
    bars = [
        (k, v, "reason-" + REASON_CLASS.get(k, "unknown"))
        for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    not_ended = len(selected) - len(ended)
    steps = sorted(r.steps_used for r in selected)
    wall_sorted = sorted(walls)
    cards = [
        ("Runs", str(len(selected))),
        ("Ended", str(len(ended))),
        ("Not ended", str(not_ended)),
        (
            "Steps p50 / p90",
            f"{_charts.percentile(steps, 50):.0f} / {_charts.percentile(steps, 90):.0f}",
        ),
        (
            "Step time p50 / p90",
            f"{ms(_charts.percentile(wall_sorted, 50))} / "
            f"{ms(_charts.percentile(wall_sorted, 90))}",
        ),
        ("Step time p99", ms(_charts.percentile(wall_sorted, 99))),
    ]
    card_html = "".join(
        f'<div class="card"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>'
        for k, v in cards
    )
    sample_note = (
        f"step times of the {sampled} most recent selected runs"
        if sampled < len(selected)
        else f"all {len(walls)} steps of the selected runs"
    )
    body = (
        "<h1>Stats</h1>"
        f"{filter_form(query, '/stats', reasons)}"
        f'<div class="cards">{card_html}</div>'
        f'<section class="chart-box" id="chart-reasons"><h2>Stop reasons</h2>'
        f'<p class="dim">{len(ended)} ended runs'
        + (f"; {not_ended} not ended" if not_ended else "")
        + "</p>"
        f"{_charts.hbars(bars, label='stop-reason distribution')}</section>"
        '<section class="chart-box" id="chart-steps"><h2>Steps per run</h2>'
        f"{_charts.histogram(_charts.int_bins(steps), label='steps per run', x_label='steps')}"
        "</section>"
        '<section class="chart-box" id="chart-step-time"><h2>Time per step</h2>'
        f'<p class="dim">{esc(sample_note)} (step_wall_ms: model, interpretation and action)</p>'
        + _charts.histogram(_charts.ms_bins(walls), label="time per step", x_label="step_wall_ms")
        + "</section>"
    )
    return page("PolyLoop stats", body, nav=nav_links("stats"))
