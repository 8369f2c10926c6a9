"""Small HTML helpers: escaping, formatting, the page frame and the bundled assets."""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from ._data import RunRow

REASON_CLASS = {
    "task_completed": "ok",
    "agent_finished": "ok",
    "step_budget": "budget",
    "action_budget": "budget",
    "context_overflow": "budget",
    "llm_error": "error",
    "env_error": "error",
    "parse_failed_repeatedly": "error",
    "resume_state_unknown": "human",
    "repeated_failure": "human",
    "escalated": "human",
    "cancelled": "cancelled",
    "stopped": "cancelled",
}


def esc(value: object) -> str:
    """Text made safe for HTML content and quoted attributes."""
    return html.escape("" if value is None else str(value), quote=True)


def q(value: str) -> str:
    """A path segment (a run id) for a URL."""
    return quote(value, safe="")


def when(epoch: float | None) -> str:
    return "" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def ms(value: float) -> str:
    return duration(value / 1000)


def chars(n: int) -> str:
    if n < 10_000:
        return f"{n} chars"
    if n < 1_000_000:
        return f"{n / 1000:.1f}k chars"
    return f"{n / 1_000_000:.2f}M chars"


def short(text: str | None, width: int = 80) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= width else line[: width - 1] + "…"


def badge(reason: str | None, *, state: str = "ended") -> str:
    if reason is None:
        label = {
            "live": "in progress",
            "detached": "detached (resumable)",
            "stale": "stale (resumable)",
            "awaiting_approval": "awaiting approval (parked)",
        }.get(state, state)
        return f'<span class="badge state-{esc(state)}">{esc(label)}</span>'
    cls = REASON_CLASS.get(reason, "unknown")
    return f'<span class="badge reason-{cls}" data-reason="{esc(reason)}">{esc(reason)}</span>'


def asset(name: str) -> str:
    """A bundled static file's text (``viewer.css``, ``viewer.js``)."""
    return resources.files(__package__).joinpath("static", name).read_text(encoding="utf-8")


def page(
    title: str,
    body: str,
    *,
    nav: str = "",
    inline_assets: bool = False,
    body_attrs: str = "",
) -> str:
    """A whole HTML document. ``inline_assets``: CSS and JS inside it (a self-contained file)."""
    if inline_assets:
        head = f"<style>{asset('viewer.css')}</style>"
        tail = f"<script>{asset('viewer.js')}</script>"
    else:
        head = '<link rel="stylesheet" href="/static/viewer.css">'
        tail = '<script src="/static/viewer.js"></script>'
    nav_html = f'<nav class="top">{nav}</nav>' if nav else ""
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>{head}</head>"
        f"<body{body_attrs}>{nav_html}<main>{body}</main>{tail}</body></html>\n"
    )


def nav_links(active: str) -> str:
    items = [("runs", "/", "Runs"), ("stats", "/stats", "Stats")]
    links = "".join(
        f'<a href="{href}"{" class=active" if key == active else ""}>{label}</a>'
        for key, href, label in items
    )
    return f'<span class="brand">PolyLoop</span>{links}'


def request_text(r: RunRow, *, content: bool = True) -> str:
    """``stop requested by WHO at WHEN: REASON`` (without ``content``: who and why withheld,
    as a shared report withholds the stop detail)."""
    at = "" if r.requested_at is None else f" at {when(r.requested_at)}"
    if not content:
        return f"{r.request} requested{at} (who and why withheld)"
    reason = f": {r.request_reason}" if r.request_reason else ""
    return f"{r.request} requested by {r.requested_by or '?'}{at}{reason}"


def run_duration(r: RunRow, now: float) -> str:
    return "—" if r.state in ("detached", "stale") else duration(r.duration_s(now))


def pager_links(current: int, pages: int, href: Callable[[int], str]) -> str:
    """Links to the pages around ``current``, the first and the last."""
    if pages <= 1:
        return ""
    shown = sorted(
        {1, pages, current - 2, current - 1, current, current + 1, current + 2}
        & set(range(1, pages + 1))
    )
    parts = []
    if current > 1:
        parts.append(f'<a class="prev" href="{esc(href(current - 1))}">‹ prev</a>')
    last = 0
    for p in shown:
        if p - last > 1:
            parts.append('<span class="gap">…</span>')
        if p == current:
            parts.append(f'<span class="current">{p}</span>')
        else:
            parts.append(f'<a href="{esc(href(p))}">{p}</a>')
        last = p
    if current < pages:
        parts.append(f'<a class="next" href="{esc(href(current + 1))}">next ›</a>')
    return f'<nav class="pager">{"".join(parts)}</nav>'
