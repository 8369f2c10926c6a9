"""Decoding a run from its stored rows, as every reader does: ``SQLiteJournal.read`` and
``steps``, ``PostgresJournal.read`` (the same rows, another driver) and ``check_integrity``
(``polyloop check``), so that the check calls damaged exactly what the readers refuse."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import JournalError, Limits, Record, RunNotFound, RunSpec, StepRecord, record_from_dict
from . import _observations
from ._observations import READ_LARGE, refilled
from ._sqlite_schema import (
    _READ_RECORDS,
    _READ_RUN,
    _READ_STEPS,
    _steps_from_rows,
)
from ._versions import _check_journal_version


def _damaged(run_id: str, seq: int, why: str) -> JournalError:
    return JournalError(
        f"run {run_id!r}: journal record {seq} {why}; the journal is damaged and was not modified"
    )


def _read_run(conn: sqlite3.Connection, run_id: str) -> tuple[RunSpec, tuple[Record, ...]]:
    row = conn.execute(
        _READ_RUN,
        (run_id,),
    ).fetchone()
    if row is None:
        raise RunNotFound(run_id)
    rows = conn.execute(_READ_RECORDS, (run_id,)).fetchall()
    # After the records: a result's steps row was written with it and is never changed.
    large = dict(conn.execute(READ_LARGE, (run_id, _observations.SHARED_ABOVE)).fetchall())
    return _parse_run(run_id, row, rows, large)


def _parse_run(
    run_id: str, row: Sequence[Any], rows: Sequence[Sequence[Any]], large: Mapping[int, str]
) -> tuple[RunSpec, tuple[Record, ...]]:
    """A run's spec and records from its ``runs`` row, ``journal`` rows and large
    ``steps.observation`` texts (``_observations.READ_LARGE``, read after the records; any
    backend).

    Raises:
        JournalError: a field, a record or the ``seq`` numbering is damaged.
    """
    goal, history_json, metadata_json, limits_json, wording, created_at, version = row
    _check_journal_version(version, f"run {run_id!r}")
    try:
        history = json.loads(history_json)
        metadata = None if metadata_json is None else json.loads(metadata_json)
        limits = Limits.from_dict(json.loads(limits_json))
        if not isinstance(history, list) or not (metadata is None or isinstance(metadata, dict)):
            raise TypeError("history must be a list and metadata an object")
    except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        raise JournalError(
            f"run {run_id!r}: its runs row is damaged ({type(exc).__name__}: {exc}); "
            "the journal was not modified"
        ) from exc
    spec = RunSpec(run_id, goal, limits, created_at, tuple(history), metadata, wording)
    records: list[Record] = []
    for expected, (seq, kind, body) in enumerate(rows, start=1):
        if seq != expected:
            raise _damaged(
                run_id, expected, f"is out of order or missing (seq {seq} stands in its place)"
            )
        try:
            data = json.loads(body)
        except (TypeError, ValueError, RecursionError) as exc:  # RecursionError: too deep
            raise _damaged(run_id, seq, f"is not valid JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("kind") != kind:
            raise _damaged(run_id, seq, f"does not match its kind {kind!r}")
        try:
            records.append(refilled(record_from_dict(data), data, records, large))
        except JournalError as exc:
            raise _damaged(run_id, seq, f"cannot be read ({exc})") from exc
    return spec, tuple(records)


def _read_steps(conn: sqlite3.Connection, run_id: str) -> list[StepRecord]:
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        raise RunNotFound(run_id)
    cur = conn.execute(_READ_STEPS, (run_id,))
    names = [d[0] for d in cur.description]
    try:
        return _steps_from_rows(names, cur.fetchall())
    except TypeError as exc:
        raise JournalError(f"run {run_id!r}: a steps row is damaged ({exc})") from exc
