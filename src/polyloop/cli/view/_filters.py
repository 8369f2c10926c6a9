"""The runs list's query: filters, sort order and page, read from and written to URLs."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlencode

from ._data import RunRow

SORTS = ("created", "steps", "actions", "duration", "stop_reason")
STATES = ("ended", "live", "detached", "stale", "awaiting_approval", "running")
RUNS_PER_PAGE = 200


class BadQuery(ValueError):
    """A query parameter the viewer cannot use; the message is shown as one line."""


@dataclass(frozen=True, slots=True)
class Query:
    reasons: tuple[str, ...] = ()
    """Only runs that stopped for one of these (empty: any)."""
    state: str | None = None
    """``ended``, ``live`` (in progress now), ``detached`` or ``stale`` (resumable, see
    :attr:`RunRow.state`), ``awaiting_approval`` (parked until a person decides), or
    ``running`` (not ended: any of the four before)."""
    since: str | None = None
    """YYYY-MM-DD: created on or after that day (local time)."""
    until: str | None = None
    """YYYY-MM-DD: created on or before that day (local time)."""
    meta: tuple[tuple[str, str | None], ...] = ()
    """Metadata ``key=value`` (a dotted key reaches into nested objects; no value: has key)."""
    text: str = ""
    """A run id prefix or a part of the goal."""
    sort: str = "created"
    order: str = "desc"
    page: int = 1

    def params(self, **changes: Any) -> str:
        """This query (with ``changes``) as a URL query string, defaults left out."""
        q = replace(self, **changes)
        pairs: list[tuple[str, str]] = [("reason", r) for r in q.reasons]
        if q.state:
            pairs.append(("state", q.state))
        if q.since:
            pairs.append(("since", q.since))
        if q.until:
            pairs.append(("until", q.until))
        pairs += [("meta", k if v is None else f"{k}={v}") for k, v in q.meta]
        if q.text:
            pairs.append(("q", q.text))
        if q.sort != "created":
            pairs.append(("sort", q.sort))
        if q.order != "desc":
            pairs.append(("order", q.order))
        if q.page != 1:
            pairs.append(("page", str(q.page)))
        return urlencode(pairs)

    @property
    def filtered(self) -> bool:
        return bool(
            self.reasons or self.state or self.since or self.until or self.meta or self.text
        )


def _day(value: str, name: str) -> float:
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%d"))
    except ValueError:
        raise BadQuery(f"{name} takes a date as YYYY-MM-DD, got {value!r}") from None


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = [v.strip() for v in params.get(name, ()) if v.strip()]
    return values[-1] if values else None


def parse_query(params: Mapping[str, Sequence[str]]) -> Query:
    """Read a query from URL parameters (``reason`` and ``meta`` may repeat).

    Raises:
        BadQuery: a value is not usable (the message says which and how).
    """
    reasons = tuple(dict.fromkeys(r.strip() for r in params.get("reason", ()) if r.strip()))
    state = _one(params, "state")
    if state is not None and state not in STATES:
        raise BadQuery(f"state must be one of {', '.join(STATES)}, got {state!r}")
    since, until = _one(params, "since"), _one(params, "until")
    if since:
        _day(since, "since")
    if until:
        _day(until, "until")
    meta: list[tuple[str, str | None]] = []
    for raw in params.get("meta", ()):
        for part in raw.split("&"):
            part = part.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            if not key.strip():
                raise BadQuery(f"meta takes key=value (or key), got {part!r}")
            meta.append((key.strip(), value.strip() if sep else None))
    sort = _one(params, "sort") or "created"
    if sort not in SORTS:
        raise BadQuery(f"sort must be one of {', '.join(SORTS)}, got {sort!r}")
    order = _one(params, "order") or "desc"
    if order not in ("asc", "desc"):
        raise BadQuery(f"order must be asc or desc, got {order!r}")
    page_text = _one(params, "page") or "1"
    if not page_text.isdigit() or int(page_text) < 1:
        raise BadQuery(f"page must be a number from 1, got {page_text!r}")
    return Query(
        reasons=reasons,
        state=state,
        since=since,
        until=until,
        meta=tuple(meta),
        text=_one(params, "q") or "",
        sort=sort,
        order=order,
        page=int(page_text),
    )


def _lookup(metadata: Mapping[str, Any] | None, key: str) -> tuple[bool, Any]:
    if metadata is None:
        return False, None
    if key in metadata:
        return True, metadata[key]
    node: Any = metadata
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def meta_text(value: Any) -> str:
    """A metadata value as filters compare it: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def select(rows: Sequence[RunRow], q: Query, now: float) -> list[RunRow]:
    """The rows matching ``q``'s filters, in its sort order (all pages)."""
    out = list(rows)
    if q.reasons:
        out = [r for r in out if r.stop_reason in q.reasons]
    if q.state == "running":
        out = [r for r in out if r.status != "ended"]
    elif q.state:
        out = [r for r in out if r.state == q.state]
    if q.since:
        start = _day(q.since, "since")
        out = [r for r in out if r.created_at >= start]
    if q.until:
        end = _day(q.until, "until") + 86400
        out = [r for r in out if r.created_at < end]
    for key, value in q.meta:
        kept = []
        for r in out:
            found, v = _lookup(r.metadata, key)
            if found and (value is None or meta_text(v) == value):
                kept.append(r)
        out = kept
    if q.text:
        needle = q.text.lower()
        out = [r for r in out if r.run_id.startswith(q.text) or needle in r.goal.lower()]
    keys = {
        "created": lambda r: (r.created_at, r.run_id),
        "steps": lambda r: (r.steps_used, r.created_at),
        "actions": lambda r: (r.actions_executed, r.created_at),
        "duration": lambda r: (r.duration_s(now), r.created_at),
        "stop_reason": lambda r: (r.stop_reason or "~running", r.created_at),
    }
    out.sort(key=keys[q.sort], reverse=q.order == "desc")
    return out
