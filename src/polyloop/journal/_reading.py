"""What the journals' readers give (``list_runs``, ``step_usage``): one SQL text for both SQL
backends (the ``runs`` row, with the attempts' usage from ``model_calls`` aggregated in the
database) and the same sums kept in memory by :class:`~polyloop.journal.memory.MemoryJournal`.

The names are the tables' own: per step, the ``model_calls`` columns ``input_tokens``,
``output_tokens``, ``cached_tokens``, ``reasoning_tokens`` and ``cost_usd`` summed over the
step's attempts (None when no attempt reported that number); per run, the ``runs`` totals
``tokens_used``, ``cost_usd``, ``active_seconds``, ``usage_missing`` and the four token sums.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ..types import ModelResult, RunTotals
from ._state import run_state

__all__ = [
    "STEP_USAGE_FIELDS",
    "UsageSums",
    "check_page",
    "list_runs_sql",
    "listed_row",
    "run_filters",
    "run_totals",
    "step_usage_query",
]

STEP_USAGE_FIELDS: tuple[str, ...] = (
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_usd",
)
"""The per-step usage fields, in this order (the ``model_calls`` columns they sum)."""

_TOTALS = ("tokens_used", "cost_usd", "active_seconds", "usage_missing")
_CALLS_COST = "calls_cost_usd"  # the aggregate's own name for its cost sum (runs has cost_usd)


def _sums(have: Collection[str]) -> str:
    """The ``sum(...)`` of each usage column ``model_calls`` has (NULL for one it lacks: a
    journal of an older minor, read without migrating it)."""
    out = []
    for name in STEP_USAGE_FIELDS:
        alias = _CALLS_COST if name == "cost_usd" else name
        out.append(f"sum({name}) AS {alias}" if name in have else f"NULL AS {alias}")
    return ", ".join(out)


def step_usage_query(have: Collection[str] = STEP_USAGE_FIELDS) -> str:
    """The per-step sums of one run (parameter: the run id, as ``?``), by ``step_idx``."""
    return (
        f"SELECT step_idx, {_sums(have)} FROM model_calls WHERE run_id = ? "
        "GROUP BY step_idx ORDER BY step_idx"
    )


def list_runs_usage(
    run_filter: str, runs_have: Collection[str] = _TOTALS, calls_have: Collection[str] = ()
) -> tuple[str, str]:
    """For ``list_runs``: (the select list of the totals, the ``LEFT JOIN`` of the attempts'
    aggregate, keyed by run_id). ``run_filter`` (``"WHERE run_id = ?"`` or ``""``) narrows the
    aggregate to the run asked for. A run whose row has no totals (not ended, or ended before
    they were kept) gets them from its attempts: tokens and cost summed (0 when none was
    reported), ``usage_missing`` the replies without usage, ``active_seconds`` NULL (known
    only to the process driving it)."""
    calls = set(calls_have) or set(STEP_USAGE_FIELDS)

    def runs_col(name: str) -> str:
        return f"r.{name}" if name in runs_have else "NULL"

    select = (
        f"coalesce({runs_col('tokens_used')}, "
        "coalesce(u.input_tokens, 0) + coalesce(u.output_tokens, 0)) AS tokens_used, "
        f"coalesce({runs_col('cost_usd')}, u.{_CALLS_COST}, 0.0) AS cost_usd, "
        f"{runs_col('active_seconds')} AS active_seconds, "
        f"coalesce({runs_col('usage_missing')}, u.no_usage, 0) AS usage_missing, "
        "u.input_tokens, u.output_tokens, u.cached_tokens, u.reasoning_tokens"
    )
    join = (
        f"LEFT JOIN (SELECT run_id, {_sums(calls)}, "
        "sum(CASE WHEN state = 'ok' AND input_tokens IS NULL AND output_tokens IS NULL "
        "THEN 1 ELSE 0 END) AS no_usage "
        f"FROM model_calls {run_filter} GROUP BY run_id) u ON u.run_id = r.run_id"
    )
    return select, join


def run_filters(
    status: str | None, run_id: str | None, placeholder: str
) -> tuple[str, tuple[str, ...]]:
    """``list_runs``' WHERE clause and its parameters: only the filters given, so that a run id
    is looked up by the primary key (both backends)."""
    pairs = (("status", status), ("run_id", run_id))
    given = [(column, value) for column, value in pairs if value is not None]
    if not given:
        return "", ()
    where = " AND ".join(f"r.{column} = {placeholder}" for column, _ in given)
    return f"WHERE {where}", tuple(value for _, value in given)


def list_runs_sql(
    status: str | None,
    run_id: str | None,
    *,
    requests: str,
    runs_have: Collection[str] = _TOTALS,
    calls_have: Collection[str] = (),
    collate: str = "",
    after: tuple[float, str] | None = None,
    limit: int | None = None,
) -> tuple[str, tuple[Any, ...]]:
    """``list_runs``' query (``?`` placeholders) and its parameters: the ``runs`` columns but
    ``history_json`` (``requests``: the select list of the request columns), the usage of
    :func:`list_runs_usage`; oldest first (``collate``: the run ids' collation). A page:
    ``after`` (the ``(created_at, run_id)`` of the last run of the previous page) keeps the
    runs after it in that order, ``limit`` the first so many (see :func:`check_page`)."""
    where, filters = run_filters(status, run_id, "?")
    params: tuple[Any, ...] = filters
    if after is not None:
        keyset = f"(r.created_at > ? OR (r.created_at = ? AND r.run_id{collate} > ?))"
        where = f"{where} AND {keyset}" if where else f"WHERE {keyset}"
        params = (*params, after[0], after[0], after[1])
    order = f"ORDER BY created_at, r.run_id{collate}"
    tail: tuple[Any, ...] = () if limit is None else (limit,)
    cut = "" if limit is None else " LIMIT ?"
    head: tuple[Any, ...] = ()
    run_filter = ""
    if run_id:
        run_filter, head = "WHERE run_id = ?", (run_id,)
    elif after is not None or limit is not None:
        # A page sums the attempts of its own runs, not of the whole journal.
        run_filter = f"WHERE run_id IN (SELECT r.run_id FROM runs r {where} {order}{cut})"
        head = params + tail
    usage, join = list_runs_usage(run_filter, runs_have, calls_have)
    # A running run still at 0 steps may come from a journal written before the counters were
    # kept current per step: counted from ``steps`` (nothing to count for a new run).
    query = f"""SELECT r.run_id, status, stop_reason, stop_detail, final_answer,
        CASE WHEN status = 'ended' OR steps_used > 0 THEN steps_used
             ELSE (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) END
            AS steps_used,
        CASE WHEN status = 'ended' OR steps_used > 0 THEN actions_executed
             ELSE (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id
                   AND s.action_status = 'executed') END AS actions_executed,
        created_at, ended_at, owner, lease_expires_at, wording_version,
        journal_schema_version, {requests}, goal, limits_json, metadata_json, {usage}
    FROM runs r {join} {where} {order}{cut}"""
    return query, head + params + tail


def check_page(after: Any, limit: Any) -> tuple[tuple[float, str] | None, int | None]:
    """``list_runs``' page arguments, checked where they enter: ``after`` None or a
    ``(created_at, run_id)`` pair (a number, a string), ``limit`` None or an int >= 1.
    Raises ``ValueError`` (one line) for anything else."""
    if after is not None:
        ok = isinstance(after, tuple | list) and len(after) == 2
        if not ok or isinstance(after[0], bool) or not isinstance(after[0], int | float):
            raise ValueError(
                f"list_runs after= takes (created_at, run_id) of a listed run, got {after!r}"
            )
        if not isinstance(after[1], str):
            raise ValueError(f"list_runs after= takes a run id string second, got {after!r}")
        after = (float(after[0]), after[1])
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"list_runs limit= takes a whole number >= 1 or None, got {limit!r}")
    return after, limit


def listed_row(names: Sequence[str], row: Sequence[Any], now: float) -> dict[str, Any]:
    """One row of :func:`list_runs_sql` as ``list_runs`` gives it: ``metadata`` and
    ``limits`` decoded, and the derived ``state`` (on the clock reading ``now``)."""
    d = dict(zip(names, row, strict=True))
    d["limits"] = json.loads(d.pop("limits_json"))
    meta = d.pop("metadata_json")
    d["metadata"] = None if meta is None else json.loads(meta)
    d["state"] = run_state(d["status"], d["owner"], d["lease_expires_at"], now)
    return d


def _add(a: Any, b: Any) -> Any:
    if b is None:
        return a
    return b if a is None else a + b


@dataclass(slots=True)
class UsageSums:
    """The usage fields summed over attempts (None: no attempt reported that number)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_usd: float | None = None
    no_usage: int = 0
    """Attempts answered with no usage at all."""

    def add(self, result: ModelResult) -> None:
        u = result.reply.usage
        self.cost_usd = _add(self.cost_usd, result.cost_usd)
        if u is None or (u.input_tokens is None and u.output_tokens is None):
            self.no_usage += 1
        if u is None:
            return
        self.input_tokens = _add(self.input_tokens, u.input_tokens)
        self.output_tokens = _add(self.output_tokens, u.output_tokens)
        self.cached_tokens = _add(self.cached_tokens, u.cached_tokens)
        self.reasoning_tokens = _add(self.reasoning_tokens, u.reasoning_tokens)

    def step_fields(self) -> dict[str, Any]:
        """The :data:`STEP_USAGE_FIELDS` of these sums."""
        return {name: getattr(self, name) for name in STEP_USAGE_FIELDS}


def run_totals(totals: RunTotals | None, sums: UsageSums) -> dict[str, Any]:
    """A run's usage fields as ``list_runs`` gives them (see :func:`list_runs_usage`), from
    its end record's totals (None: not ended, or ended before they were kept) and the sums
    of its attempts."""
    head: dict[str, Any]
    if totals is not None:
        head = {
            "tokens_used": totals.tokens,
            "cost_usd": totals.cost_usd,
            "active_seconds": totals.active_s,
            "usage_missing": totals.usage_missing,
        }
    else:
        head = {
            "tokens_used": (sums.input_tokens or 0) + (sums.output_tokens or 0),
            "cost_usd": sums.cost_usd or 0.0,
            "active_seconds": None,
            "usage_missing": sums.no_usage,
        }
    fields = sums.step_fields()
    del fields["cost_usd"]
    return {**head, **fields}
