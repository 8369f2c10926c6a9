"""The failure guard's journal records (kernel.md §10): what a fix loop saw, written with the
step that saw it.

Each record is written in the transaction of its step, only by the step that produced it, and
its JSON form is the ``body`` of a ``journal`` row, so plain SQL reads the ledger::

    -- SQLite (PostgreSQL: body::jsonb ->> 'path')
    SELECT run_id, json_extract(body, '$.step_idx'), json_extract(body, '$.path'),
           json_extract(body, '$.tampering')
    FROM journal WHERE kind = 'test_edit';

Resume rebuilds the ledger from the outcomes of the run's steps (the action results), by the
same rules that wrote these records; the records are what the rules concluded, for people and
for SQL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._values import Failure

__all__ = ["FailureKnown", "FailureSeen", "TestEdit"]


@dataclass(frozen=True, slots=True)
class FailureSeen:
    """Journal record: one round of the failure ledger — an outcome that reported failures
    while the failure guard was on.

    ``fingerprint``/``failure`` is the failure the round counts toward ``same_failure_limit``:
    the first one reported that is not known; when all of them are known, the first one, and
    ``known`` is True (nothing was counted). ``round`` numbers the rounds from 1: a round is
    the actions since the previous one (normally edits), ending with this outcome (normally a
    test run). ``failing`` names every failure of the outcome (its check, or its fingerprint
    when it has none), in order; ``changed`` the files the round's actions changed.
    """

    kind: ClassVar[str] = "failure_seen"
    step_idx: int
    fingerprint: str
    failure: Failure
    action: str | None
    round: int = 0
    """0 in records written before rounds were numbered."""
    known: bool = False
    failing: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FailureKnown:
    """Journal record: a failure the run saw before its first edit (``Limits.baseline``),
    known from this step on: it counts toward no stop signal while it stays as it was."""

    kind: ClassVar[str] = "failure_known"
    step_idx: int
    fingerprint: str
    failure: Failure


@dataclass(frozen=True, slots=True)
class TestEdit:
    """Journal record: an action changed a test file (``FileEdit.test_file``), with what it
    was seen to do to the tests in it (``tampering``: values of ``TAMPERING_SIGNS``; () when
    nothing was removed or weakened that text can tell). Written whether or not the failure
    guard is on."""

    __test__: ClassVar[bool] = False  # not a pytest test class, despite its name

    kind: ClassVar[str] = "test_edit"
    step_idx: int
    path: str
    tampering: tuple[str, ...] = ()

    def describe(self) -> str:
        """``path (sign, sign) at step n``, for a line of text."""
        signs = f" ({', '.join(self.tampering)})" if self.tampering else ""
        return f"{self.path}{signs} at step {self.step_idx}"
