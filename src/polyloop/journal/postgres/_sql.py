"""The PostgreSQL journal's statements: those only PostgreSQL has (the claim, the version
fence, group commit's batch inserts, the row locks), the statements both journals speak
(:mod:`polyloop.journal._sql`) in PostgreSQL's placeholders, and the one value rule of its
dialect: text cannot hold NUL."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

from .. import _observations, _sql
from .._sql import (
    REQUEST_STATE_COLUMNS,
    RUN_STATUS,
    STEP_NAMES,
    STEPS_COUNTED,
    UPSERT_SET,
)
from ._schema import _TABLE_COLUMNS

FOR_UPDATE: Final = " FOR UPDATE"
"""Locks the rows a query reads until the transaction ends (SQLite's ``BEGIN IMMEDIATE``
locks the whole file instead)."""


def pg(query: str) -> str:
    """A statement of :mod:`polyloop.journal._sql` with PostgreSQL's placeholders (``%s``)."""
    return query.replace("?", "%s")


def no_nul(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: U+FFFD stands in for it in the projection columns."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", "\ufffd")
    return value


def clean(row: Sequence[Any]) -> tuple[Any, ...]:
    """``row`` with :func:`no_nul` applied to each value."""
    return tuple(no_nul(v) for v in row)


# -- the statements only PostgreSQL has -----------------------------------------------------------

# Epoch seconds now: the injected clock's when one is passed, else the server's.
NOW = (
    "coalesce(%(now)s::double precision, "
    "extract(epoch from statement_timestamp())::double precision)"
)
INSERT_RUN = f"""INSERT INTO runs (run_id, owner, lease_expires_at, version, status, created_at,
    journal_schema_version, wording_version, goal, limits_json, metadata_json, history_json)
    VALUES (%(run_id)s, %(owner)s, {NOW} + %(ttl)s, 1, 'running', %(created_at)s,
    %(journal_version)s, %(wording)s, %(goal)s, %(limits)s, %(metadata)s, %(history)s)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING version"""
# Claiming also counts the run's counters again from ``steps`` (a journal written before they
# were kept current per step left them at 0 until the end).
CLAIM = f"""UPDATE runs SET owner = %(owner)s, lease_expires_at = {NOW} + %(ttl)s,
        version = version + 1,
        {STEPS_COUNTED}
    WHERE run_id = %(run_id)s AND (owner IS NULL OR lease_expires_at IS NULL
        OR lease_expires_at <= {NOW} OR owner = %(dead)s::text)
    RETURNING version, request, request_reason, requested_by, requested_at"""
# The fence. 0 rows (another execution owns the run) must stop the whole transaction, which is
# sent in one round trip with the rows it guards: dividing by the row count raises
# division_by_zero, PostgreSQL aborts the transaction and skips every statement after it. The
# same update moves the run's counters by the append's steps (the end record then sets them).
FENCE = """WITH fenced AS (
        UPDATE runs SET version = version + 1, steps_used = steps_used + %(steps)s,
            actions_executed = actions_executed + %(executed)s
        WHERE run_id = %(run_id)s AND owner = %(owner)s AND version = %(version)s
        RETURNING 1)
    SELECT 1 / (SELECT count(*) FROM fenced)::integer"""
# The fence of a batch of appends (group commit): one statement for all their runs. Fewer rows
# than appends (one of them fenced out) raises division_by_zero: the batch rolls back and each
# append runs again alone, so that only the fenced-out one fails.
FENCE_MANY = """WITH fenced AS (
        UPDATE runs SET version = runs.version + 1, steps_used = runs.steps_used + f.steps,
            actions_executed = runs.actions_executed + f.executed
        FROM unnest(%(run_ids)s::text[], %(owners)s::text[], %(versions)s::bigint[],
                %(steps)s::integer[], %(executed)s::integer[])
            AS f(run_id, owner, version, steps, executed)
        WHERE runs.run_id = f.run_id AND runs.owner = f.owner AND runs.version = f.version
        RETURNING 1)
    SELECT 1 / ((SELECT count(*) FROM fenced) = %(n)s)::integer"""


def _insert_many(table: str, columns: Sequence[tuple[str, str]], tail: str = "") -> str:
    """One ``INSERT`` of any number of rows: a parameter per column, each an array of that
    column's values (``unnest``), so the text is the same for every batch size."""
    types = [re.match(r"DOUBLE PRECISION|\w+", decl).group() for _, decl in columns]  # type: ignore[union-attr]
    arrays = ", ".join(f"%s::{t}[]" for t in types)
    names = ", ".join(name for name, _ in columns)
    return f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}){tail}"


MANY_JOURNAL = _insert_many("journal", _TABLE_COLUMNS["journal"])
MANY_STEPS = _insert_many("steps", _TABLE_COLUMNS["steps"])
MANY_INTENTS = (
    "INSERT INTO model_calls (run_id, step_idx, intent_id, attempt, model, state) "
    "SELECT *, 'pending' FROM unnest(%s::text[], %s::integer[], %s::text[], %s::integer[], "
    "%s::text[])"
)
# The columns of an attempt's outcome (``call_row``): every column but ``model``, which its
# intent wrote.
CALL_COLUMNS: Final = tuple(
    (n, "TEXT" if n == "state" else d) for n, d in _TABLE_COLUMNS["model_calls"] if n != "model"
)
MANY_CALLS = _insert_many(
    "model_calls",
    CALL_COLUMNS,
    UPSERT_SET,
)
RENEW = f"""UPDATE runs SET lease_expires_at = {NOW} + %(ttl)s
    WHERE run_id = %(run_id)s AND owner = %(owner)s
    RETURNING request, request_reason, requested_by, requested_at"""
# A request to end a run (journal schema 1.3): the row locked while the request is decided (two
# requests, a claim and an append of the run wait for each other), with the server's clock.
REQUEST_STATE = f"""SELECT {REQUEST_STATE_COLUMNS}, {NOW}
    FROM runs WHERE run_id = %(run_id)s{FOR_UPDATE}"""
# Ending a run nobody holds: the lease is taken for the transaction (the end record releases
# it) and the version moves, so a stale owner's next append is fenced out.
TAKE_TO_END = """UPDATE runs SET owner = %s, lease_expires_at = NULL, version = version + 1
    WHERE run_id = %s"""
# A person's decision (journal schema 1.4): the run row locked while it is decided.
APPROVAL_STATE = pg(RUN_STATUS) + FOR_UPDATE
# By name, not ``SELECT *`` as SQLite reads them: a PostgreSQL journal is migrated when it is
# opened, so it has every column; and a prepared ``SELECT *`` fails ("cached plan must not change
# result type") once a newer minor adds a column while this journal is open.
READ_STEPS = f"""SELECT {", ".join(STEP_NAMES)} FROM steps
    WHERE run_id = %s ORDER BY step_idx"""

# -- the statements both journals speak, in PostgreSQL's placeholders ----------------------------

APPROVAL_RECORDS = pg(_sql.APPROVAL_RECORDS)
DECIDED = pg(_sql.DECIDED)
END_PENDING = pg(_sql.END_PENDING)
END_RUN = pg(_sql.END_RUN)
INSERT_INTENT = pg(_sql.INSERT_INTENT)
INSERT_JOURNAL = pg(_sql.INSERT_JOURNAL)
INSERT_STEP = pg(_sql.INSERT_STEP)
LAST_SEQ = pg(_sql.LAST_SEQ)
LEASE_OF = pg(_sql.LEASE_OF)
MARK_UNCERTAIN = pg(_sql.MARK_UNCERTAIN)
NEXT_SEQ = pg(_sql.NEXT_SEQ)
PENDING_APPROVALS = _sql.PENDING_APPROVALS
READ_LARGE = pg(_observations.READ_LARGE)
READ_LOGPROBS = pg(_sql.READ_LOGPROBS)
READ_RECORDS = pg(_sql.READ_RECORDS)
READ_RUN = pg(_sql.READ_RUN)
RELEASE = pg(_sql.RELEASE)
RUN_FOUND = pg(_sql.RUN_FOUND)
SET_STATUS = pg(_sql.SET_STATUS)
UPSERT_CALL = pg(_sql.UPSERT_CALL)
CALLS: Final = {op: pg(query) for op, query in _sql.CALLS.items()}
WRITE_REQUEST = pg(_sql.WRITE_REQUEST)

# The requests table (journal schema 2.1): the shared statements in PostgreSQL's placeholders.
INSERT_REQUEST_ROW = pg(_sql.INSERT_REQUEST_ROW) + " RETURNING seq"
PENDING_LIMITS = pg(_sql.PENDING_LIMITS)
SETTLE_REQUEST = pg(_sql.SETTLE_REQUEST)
RUN_REQUESTS = pg(_sql.RUN_REQUESTS)
RUN_LOCKED = "SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE"
