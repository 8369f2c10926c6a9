"""The failure ledger of one run (kernel.md §10): what the failure guard has seen, round by
round, and the counts its stop signals read.

Every executed step's outcome is handed to :meth:`Ledger.observe`, in step order, after the
completion check. The ledger is a pure fold over those outcomes and the limits in force: the
run writes the records it returns in the transaction of their step, and resume rebuilds the
same ledger by folding the stored outcomes again (:mod:`.replay`), so the counts go on where
they were.

The rules:

* **Edits.** An ``executed`` outcome's ``edits`` are the files it changed; each edit of a test
  file is a ``test_edit`` record (whether the guard is on or not).
* **Rounds.** With the guard on (``Limits.failure_guard``), every outcome that reports
  failures (``Outcome.failing``) closes a round: the actions since the previous one, normally
  edits then a test run. A ``failure_seen`` record describes it.
* **Known failures** count toward no signal. Those of ``Limits.known_failures`` (a check or a
  fingerprint each, or the error type of failures that name no check: a tool's error such as
  ``MCPToolError``, never a test's) stay known. With ``Limits.baseline``, the failures reported
  before the run's first edit are known too (a ``failure_known`` record each), but only while
  they stay as they were: once a later test report (a round whose failures have checks) no
  longer lists one, or lists its check with another fingerprint, an edit has affected it, so it
  belongs to the fix and counts like any other from then on. A failure seen before the first
  edit that no edit ever changes cannot be told from an unrelated one: ``no_progress_rounds``
  stops a run stuck on it.
* **same_failure**: each round counts the first failure it reports that is not known (one
  fingerprint per round, never the whole set: a suite with ten failing tests fixed one per
  round makes progress); the signal fires when one fingerprint has been counted
  ``same_failure_limit`` times.
* **no_progress**: a round makes net progress when it reports fewer failing checks than any
  round before it; the signal fires after ``no_progress_rounds`` rounds in a row without.
* **spreading**: a round spreads when it changed a file no earlier action changed; the signal
  fires after ``spreading_rounds`` rounds in a row that spread.

Work per step is bounded by the step's own failures and edits (plus, with a baseline, the
failures known from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..types import (
    ActionStatus,
    Failure,
    FailureKnown,
    FailureSeen,
    KnownEntry,
    Limits,
    Outcome,
    Record,
    TestEdit,
)

__all__ = ["Ledger", "Observed"]


@dataclass(frozen=True, slots=True)
class Observed:
    """What one step's outcome did to the ledger: the records to write with the step, and
    the counts the stop signals read (:func:`.stopping.failure_signals`)."""

    records: tuple[Record, ...] = ()
    seen: int = 0
    """Times the fingerprint counted at this step has now been counted (0: none counted)."""
    stale_rounds: int = 0
    """Rounds in a row, this one included, without net progress (0: no round closed)."""
    spreading_rounds: int = 0
    """Rounds in a row, this one included, that changed a file not changed before."""


NOTHING = Observed()


def _name(f: Failure) -> str:
    """How a round lists a failure: its check, else its fingerprint."""
    return f.check if f.check else f.fingerprint()


@dataclass
class _Known:
    """A failure known from the baseline, by its name."""

    fingerprint: str
    failure: Failure
    step: int
    released_at: int | None = None


@dataclass
class Ledger:
    """The failure ledger of one run (see the module docstring)."""

    rounds: list[FailureSeen] = field(default_factory=list)
    """Every round, in order."""
    counts: dict[str, int] = field(default_factory=dict)
    """Times each fingerprint was counted."""
    test_edits: list[TestEdit] = field(default_factory=list)
    baseline: dict[str, _Known] = field(default_factory=dict)
    given_seen: dict[str, tuple[Failure, int]] = field(default_factory=dict)
    """The first failure (and step) each entry of ``Limits.known_failures`` matched."""
    edited: bool = False
    changed: list[str] = field(default_factory=list)
    """Files changed since the last round, in order."""
    files: set[str] = field(default_factory=set)
    """Every file changed so far."""
    new_file: bool = False
    """An action since the last round changed a file not changed before."""
    fewest: int | None = None
    """The fewest failing checks any round reported."""
    stale: int = 0
    spreading: int = 0
    last_count: tuple[int, int] = (-1, 0)
    """(step, times seen) of the last round that counted a fingerprint."""

    def observe(
        self, step_idx: int, outcome: Outcome, action: str | None, limits: Limits, *, judged: bool
    ) -> Observed:
        """Take in one step's outcome. ``judged``: the step did not end the run (the
        completion check found nothing), so its failures are the guard's to judge."""
        records: list[Record] = []
        if outcome.status is ActionStatus.executed and outcome.edits:
            self.edited = True
            for edit in outcome.edits:
                if edit.test_file:
                    te = TestEdit(step_idx, edit.path, edit.tampering)
                    self.test_edits.append(te)
                    records.append(te)
                if edit.path not in self.files:
                    self.files.add(edit.path)
                    self.new_file = True
                if edit.path not in self.changed:
                    self.changed.append(edit.path)
        failing = outcome.failing
        if not (judged and failing and limits.failure_guard):
            return Observed(tuple(records)) if records else NOTHING
        return self._round(step_idx, failing, action, limits, records)

    def _round(
        self,
        step_idx: int,
        failing: tuple[Failure, ...],
        action: str | None,
        limits: Limits,
        records: list[Record],
    ) -> Observed:
        prints = [f.fingerprint() for f in failing]
        names = [_name(f) for f in failing]
        if limits.baseline and not self.edited:
            for f, fp, name in zip(failing, prints, names, strict=True):
                if name not in self.baseline:
                    self.baseline[name] = _Known(fp, f, step_idx)
                    records.append(FailureKnown(step_idx, fp, f))
        elif self.baseline and any(f.check for f in failing):  # a test report
            listed = dict(zip(names, prints, strict=True))
            for name, known in self.baseline.items():
                if (
                    known.released_at is None
                    and known.failure.check
                    and listed.get(name) != known.fingerprint
                ):
                    known.released_at = step_idx  # an edit affected it: it is the fix's now
        counted: int | None = None
        for i, (f, fp, name) in enumerate(zip(failing, prints, names, strict=True)):
            if not self._known(f, fp, name, step_idx, limits):
                counted = i
                break
        seen = 0
        if counted is not None:
            fp = prints[counted]
            seen = self.counts.get(fp, 0) + 1
            self.counts[fp] = seen
            self.last_count = (step_idx, seen)
        first = 0 if counted is None else counted
        entry = FailureSeen(
            step_idx,
            prints[first],
            failing[first],
            action,
            len(self.rounds) + 1,
            counted is None,
            tuple(names),
            tuple(self.changed),
        )
        self.rounds.append(entry)
        records.append(entry)
        size = len(set(names))
        if self.fewest is None or size < self.fewest:
            self.fewest, self.stale = size, 0
        else:
            self.stale += 1
        self.spreading = self.spreading + 1 if self.new_file else 0
        self.new_file = False
        self.changed = []
        return Observed(tuple(records), seen, self.stale, self.spreading)

    def seen_at(self, step_idx: int) -> int:
        """How often the fingerprint counted at step ``step_idx`` had then been counted, if
        it was the last step that counted one (for the model's budget hint); else 0."""
        step, seen = self.last_count
        return seen if step == step_idx else 0

    def _known(self, f: Failure, fp: str, name: str, step_idx: int, limits: Limits) -> bool:
        given = limits.known_failures
        if given:
            for key in (f.check, fp, None if f.check else f.error_type):
                if key is not None and key in given:
                    self.given_seen.setdefault(key, (f, step_idx))
                    return True
        known = self.baseline.get(name)
        return known is not None and known.released_at is None and known.fingerprint == fp

    def known_entries(self, limits: Limits) -> tuple[KnownEntry, ...]:
        """The known failures, for the report: the given ones first, then the baseline's."""
        out = []
        for name in limits.known_failures:
            first = self.given_seen.get(name)
            failure, step = (None, None) if first is None else first
            out.append(KnownEntry(name, "given", failure, step))
        for name, k in self.baseline.items():
            out.append(KnownEntry(name, "baseline", k.failure, k.step, k.released_at))
        return tuple(out)
