"""The write-ahead protocol's SQL that the SQLite and the PostgreSQL journal both speak: one
text per state transition, written with SQLite's ``?`` placeholders.

Each dialect's schema is its own module, readable on its own
(:mod:`polyloop.journal._sqlite_schema`, :mod:`polyloop.journal.postgres._schema`); what they
share is the ``steps`` columns (one per StepRecord field) and the statuses a run may be in. The
statements below are the same text in both; where the dialects differ, the difference is named
and lives with its dialect:

=================  ==========================================================================
placeholders       ``?`` here; PostgreSQL's ``%s`` by ``postgres._sql.pg`` (and named
                   ``%(name)s`` parameters in the statements only PostgreSQL has)
types              SQLite ``REAL``, PostgreSQL ``DOUBLE PRECISION`` (``postgres._schema``);
                   JSON is ``TEXT`` in both (canonical JSON, read back by ``json.loads``)
upserts            the same ``ON CONFLICT ... DO UPDATE SET ... = excluded...`` in both
                   (``UPSERT_SET``, also in PostgreSQL's batch insert)
the fence          SQLite: ``_sqlite_schema._COUNT_STEPS`` / ``owner = owner`` under the write
                   lock, or from memory (``PRAGMA data_version``); PostgreSQL: the version-
                   checked update of ``postgres._sql._FENCE`` (0 rows aborts the transaction)
locking            SQLite: ``BEGIN IMMEDIATE`` holds the file's write lock; PostgreSQL locks
                   the run row with ``FOR UPDATE`` (``postgres._sql``)
the clock          SQLite: the journal's clock, as a parameter; PostgreSQL: the server's
                   (``statement_timestamp()``) unless a clock is injected
NUL characters     SQLite text holds them; PostgreSQL's cannot: U+FFFD stands in for NUL in
                   the projection columns (``postgres._sql.no_nul``), the records keep it
=================  ==========================================================================
"""

from __future__ import annotations

from dataclasses import fields
from typing import Final

from ..types import StepRecord

# -- what both schemas hold alike --------------------------------------------------------------

# One column per StepRecord field, same names and order (kernel.md §7), SQLite's declarations
# (PostgreSQL's are these with DOUBLE PRECISION for REAL).
STEP_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("step_idx", "INTEGER NOT NULL"),
    ("raw_response", "TEXT NOT NULL"),
    ("response_chars", "INTEGER NOT NULL"),
    ("reasoning_chars", "INTEGER NOT NULL"),
    ("action", "TEXT"),
    ("parse_ok", "INTEGER NOT NULL"),
    ("parse_error", "TEXT"),
    ("observation", "TEXT"),
    ("observation_synthetic", "INTEGER NOT NULL"),
    ("observation_truncated_chars", "INTEGER NOT NULL"),
    ("prompt_chars", "INTEGER NOT NULL"),
    ("llm_call_id", "TEXT"),
    ("step_wall_ms", "REAL NOT NULL"),
    ("tool_name", "TEXT"),
    ("tool_args_json", "TEXT"),
    ("action_status", "TEXT"),
    ("completed", "INTEGER NOT NULL"),
    ("schema_version", "TEXT NOT NULL"),
    ("replaced_chars", "INTEGER NOT NULL DEFAULT 0"),  # journal schema 1.1
    ("model", "TEXT"),  # journal schema 1.2
    ("wrap_up", "INTEGER NOT NULL DEFAULT 0"),  # journal schema 1.3
    ("outcome_unknown", "TEXT"),  # journal schema 1.4
)
STEP_NAMES: Final = tuple(name for name, _ in STEP_COLUMNS)
STEP_BOOLS: Final = frozenset({"parse_ok", "observation_synthetic", "completed", "wrap_up"})
"""The ``steps`` columns holding a boolean, as 0/1 in both dialects (``WHERE completed = 1``)."""
assert tuple(f.name for f in fields(StepRecord)) == STEP_NAMES, (
    "the steps table must have one column per StepRecord field: update STEP_COLUMNS"
)

STATUS_CHECK: Final = "CHECK (status IN ('running', 'ended', 'awaiting_approval'))"
"""``runs.status``: ``awaiting_approval`` since journal schema 1.4."""
REQUEST_COLUMNS: Final = ("request", "request_reason", "requested_by", "requested_at")
"""The ``runs`` columns of a request to end the run (journal schema 1.3)."""

# -- creating and reading a run ------------------------------------------------------------------

RUN_FOUND: Final = "SELECT 1 FROM runs WHERE run_id = ?"
READ_RUN: Final = """SELECT goal, history_json, metadata_json, limits_json, wording_version,
    created_at, journal_schema_version FROM runs WHERE run_id = ?"""
READ_RECORDS: Final = "SELECT seq, kind, body FROM journal WHERE run_id = ? ORDER BY seq"
LAST_SEQ: Final = "SELECT coalesce(max(seq), 0) FROM journal WHERE run_id = ?"
NEXT_SEQ: Final = "SELECT coalesce(max(seq), 0) + 1 FROM journal WHERE run_id = ?"

# -- the lease -------------------------------------------------------------------------------------

LEASE_OF: Final = "SELECT owner, lease_expires_at FROM runs WHERE run_id = ?"
RELEASE: Final = (
    "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE run_id = ? AND owner = ?"
)
# When a run changes hands, its counters are counted again from ``steps``: a journal written
# before they were kept current per step left them at 0 until the end.
STEPS_COUNTED: Final = """steps_used = (SELECT count(*) FROM steps s WHERE s.run_id = runs.run_id),
    actions_executed = (SELECT count(*) FROM steps s WHERE s.run_id = runs.run_id
        AND s.action_status = 'executed')"""

# -- a step's rows (after the fence, in the append's transaction) --------------------------------

INSERT_JOURNAL: Final = (
    "INSERT INTO journal (run_id, seq, kind, body, written_at) VALUES (?, ?, ?, ?, ?)"
)
INSERT_STEP: Final = (
    f"INSERT INTO steps (run_id, {', '.join(STEP_NAMES)}) VALUES (?{', ?' * len(STEP_NAMES)})"
)
# A model intent's accounts row; an intent's next attempt finds the earlier ones still pending
# only when their answer was lost (a crash between intent and result): ``uncertain``.
INSERT_INTENT: Final = """INSERT INTO model_calls (run_id, step_idx, intent_id, attempt, model,
    state) VALUES (?, ?, ?, ?, ?, 'pending')"""
MARK_UNCERTAIN: Final = """UPDATE model_calls SET state = 'uncertain'
    WHERE intent_id = ? AND attempt < ? AND state = 'pending'"""
# An attempt's outcome: the row its intent inserted, or a new one (an intent written by an
# older version, or lost).
UPSERT_SET: Final = """
    ON CONFLICT (intent_id, attempt) DO UPDATE SET llm_call_id = excluded.llm_call_id,
        state = excluded.state, input_tokens = excluded.input_tokens,
        output_tokens = excluded.output_tokens, latency_ms = excluded.latency_ms,
        error = excluded.error, response_model = excluded.response_model,
        cached_tokens = excluded.cached_tokens, reasoning_tokens = excluded.reasoning_tokens,
        cost_usd = excluded.cost_usd, logprobs = excluded.logprobs"""
UPSERT_CALL: Final = (
    """INSERT INTO model_calls (run_id, step_idx, intent_id, attempt, llm_call_id,
        state, input_tokens, output_tokens, latency_ms, error, response_model, cached_tokens,
        reasoning_tokens, cost_usd, logprobs)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"""
    + UPSERT_SET
)
# An answered attempt's log-probabilities (journal schema 2.1), put back on its ModelResult by
# every reader of the run's records (``_rows._parse_run``).
READ_LOGPROBS: Final = """SELECT intent_id, attempt, logprobs FROM model_calls
    WHERE run_id = ? AND logprobs IS NOT NULL"""
CALLS: Final = {"intent": INSERT_INTENT, "uncertain": MARK_UNCERTAIN, "upsert": UPSERT_CALL}
"""The ``model_calls`` statement of each op of an append's accounts (``_rows._Append.calls``)."""
# A parked run (journal schema 1.4): ``awaiting_approval`` with its approval request,
# ``running`` again with the decision.
SET_STATUS: Final = "UPDATE runs SET status = ? WHERE run_id = ?"
# The end record: attempts still pending are lost, the run's end columns are set and the lease
# released, in the end record's transaction.
END_PENDING: Final = (
    "UPDATE model_calls SET state = 'uncertain' WHERE run_id = ? AND state = 'pending'"
)
END_RUN: Final = """UPDATE runs SET status = 'ended', stop_reason = ?, stop_detail = ?,
    final_answer = ?, steps_used = ?, actions_executed = ?, ended_at = ?, tokens_used = ?,
    cost_usd = ?, active_seconds = ?, usage_missing = ?, owner = NULL,
    lease_expires_at = NULL WHERE run_id = ?"""

# -- requests to end a run (journal schema 1.3; never fenced: the requester holds no lease) -----

REQUEST_OF: Final = f"SELECT {', '.join(REQUEST_COLUMNS)} FROM runs WHERE run_id = ?"
# The run's state a request is decided on (``_request_rows.request_answer`` reads it).
REQUEST_STATE_COLUMNS: Final = """status, owner, lease_expires_at, stop_reason, stop_detail,
    request, request_reason, requested_by, requested_at"""
REQUEST_STATE: Final = f"SELECT {REQUEST_STATE_COLUMNS} FROM runs WHERE run_id = ?"
WRITE_REQUEST: Final = """UPDATE runs SET request = ?, request_reason = ?, requested_by = ?,
    requested_at = ? WHERE run_id = ?"""

# -- a person's decision on a parked run's action (journal schema 1.4) -------------------------

RUN_STATUS: Final = "SELECT status FROM runs WHERE run_id = ?"
APPROVAL_RECORDS: Final = """SELECT body FROM journal
    WHERE run_id = ? AND kind IN ('approval_requested', 'approval_decided') ORDER BY seq"""
# Each parked run's last request and the action intent written just before it.
PENDING_APPROVALS: Final = """SELECT r.run_id, a.body, i.body FROM runs AS r
    JOIN journal AS a ON a.run_id = r.run_id AND a.kind = 'approval_requested'
        AND a.seq = (SELECT max(seq) FROM journal
                     WHERE run_id = r.run_id AND kind = 'approval_requested')
    JOIN journal AS i ON i.run_id = r.run_id AND i.seq = a.seq - 1
    WHERE r.status = 'awaiting_approval'"""
DECIDED: Final = "UPDATE runs SET status = 'running' WHERE run_id = ?"

# -- the requests table: the run's retunes, each a row (journal schema 2.1; never fenced) --------

# Not among the tables a journal must have: one of 2.0 lacks it until a writer opens it (and
# creates it, IF NOT EXISTS, as for a new journal). PostgreSQL's is this with DOUBLE PRECISION.
REQUESTS_DDL: Final = """CREATE TABLE IF NOT EXISTS requests (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    values_json TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    reason TEXT,
    requested_at REAL NOT NULL,
    applied_at REAL,
    outcome TEXT,
    PRIMARY KEY (run_id, seq)
)"""
REQUEST_ROW_COLUMNS: Final = """run_id, seq, kind, values_json, requested_by, reason,
    requested_at, applied_at, outcome"""
INSERT_REQUEST_ROW: Final = f"""INSERT INTO requests ({REQUEST_ROW_COLUMNS})
    VALUES (?, (SELECT coalesce(max(seq), 0) + 1 FROM requests WHERE run_id = ?), ?, ?, ?, ?, ?,
        NULL, NULL)"""
LAST_REQUEST_SEQ: Final = "SELECT max(seq) FROM requests WHERE run_id = ?"
# What a run's owner has not applied yet (read with its lease: ``acquire``, ``renew``).
PENDING_LIMITS: Final = f"""SELECT {REQUEST_ROW_COLUMNS} FROM requests
    WHERE run_id = ? AND kind = 'limits' AND applied_at IS NULL ORDER BY seq"""
SETTLE_REQUEST: Final = """UPDATE requests SET applied_at = ?, outcome = ?
    WHERE run_id = ? AND seq = ? AND applied_at IS NULL"""
RUN_REQUESTS: Final = f"SELECT {REQUEST_ROW_COLUMNS} FROM requests WHERE run_id = ? ORDER BY seq"
