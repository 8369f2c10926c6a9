"""Small HTML helpers: escaping, formatting, the page frame and the bundled assets."""

from __future__ import annotations

import html
import time
from importlib import resources
from urllib.parse import quote

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
