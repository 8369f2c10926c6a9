"""The rows of the write-ahead protocol, made from records on the caller's thread: what one
``append`` writes to ``journal``, ``steps`` and ``model_calls`` and what it changes in ``runs``
(:class:`_Append`); and back: a ``steps`` row as a StepRecord, a run's spec and records from
its ``runs`` and ``journal`` rows. Shared by the SQLite and PostgreSQL journals, whose
statements (:mod:`polyloop.journal._sql`) take these rows as they are, and by
``check_integrity``, so that the check calls damaged exactly what the readers refuse."""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..types import (
    ApprovalDecided,
    ApprovalRequested,
    ErrorInfo,
    JournalError,
    Lease,
    Limits,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelResult,
    Record,
    RunEnd,
    RunSpec,
    StepRecord,
    StepWritten,
    TokenLogprob,
    Usage,
    canonical_json,
    record_from_dict,
)
from ..types._logprob_form import logprobs_from_form, logprobs_json
from ._observations import refilled, stored_json
from ._sql import STEP_BOOLS as _STEP_BOOLS
from ._sql import STEP_NAMES as _STEP_NAMES
from ._state import STATUS_AFTER
from ._versions import _check_journal_version

# -- the runs row's JSON, the accounts' rows, the end's totals -----------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-ready")


def _dumps(value: object, what: str, run_id: str, backend: str = "SQLite") -> str:
    """Canonical JSON of a run's history or metadata (mappings become objects); TypeError
    naming the run and the backend when ``value`` is not JSON-ready."""
    try:
        return json.dumps(
            value,
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            default=_json_default,
        )
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"run {run_id!r}: the {what} must be JSON-ready to be journaled in {backend} ({exc})"
        ) from exc


def spec_json(spec: RunSpec, backend: str = "SQLite") -> tuple[str, str | None, str]:
    """A new run's JSON columns: ``limits_json``, ``metadata_json`` (None: no metadata),
    ``history_json``. TypeError naming the run and ``backend`` for a value not JSON-ready."""
    run_id = spec.run_id
    history = _dumps(list(spec.history), "history", run_id, backend)
    metadata = None
    if spec.metadata is not None:
        metadata = _dumps(dict(spec.metadata), "metadata", run_id, backend)
    return canonical_json(spec.limits.to_dict()), metadata, history


def _error_text(error: ErrorInfo) -> str:
    return f"{error.type}: {error.message} [kind={error.kind}, retryable={error.retryable}]"


def intent_row(run_id: str, r: ModelIntent) -> tuple[Any, ...]:
    """The ``model_calls`` row a model intent inserts (state ``pending``): run_id, step_idx,
    intent_id, attempt, model."""
    return (run_id, r.step_idx, r.intent_id, r.attempt, r.model)


def call_row(run_id: str, r: ModelResult | ModelAttemptFailed | ModelFailure) -> tuple[Any, ...]:
    """The ``model_calls`` row an attempt's outcome upserts: run_id, step_idx, intent_id,
    attempt, llm_call_id, state, input_tokens, output_tokens, latency_ms, error,
    response_model, cached_tokens, reasoning_tokens, cost_usd, logprobs (``model`` stays as
    its intent wrote it; ``logprobs``: :func:`logprobs_text`)."""
    head = (run_id, r.step_idx, r.intent_id, r.attempt)
    if not isinstance(r, ModelResult):
        state = "retried" if isinstance(r, ModelAttemptFailed) else "failed"
        error = _error_text(r.error)
        return (*head, None, state, None, None, r.latency_ms, error, None, None, None, None, None)
    u = r.reply.usage or _NO_USAGE
    return (
        *head,
        r.llm_call_id,
        "ok",
        u.input_tokens,
        u.output_tokens,
        r.latency_ms,
        None,
        r.reply.model,
        u.cached_tokens,
        u.reasoning_tokens,
        r.cost_usd,
        None if r.reply.logprobs is None else logprobs_text(r.reply.logprobs),
    )


_NO_USAGE = Usage()


def logprobs_text(tokens: tuple[TokenLogprob, ...]) -> str:
    """An attempt's ``model_calls.logprobs`` (journal schema 2.1): one JSON array of the chat
    export's form (``types._logprob_form``), their only copy: the ``model_result`` record's
    reply leaves them out (:func:`~polyloop.types.record_json` writes none) and says where they
    are (:data:`LOGPROBS_MARK`)."""
    return json.dumps(logprobs_json(tokens), ensure_ascii=False, separators=(",", ":"))


_LOGPROBS_IN = "logprobs_in"
_RESULT_KIND = '"kind":"model_result",'
LOGPROBS_MARK = f'"kind":"model_result","{_LOGPROBS_IN}":"model_calls",'
"""In the ``journal.body`` of a ``model_result`` whose reply carried log-probabilities: they
are in its attempt's ``model_calls.logprobs``, written in the same transaction. A reader reads
that column (``_sql.READ_LOGPROBS``) only for a run with such a record (:func:`has_logprobs`);
a PolyLoop of 2.0 ignores the key and reads the reply without them."""


def has_logprobs(rows: Iterable[Sequence[Any]]) -> bool:
    """Some of a run's ``journal`` rows (seq, kind, body) keep their log-probabilities in
    ``model_calls`` (:data:`LOGPROBS_MARK`)."""
    return any(kind == "model_result" and LOGPROBS_MARK in body for _, kind, body in rows)


def _with_logprobs(
    record: Record,
    data: Mapping[str, Any],
    logprobs: Mapping[tuple[str, int], str],
    run_id: str,
    seq: int,
) -> Record:
    """``record`` (read from the body ``data``) with its attempt's log-probabilities put back
    on its reply when its body says they are in ``model_calls`` (``logprobs``: the run's
    ``_sql.READ_LOGPROBS`` rows by (intent_id, attempt)); ``JournalError`` when the column is
    missing or damaged."""
    where = data.get(_LOGPROBS_IN)
    if where is None:
        return record
    text = None
    if isinstance(record, ModelResult):
        text = logprobs.get((record.intent_id, record.attempt))
    if where != "model_calls" or text is None or not isinstance(record, ModelResult):
        raise _damaged(
            run_id, seq, f"has {_LOGPROBS_IN}={where!r} but no model_calls.logprobs to read"
        )
    try:
        tokens = logprobs_from_form(json.loads(text))
    except (TypeError, ValueError, KeyError, RecursionError) as exc:
        raise _damaged(
            run_id, seq, f"has a damaged model_calls.logprobs ({type(exc).__name__}: {exc})"
        ) from exc
    return dataclasses.replace(record, reply=dataclasses.replace(record.reply, logprobs=tokens))


# -- one append's rows (on the caller's thread) -------------------------------------------------


@dataclass(slots=True)
class _Append:
    """One ``append``, serialized: every row it writes, ready for the writer."""

    lease: Lease
    rows: list[tuple[str, str]] = field(default_factory=list)
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    """The accounts' writes, in order: (op, its statement's arguments), the statement
    ``_sql.CALLS[op]``: ``intent`` (a model intent's row), ``uncertain`` (before the intent of
    a later attempt: the earlier attempts still pending were lost), ``upsert`` (an attempt's
    outcome)."""
    end: RunEnd | None = None
    executed: int = 0
    """How many of ``steps`` have ``action_status = 'executed'`` (for the run's counters)."""
    status: str | None = None
    """``'awaiting_approval'`` when an ``ApprovalRequested`` is among the records (the run
    parks), ``'running'`` for an ``ApprovalDecided``; else None (unchanged)."""
    end_row: tuple[Any, ...] | None = None
    """``end``'s ``runs`` columns (:func:`_end_row`): all the SQLite writers read of it."""


def _prepare(lease: Lease, records: Sequence[Record]) -> _Append:
    run_id = lease.run_id
    p = _Append(lease)
    for before, r, after in zip((None, *records), records, (*records[1:], None), strict=False):
        body = stored_json(r, before, after)
        match r:
            case ModelIntent():
                if r.attempt > 1:  # earlier attempts of this intent still pending: lost
                    p.calls.append(("uncertain", (r.intent_id, r.attempt)))
                p.calls.append(("intent", intent_row(run_id, r)))
            case ModelResult() | ModelAttemptFailed() | ModelFailure():
                row = call_row(run_id, r)
                p.calls.append(("upsert", row))
                if row[-1] is not None:  # its log-probabilities are in model_calls only
                    body = body.replace(_RESULT_KIND, LOGPROBS_MARK, 1)
            case StepWritten(step):
                p.steps.append((run_id, *_step_row(step)))
                p.executed += step.action_status == "executed"
            case RunEnd():
                p.end = r
                p.end_row = _end_row(r)
            case ApprovalRequested() | ApprovalDecided():
                p.status = STATUS_AFTER[r.kind]
            case _:
                pass
        p.rows.append((r.kind, body))
    return p


def _end_row(end: RunEnd) -> tuple[Any, ...]:
    """The ``runs`` columns an end record sets, in ``_sql.END_RUN``'s order (before the run_id):
    the totals tokens_used, cost_usd, active_seconds, usage_missing are NULL for an end record
    that carries none."""
    t = end.totals
    return (
        end.stop_reason.value,
        end.stop_detail,
        end.final_answer,
        end.steps_used,
        end.actions_executed,
        end.ended_at,
        *((None,) * 4 if t is None else (t.tokens, t.cost_usd, t.active_s, t.usage_missing)),
    )


# -- the steps row ------------------------------------------------------------------------------


_STEP_FIELDS = operator.attrgetter(*_STEP_NAMES)
_ROW_BOOLS = tuple(i for i, name in enumerate(_STEP_NAMES) if name in _STEP_BOOLS)
_ROW_STATUS = _STEP_NAMES.index("action_status")


def _step_row(step: StepRecord) -> list[Any]:
    """A ``steps`` row (without its run_id): the fields in column order, booleans as 0/1,
    ``action_status`` as its string (as ``StepRecord.to_dict()`` gives them; a subclass's
    ``to_dict`` is used as it is, as the journal record's JSON uses it)."""
    if type(step) is not StepRecord:
        d = step.to_dict()
        return [int(d[n]) if n in _STEP_BOOLS else d[n] for n in _STEP_NAMES]
    row = list(_STEP_FIELDS(step))
    for i in _ROW_BOOLS:
        row[i] = int(row[i])
    status = row[_ROW_STATUS]
    if status is not None:
        row[_ROW_STATUS] = status.value
    return row


def _steps_from_rows(names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[StepRecord]:
    """Step records from ``steps`` rows of ``_READ_STEPS``, whose columns are ``names``.

    Raises:
        TypeError: a row is damaged (a field is missing or has the wrong type).
    """
    steps = []
    for row in rows:
        d = dict(zip(names, row, strict=True))
        for name in _STEP_BOOLS:
            if name in d:
                d[name] = bool(d[name])
        steps.append(StepRecord.from_dict(d))
    return steps


def _steps_of(run_id: str, names: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[StepRecord]:
    """A run's step records from its ``steps`` rows (any backend); ``JournalError`` for a
    damaged row."""
    try:
        return _steps_from_rows(names, rows)
    except TypeError as exc:
        raise JournalError(f"run {run_id!r}: a steps row is damaged ({exc})") from exc


# -- a run read back -----------------------------------------------------------------------------


def _damaged(run_id: str, seq: int, why: str) -> JournalError:
    return JournalError(
        f"run {run_id!r}: journal record {seq} {why}; the journal is damaged and was not modified"
    )


def _parse_run(
    run_id: str,
    row: Sequence[Any],
    rows: Sequence[Sequence[Any]],
    large: Mapping[int, str],
    logprobs: Mapping[tuple[str, int], str],
) -> tuple[RunSpec, tuple[Record, ...]]:
    """A run's spec and records from its ``runs`` row, ``journal`` rows, large
    ``steps.observation`` texts (``_observations.READ_LARGE``) and attempts' log-probabilities
    (``_sql.READ_LOGPROBS`` by (intent_id, attempt); may be empty when no record is marked,
    :func:`has_logprobs`), both read after the records (any backend).

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
            record = refilled(record_from_dict(data), data, records, large)
        except JournalError as exc:
            raise _damaged(run_id, seq, f"cannot be read ({exc})") from exc
        records.append(_with_logprobs(record, data, logprobs, run_id, seq))
    return spec, tuple(records)
