"""The ``requests`` table's rows of requests to change a run's budgets, as every backend reads
and writes them (:class:`polyloop.types.LimitsRequest`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..types import LimitsRequest


def limits_row(request: LimitsRequest) -> tuple[Any, ...]:
    """``_sql.INSERT_REQUEST_ROW``'s parameters for ``request``."""
    r = request
    return (r.run_id, r.run_id, "limits", r.values_json(), r.by, r.reason, r.at)


def limits_row_of(r: LimitsRequest) -> tuple[Any, ...]:
    """``request`` as its ``requests`` row (``_sql.REQUEST_ROW_COLUMNS``), once stored."""
    return (
        r.run_id,
        r.seq,
        "limits",
        r.values_json(),
        r.by,
        r.reason,
        r.at,
        r.applied_at,
        r.outcome,
    )


def limits_request(row: Sequence[Any]) -> LimitsRequest:
    """The request of a ``requests`` row (``_sql.REQUEST_ROW_COLUMNS``, kind ``limits``)."""
    run_id, seq, _kind, values, by, reason, at, applied_at, outcome = row
    return LimitsRequest(
        str(run_id),
        LimitsRequest.changes_of(str(values)),
        str(by),
        "" if reason is None else str(reason),
        float(at),
        int(seq),
        None if applied_at is None else float(applied_at),
        None if outcome is None else str(outcome),
    )


def request_dict(row: Sequence[Any]) -> dict[str, Any]:
    """A ``requests`` row as the read-only helpers give it: its columns by name, with
    ``values`` decoded from ``values_json`` (for ``limits``: each budget's ``old`` and
    ``new``)."""
    run_id, seq, kind, values, by, reason, at, applied_at, outcome = row
    return {
        "run_id": run_id,
        "seq": int(seq),
        "kind": kind,
        "values": json.loads(str(values)),
        "requested_by": by,
        "reason": reason,
        "requested_at": float(at),
        "applied_at": None if applied_at is None else float(applied_at),
        "outcome": outcome,
    }
