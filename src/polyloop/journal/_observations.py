"""A large observation is stored once in the ``journal`` table (journal schema 2.0).

An action's observation reaches the journal twice per step: in its ``action_result`` record
(``outcome.observation``) and in the step record built from it (``step.observation``), both
written in one append. When the observation is longer than :data:`SHARED_ABOVE` characters
and the step's is the very text of the result just before it, the ``step`` record's body
leaves it out (``"observation": null``) and says where it is::

    {"kind":"step","observation_at":-1,"step":{..., "observation":null, ...}}

``observation_at`` is the seq of the ``action_result`` holding it, relative to the step's own
(-1: the record just before). Every reader of the records (``read``, ``acquire``, so resume,
replay, ``show``, ``export``, ``view`` and ``polyloop check``) puts the text back, so they see
exactly the step that was written. The ``steps.observation`` column (the public SQL surface) is
filled as before. Kept whole: an observation of at most :data:`SHARED_ABOVE` characters, one a
guard changed (a steered step), and a step whose result was written by an earlier append (the
result made durable before a completion guard ran, or a step rebuilt on resume from a result
left by a crash): copying those is cheaper or rarer than finding their result.

The memory journal keeps records as objects: a step and its result share one ``str`` there.
The per-step cost is one type check of the record before the step (the step is re-encoded,
without its observation, only when the observation is large).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import ActionResult, JournalError, Record, StepWritten, record_json

SHARED_ABOVE = 4096
"""Observations longer than this many characters (one SQLite page of ASCII) are stored once,
in their ``action_result`` record; shorter ones are copied into the step record as well."""

_KEY = "observation_at"
_MARK = f'"kind":"step","{_KEY}":-1,'


def stored_json(record: Record, before: Record | None) -> str:
    """The ``journal.body`` of ``record``, written in one append right after ``before`` (None:
    it is the append's first): :func:`~polyloop.types.record_json`, but for a step whose large
    observation the result ``before`` holds (the module's docstring)."""
    if type(before) is ActionResult and type(record) is StepWritten:
        step = record.step
        text = step.observation
        if (
            text is not None
            and len(text) > SHARED_ABOVE
            and step.step_idx == before.step_idx
            and text == before.outcome.observation
        ):
            bare = StepWritten(dataclasses.replace(step, observation=None), record.active_s)
            return record_json(bare).replace('"kind":"step",', _MARK, 1)
    return record_json(record)


def refilled(record: Record, data: Mapping[str, Any], earlier: Sequence[Record]) -> Record:
    """``record`` (read from the body ``data``) with its observation put back from the
    ``action_result`` its ``observation_at`` names among ``earlier`` (the run's records read
    before it, in seq order); ``record`` itself when the body names none.

    Raises:
        JournalError: ``observation_at`` names no ``action_result`` of the step's action.
    """
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
