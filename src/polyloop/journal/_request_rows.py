"""A request to end a run as the ``runs`` row's request columns hold it (``request``,
``request_reason``, ``requested_by``, ``requested_at``), and what a request does to a run in
the state its row describes: shared by the SQLite and PostgreSQL journals."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from ..types import EndRequest, RequestResult, StopReason
from ._state import lease_is_live


def stored_request(kind: object, reason: object, by: object, at: object) -> EndRequest | None:
    """The request of a ``runs`` row's request columns (any backend), or None."""
    if kind not in ("stop", "cancel"):
        return None
    return EndRequest(
        "stop" if kind == "stop" else "cancel",
        None if reason is None else str(reason),
        "" if by is None else str(by),
        float(at or 0.0),  # type: ignore[arg-type]
    )


def request_row(request: EndRequest) -> tuple[str, str | None, str, float]:
    """The request columns' values for ``request``: request, request_reason, requested_by,
    requested_at."""
    return (request.kind, request.reason, request.by, request.at)


def _known_reason(value: object) -> str | None:
    """A stored stop reason: the ``StopReason`` when this version knows it, else the string."""
    if value is None:
        return None
    try:
        return StopReason(str(value))
    except ValueError:
        return str(value)


def request_answer(
    run_id: str, request: EndRequest, row: Sequence[Any], now: float
) -> tuple[RequestResult | None, EndRequest | None, bool]:
    """What ``request`` does to a run whose ``_sql.REQUEST_STATE`` row is ``row``, at ``now``
    (epoch seconds, the clock leases are decided on), in the order the ``EndRequests`` seam
    gives (any backend): (the answer, or None when the run ends now; the request in force;
    whether ``request`` is written)."""
    status, owner, expiry, reason, detail, *columns = row
    stored = stored_request(*columns)
    if status == "ended":  # a parked run ('awaiting_approval') takes requests like any other
        ended = RequestResult(run_id, "already_ended", stored, _known_reason(reason), detail)
        return ended, stored, False
    writes = request.replaces(stored)
    in_force = request if writes else stored
    if lease_is_live(owner, expiry, now):
        happened: Literal["requested", "already_requested"] = (
            "requested" if writes else "already_requested"
        )
        return RequestResult(run_id, happened, in_force), in_force, writes
    return None, in_force, writes
