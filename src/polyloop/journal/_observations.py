"""A large observation is stored once (journal schema 2.0).

An action's observation reaches the journal three times per step: in its ``action_result``
record (``outcome.observation``), in the step record built from it (``step.observation``) and
in the step's ``steps.observation`` column (the public SQL surface), all written in one append,
one transaction. When the observation is longer than :data:`SHARED_ABOVE` characters and the
step's is the very text of the result just before it, neither record holds it:

    {"kind":"action_result","observation_in":"steps","outcome":{..., "observation":"", ...}, ...}
    {"kind":"step","observation_at":-1,"step":{..., "observation":null, ...}}

``observation_in: "steps"`` says that the result's text is the ``steps.observation`` of its
step_idx, written in the same transaction; nothing in PolyLoop updates or deletes a ``steps``
row, so the text is there as long as the record is. ``observation_at`` is the seq of the
``action_result`` holding the step's text, relative to the step's own (-1: the record just
before). Every reader of the records (``read``, ``acquire``, so resume, replay, ``show``,
``export``, ``view`` and ``polyloop check``) reads the run's large ``steps.observation`` texts
with one query (:data:`READ_LARGE`, after the records) and puts the texts back, so they see
exactly the records that were written; a marked result whose ``steps`` row is missing or holds
no observation is damage (:class:`~polyloop.types.JournalError`).

Kept whole: an observation of at most :data:`SHARED_ABOVE` characters, one a guard changed (a
steered step), one holding NUL (PostgreSQL's column holds U+FFFD for it), the step of a
``StepRecord`` subclass, and a result written by an earlier append than its step (the result
made durable before a completion guard ran, or a step rebuilt on resume from a result left by a
crash): that result keeps its text and ``steps.observation`` holds a second copy (its step
record refers to neither). Journals whose results all hold their text (the first 2.0 writers)
read the same.

The memory journal keeps records as objects: a step and its result share one ``str`` there.
The per-step cost is a type check of the records around each one (a large observation's two
records are re-encoded without it, and its text compared with the step's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import ActionResult, JournalError, Record, StepRecord, StepWritten, record_json

SHARED_ABOVE = 4096
"""Observations longer than this many characters (one SQLite page of ASCII) are stored once:
in ``steps.observation`` when their result is written with the step, else in their
``action_result`` record (and the column); shorter ones are copied into every place."""

_KEY = "observation_at"
_MARK = f'"kind":"step","{_KEY}":-1,'
_IN = "observation_in"
_IN_MARK = f'"kind":"action_result","{_IN}":"steps",'
READ_LARGE = "SELECT step_idx, observation FROM steps WHERE run_id = ? AND length(observation) > ?"
"""The one query a reader of a run makes for the observations its results left out: the
run's ``steps.observation`` texts longer than its second parameter (:data:`SHARED_ABOVE`)."""


def _shares(result: ActionResult, record: StepWritten) -> bool:
    """The step of ``record`` holds the large observation of ``result``, its action's result."""
    text = record.step.observation
    return (
        text is not None
        and len(text) > SHARED_ABOVE
        and record.step.step_idx == result.step_idx
        and text == result.outcome.observation
    )


def stored_json(record: Record, before: Record | None, after: Record | None) -> str:
    """The ``journal.body`` of ``record``, written in one append between ``before`` and
    ``after`` (None: it is the append's first, last): :func:`~polyloop.types.record_json`, but
    for a step whose large observation the result ``before`` holds, and for that result when
    ``after`` is its step, whose ``steps`` row holds the text (the module's docstring)."""
    if type(before) is ActionResult and type(record) is StepWritten and _shares(before, record):
        bare = StepWritten(dataclasses.replace(record.step, observation=None), record.active_s)
        return record_json(bare).replace('"kind":"step",', _MARK, 1)
    if (
        type(record) is ActionResult
        and type(after) is StepWritten
        and type(after.step) is StepRecord  # its steps row holds step.observation as it is
        and _shares(record, after)
        and "\x00" not in record.outcome.observation  # PostgreSQL's column cannot hold NUL
    ):
        outcome = dataclasses.replace(record.outcome, observation="")
        bare_result = dataclasses.replace(record, outcome=outcome)
        return record_json(bare_result).replace('"kind":"action_result",', _IN_MARK, 1)
    return record_json(record)


def refilled(
    record: Record, data: Mapping[str, Any], earlier: Sequence[Record], large: Mapping[int, str]
) -> Record:
    """``record`` (read from the body ``data``) with its observation put back: a step's from
    the ``action_result`` its ``observation_at`` names among ``earlier`` (the run's records
    read before it, in seq order), a result's marked ``observation_in`` from ``large`` (the
    run's large ``steps.observation`` texts by step_idx, :data:`READ_LARGE`); ``record``
    itself when the body says neither.

    Raises:
        JournalError: ``observation_at`` names no ``action_result`` of the step's action, or
            ``observation_in`` names a ``steps`` row that is missing or holds no observation.
    """
    where = data.get(_IN)
    if where is not None:
        if where != "steps" or type(record) is not ActionResult or record.outcome.observation:
            raise JournalError(f"has {_IN}={where!r}, which is not a result's mark")
        text = large.get(record.step_idx)
        if text is None:
            raise JournalError(
                f"has {_IN}='steps' but the steps row of step {record.step_idx} is missing "
                "or holds no observation"
            )
        return dataclasses.replace(
            record, outcome=dataclasses.replace(record.outcome, observation=text)
        )
    at = data.get(_KEY)
    if at is None:
        return record
    source = earlier[len(earlier) + at] if type(at) is int and -len(earlier) <= at < 0 else None
    if (
        not isinstance(record, StepWritten)
        or not isinstance(source, ActionResult)
        or source.step_idx != record.step.step_idx
        or record.step.observation is not None
    ):
        raise JournalError(f"has {_KEY}={at!r}, which names no action_result of its step")
    step = dataclasses.replace(record.step, observation=source.outcome.observation)
    return StepWritten(step, record.active_s)
