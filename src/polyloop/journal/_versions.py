"""The versions of a journal's table schema and of its step records: which this PolyLoop
writes, which it reads, what each minor added, and the checks every backend makes at open and
per run (``meta`` and ``runs.journal_schema_version``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..types import STEP_SCHEMA_VERSION, JournalError

JOURNAL_SCHEMA_VERSION = "2.1"
"""Version of the table schema. A newer minor adds only what an older reader can ignore (but
for record kinds: a PolyLoop before 1.4 refuses, with ``JournalError`` naming the kind, to
resume a run whose journal holds an approval record, and reads every other run); a file with
a major version this PolyLoop does not know is refused (``JournalError``), never modified. A
writer that opens a journal of an older version migrates it (adds what the versions since then
added, see ``_ADDED_COLUMNS``, and sets this version in ``meta``); a reader does not need it
migrated.

1.1 added ``steps.replaced_chars`` (``INTEGER NOT NULL DEFAULT 0``); 1.2 added ``steps.model``
and ``model_calls.model``, ``response_model``, ``cached_tokens``, ``reasoning_tokens`` (all
nullable); 1.3 added ``steps.wrap_up``, ``model_calls.cost_usd``, the run's totals
``runs.tokens_used``, ``cost_usd``, ``active_seconds``, ``usage_missing`` (set with the end
record; NULL before) and ``runs.request``, ``request_reason``, ``requested_by``,
``requested_at`` (all nullable: a request to end the run, see
:class:`polyloop.types.EndRequest`); 1.4 added ``steps.outcome_unknown`` (nullable) and
lets ``runs.status`` be ``'awaiting_approval'`` (a run parked until a person decides on an
action: its CHECK constraint is widened in place, which changes no stored row).

2.0 stores a large observation once: the ``step`` record of an action whose observation is longer
than ``_observations.SHARED_ABOVE`` characters leaves it out and names the ``action_result`` record
before it, which holds it or, written in the same append, leaves it to ``steps.observation`` (see
:mod:`polyloop.journal._observations`). The tables are those of 1.4 (``steps.observation`` is filled
as before). A PolyLoop of major 1 would read such a step with no observation, so it refuses the file
(its one-line "upgrade polyloop"); this one reads journals of both majors.

2.1 added the table ``requests`` (a run's requests other than its end request, one row each:
``run_id``, ``seq``, ``kind`` (``limits``), ``values_json``, ``requested_by``, ``reason``,
``requested_at``, ``applied_at``, ``outcome``; see :class:`polyloop.types.LimitsRequest`). A
journal of 2.0 lacks it until a writer opens it; a reader takes its absence for no requests.

2.1 also added ``model_calls.logprobs`` (nullable): an answered attempt's log-probabilities as one
JSON array, when its model recorded them (the ``model_result`` record's reply leaves them out).
A PolyLoop of 2.0 reads a 2.1 journal and ignores the column (its runs read without them)."""
_READ_MAJORS = (1, 2)
"""The journal schema majors this PolyLoop reads (1: every step record holds its observation)."""
_STEP_MAJOR = 1

Level = tuple[int, int]
"""A journal schema version as (major, minor), compared in that order."""

# The columns each minor version added: ((major, minor), table, column, decl). A journal of an
# older version lacks them (it is read all the same: the step reader gives the fields their
# defaults, the readers of ``model_calls.logprobs`` none); a writer adds them when it opens one
# (``_migrate``). 2.0 added no column.
_ADDED_COLUMNS: tuple[tuple[Level, str, str, str], ...] = (
    ((1, 1), "steps", "replaced_chars", "INTEGER NOT NULL DEFAULT 0"),
    ((1, 2), "steps", "model", "TEXT"),
    ((1, 2), "model_calls", "model", "TEXT"),
    ((1, 2), "model_calls", "response_model", "TEXT"),
    ((1, 2), "model_calls", "cached_tokens", "INTEGER"),
    ((1, 2), "model_calls", "reasoning_tokens", "INTEGER"),
    ((1, 3), "steps", "wrap_up", "INTEGER NOT NULL DEFAULT 0"),
    ((1, 3), "model_calls", "cost_usd", "REAL"),
    ((1, 3), "runs", "tokens_used", "INTEGER"),
    ((1, 3), "runs", "cost_usd", "REAL"),
    ((1, 3), "runs", "active_seconds", "REAL"),
    ((1, 3), "runs", "usage_missing", "INTEGER"),
    ((1, 3), "runs", "request", "TEXT CHECK (request IN ('stop', 'cancel'))"),
    ((1, 3), "runs", "request_reason", "TEXT"),
    ((1, 3), "runs", "requested_by", "TEXT"),
    ((1, 3), "runs", "requested_at", "REAL"),
    ((1, 4), "steps", "outcome_unknown", "TEXT"),
    ((2, 1), "model_calls", "logprobs", "TEXT"),
)


def _major(version: object) -> int | None:
    if not isinstance(version, str):
        return None
    head = version.partition(".")[0]
    return int(head) if head.isdigit() else None


def _minor(version: object) -> int:
    """The minor number of a version string ("1.1" -> 1; "1" -> 0)."""
    tail = str(version).partition(".")[2].partition(".")[0]
    return int(tail) if tail.isdigit() else 0


def _level(version: object) -> Level:
    """``version`` as (major, minor): a journal of it has the columns every version up to it
    added (``_ADDED_COLUMNS``)."""
    return (_major(version) or 0, _minor(version))


def _check_journal_version(version: object, where: str) -> None:
    if _major(version) not in _READ_MAJORS:
        majors = " and ".join(str(m) for m in _READ_MAJORS)
        raise JournalError(
            f"{where} has journal schema version {version!r}; this PolyLoop reads journal "
            f"schema {JOURNAL_SCHEMA_VERSION} (majors {majors}): upgrade polyloop to "
            "read it (the file was not modified)"
        )


def _lacking_allowed(version: object) -> frozenset[tuple[str, str]]:
    """(table, column) pairs a journal of schema ``version`` may lack: added by later minors."""
    level = _level(version)
    return frozenset((t, c) for added, t, c, _ in _ADDED_COLUMNS if added > level)


def _needs_migration(version: object) -> bool:
    """A journal of ``version`` is older than ``JOURNAL_SCHEMA_VERSION`` (a writer migrates it)."""
    return _level(version) < _level(JOURNAL_SCHEMA_VERSION)


def _check_meta(meta: Mapping[str, Any], where: str) -> None:
    """Refuse a journal whose ``meta`` lacks the journal schema version or holds an unknown
    major version of either schema (the journal's or the step record's). Any backend."""
    version = meta.get("journal_schema_version")
    if version is None:
        raise JournalError(
            f"{where} has a 'meta' table without journal_schema_version: not a PolyLoop "
            "journal (it was not modified)"
        )
    _check_journal_version(version, f"the journal {where}")
    step_version = meta.get("step_schema_version", STEP_SCHEMA_VERSION)
    if _major(step_version) != _STEP_MAJOR:
        raise JournalError(
            f"the journal {where} has step record schema version {step_version!r}; this "
            f"PolyLoop reads step record schema {STEP_SCHEMA_VERSION} (major {_STEP_MAJOR}): "
            "upgrade polyloop to read it (it was not modified)"
        )


def foreign_meta(where: str, exc: Exception) -> JournalError:
    """The refusal of a journal whose ``meta`` table PolyLoop cannot read (``exc``). Any
    backend."""
    return JournalError(
        f"{where} has a 'meta' table that is not PolyLoop's ({exc}); refusing to touch it "
        "(it was not modified)"
    )


def _check_tables(
    where: str,
    names: set[str],
    have: Mapping[str, set[str]],
    want: Mapping[str, Iterable[str]],
    version: str = JOURNAL_SCHEMA_VERSION,
) -> None:
    """Refuse a journal that lacks one of PolyLoop's tables (``want``'s keys; ``names``: the
    tables it has) or one of their columns (``have``: the columns of each table it has),
    except the columns added by minor versions after its own (``version``). Any backend."""
    missing = set(want) - names
    if missing:
        raise JournalError(
            f"the PolyLoop journal {where} lacks the tables {sorted(missing)}: it is damaged "
            "(it was not modified)"
        )
    allowed = _lacking_allowed(version)
    for table, columns in want.items():
        lacking = [
            c for c in columns if c not in have.get(table, set()) and (table, c) not in allowed
        ]
        if lacking:
            raise JournalError(
                f"the PolyLoop journal {where}: table {table} lacks the columns {lacking}: it "
                "is damaged (it was not modified)"
            )
