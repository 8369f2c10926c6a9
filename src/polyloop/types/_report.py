"""The escalation report (kernel.md §10): why a fix loop was stopped, for the human who takes
over. The kernel builds it from the run's steps and its failure ledger; it is stored in the
run's end record and carried by ``RunResult.report``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ._canonical import canonical_json
from ._ledger import TestEdit
from ._values import Escalation, Failure

__all__ = [
    "Conflict",
    "EscalationReport",
    "FingerprintEntry",
    "KnownEntry",
    "ReportHook",
    "RoundEntry",
    "detect_pattern",
]

_DEFAULT_QUESTION = (
    "The same failure keeps coming back: which behaviour is intended, and what should the next "
    "attempt change?"
)


@dataclass(frozen=True, slots=True)
class FingerprintEntry:
    """One fingerprint in an escalation report."""

    fingerprint: str
    failure: Failure
    count: int
    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RoundEntry:
    """One round of the ledger: the steps from ``first_step`` to ``step`` (the outcome that
    reported failures), the files they changed, the failures reported (``failing``: each
    one's check, or fingerprint) and the fingerprint counted (None: all were known)."""

    round: int
    first_step: int
    step: int
    changed: tuple[str, ...]
    failing: tuple[str, ...]
    counted: str | None


@dataclass(frozen=True, slots=True)
class KnownEntry:
    """A known failure, listed apart: ``name`` is the check or fingerprint as given in
    ``Limits.known_failures`` (``source="given"``), or the check (fingerprint) of a failure
    seen before the first edit (``source="baseline"``). ``failure`` and ``step``: its first
    sighting (None: never seen). ``released_at``: the step at which an edit was seen to affect
    a baseline failure (it then counted like any other), else None."""

    name: str
    source: str
    failure: Failure | None = None
    step: int | None = None
    released_at: int | None = None


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two failing checks that trade places (the ``alternating`` pattern): in the rounds
    ``first_passes`` the first passed while the second failed, in ``second_passes`` the
    reverse. Each failure is as it was last reported."""

    first: Failure
    second: Failure
    first_passes: tuple[int, ...]
    second_passes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "first": self.first.to_dict(),
            "second": self.second.to_dict(),
            "first_passes": list(self.first_passes),
            "second_passes": list(self.second_passes),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Conflict:
        return cls(
            Failure(**d["first"]),
            Failure(**d["second"]),
            tuple(d["first_passes"]),
            tuple(d["second_passes"]),
        )


def _failure_from(d: Mapping[str, Any]) -> Failure:
    return Failure(d["check"], d["error_type"], d["top_frame"], d["message"])


def _cell(text: str | None, most: int = 120) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")[:most]


@dataclass(frozen=True, slots=True)
class EscalationReport:
    """Why a run going in circles was stopped, for the human who takes over.

    ``signals`` names the stop signals that fired (``same_failure``, ``no_progress``,
    ``spreading``), ``why`` says it in words. ``pattern`` is ``unchanged`` (one failure keeps
    coming back), ``alternating`` (two failures trade places: fixing A breaks B and back),
    ``spreading`` (the failures keep changing while the files touched keep growing) or
    ``recurring`` (a failure came back among others); see :func:`detect_pattern`.
    ``fingerprints`` are the failures counted; ``known`` the known ones, listed apart;
    ``rounds`` the ledger round by round; ``attempts`` the actions between the first and the
    last failure, in order; ``files_touched`` the files they changed; ``test_edits`` every
    edit of a test file in the run.

    ``question`` is the decision left for a person, built from the ledger for the pattern
    (for ``alternating``: the two checks side by side with their messages, and what separates
    them); ``conflict`` holds those two checks. ``directions`` are the candidate next steps,
    read from what the attempts did, then those the caller's ``report_hook`` added. All of it
    is deterministic: PolyLoop calls no model to write it.
    """

    run_id: str
    stop_reason: str
    stopped_at_step: int
    limit: int
    """``Limits.same_failure_limit`` (0 when that signal was off)."""
    pattern: str
    fingerprints: tuple[FingerprintEntry, ...]
    attempts: tuple[str, ...]
    files_touched: tuple[str, ...] = ()
    question: str = field(default=_DEFAULT_QUESTION)
    signals: tuple[str, ...] = ()
    why: str = ""
    rounds: tuple[RoundEntry, ...] = ()
    known: tuple[KnownEntry, ...] = ()
    test_edits: tuple[TestEdit, ...] = ()
    conflict: Conflict | None = None
    directions: tuple[str, ...] = ()
    escalation: Escalation | None = None
    """For an ``escalated`` run: who handed it over, why, and the evidence given."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``to_json`` is its canonical JSON)."""
        return {
            "run_id": self.run_id,
            "stop_reason": self.stop_reason,
            "stopped_at_step": self.stopped_at_step,
            "limit": self.limit,
            "pattern": self.pattern,
            "fingerprints": [
                {
                    "fingerprint": e.fingerprint,
                    **e.failure.to_dict(),
                    "count": e.count,
                    "steps": list(e.steps),
                }
                for e in self.fingerprints
            ],
            "attempts": list(self.attempts),
            "files_touched": list(self.files_touched),
            "question": self.question,
            "signals": list(self.signals),
            "why": self.why,
            "rounds": [
                {
                    "round": r.round,
                    "first_step": r.first_step,
                    "step": r.step,
                    "changed": list(r.changed),
                    "failing": list(r.failing),
                    "counted": r.counted,
                }
                for r in self.rounds
            ],
            "known": [
                {
                    "name": k.name,
                    "source": k.source,
                    "failure": None if k.failure is None else k.failure.to_dict(),
                    "step": k.step,
                    "released_at": k.released_at,
                }
                for k in self.known
            ],
            "test_edits": [
                {"step_idx": t.step_idx, "path": t.path, "tampering": list(t.tampering)}
                for t in self.test_edits
            ],
            "conflict": None if self.conflict is None else self.conflict.to_dict(),
            "directions": list(self.directions),
            "escalation": None if self.escalation is None else self.escalation.to_dict(),
        }

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EscalationReport:
        """Read :meth:`to_dict` output (a report written before a field existed reads it as
        its default)."""
        entries = tuple(
            FingerprintEntry(e["fingerprint"], _failure_from(e), e["count"], tuple(e["steps"]))
            for e in d["fingerprints"]
        )
        rounds = tuple(
            RoundEntry(
                r["round"],
                r["first_step"],
                r["step"],
                tuple(r["changed"]),
                tuple(r["failing"]),
                r["counted"],
            )
            for r in d.get("rounds", ())
        )
        known = tuple(
            KnownEntry(
                k["name"],
                k["source"],
                None if k["failure"] is None else _failure_from(k["failure"]),
                k["step"],
                k["released_at"],
            )
            for k in d.get("known", ())
        )
        edits = tuple(
            TestEdit(t["step_idx"], t["path"], tuple(t["tampering"]))
            for t in d.get("test_edits", ())
        )
        return cls(
            d["run_id"],
            d["stop_reason"],
            d["stopped_at_step"],
            d["limit"],
            d["pattern"],
            entries,
            tuple(d["attempts"]),
            tuple(d["files_touched"]),
            d["question"],
            tuple(d.get("signals", ())),
            d.get("why", ""),
            rounds,
            known,
            edits,
            None if d.get("conflict") is None else Conflict.from_dict(d["conflict"]),
            tuple(d.get("directions", ())),
            None if d.get("escalation") is None else Escalation(**d["escalation"]),
        )

    def to_markdown(self) -> str:
        """The report as Markdown: status, fingerprints, known failures, rounds, test edits,
        attempts, the question."""
        why = self.why or f"one failure seen {self.limit} times"
        lines = [
            f"## Escalation: run {self.run_id}",
            "",
            f"**Status:** stopped `{self.stop_reason}` at step {self.stopped_at_step} ({why}).",
            f"**Pattern:** {self.pattern}.",
        ]
        handover = self.escalation
        if handover is not None:
            by = handover.source or "the environment"
            lines += ["", f"**Handed over by** {by}: {handover.reason}"]
            if handover.evidence is not None:
                shown = _cell(canonical_json(handover.evidence), 400)
                lines += ["", f"**Evidence:** `{shown}`"]
        lines += [
            "",
            "**Failure fingerprints**",
            "",
            "| fingerprint | failing check | error | top frame | message | count | steps |",
            "|---|---|---|---|---|---|---|",
        ]
        for e in self.fingerprints:
            f = e.failure
            cells = [
                e.fingerprint,
                f.check or "",
                f.error_type or "",
                f.top_frame or "",
                _cell(f.message),
                str(e.count),
                ", ".join(map(str, e.steps)),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        if self.known:
            lines += ["", "**Known failures (not counted)**", ""]
            lines += ["| known | source | message | first seen | since |", "|---|---|---|---|---|"]
            for k in self.known:
                since = "known" if k.released_at is None else f"affected at step {k.released_at}"
                seen = "" if k.step is None else f"step {k.step}"
                message = None if k.failure is None else k.failure.message
                cells = [k.name, k.source, _cell(message, 80), seen, since]
                lines.append("| " + " | ".join(cells) + " |")
        if self.rounds:
            lines += ["", "**Rounds**", ""]
            lines += ["| round | steps | files changed | failing |", "|---|---|---|---|"]
            for r in self.rounds:
                span = f"{r.first_step}–{r.step}" if r.first_step < r.step else str(r.step)
                changed = ", ".join(r.changed) or "(none)"
                failing = f"{len(r.failing)}: " + ", ".join(r.failing[:3])
                failing += ", …" if len(r.failing) > 3 else ""
                lines.append(f"| {r.round} | {span} | {_cell(changed)} | {_cell(failing)} |")
        if self.test_edits:
            lines += ["", "**Test files edited** (check that no test was weakened)", ""]
            lines += [f"- `{t.path}` at step {t.step_idx}" + _signs(t) for t in self.test_edits]
        lines += ["", "**Attempts between the failures**", ""]
        lines += [f"{i}. `{a}`" for i, a in enumerate(self.attempts, start=1)] or ["(none)"]
        if self.files_touched:
            lines += ["", "**Files touched:** " + ", ".join(f"`{p}`" for p in self.files_touched)]
        if self.directions:
            lines += ["", "**Candidate directions**", ""]
            lines += [f"{chr(ord('A') + i)}. {d}" for i, d in enumerate(self.directions[:26])]
        lines += ["", f"**Left for you to decide:** {self.question}", ""]
        return "\n".join(lines)


ReportHook: TypeAlias = Callable[[EscalationReport], Sequence[str]]
"""``report_hook(report) -> directions``: more candidate directions for an escalation report,
appended to the ones PolyLoop read from the ledger (``Loop(report_hook=...)``). Called once,
before the end record is written; it must not block, and an exception it raises is a bug
that propagates (the run stays resumable, and resuming calls it again)."""


def _signs(t: TestEdit) -> str:
    return f": {', '.join(t.tampering)}" if t.tampering else ""


def detect_pattern(fingerprints: Sequence[str], files_per_round: Sequence[int]) -> str:
    """Name the shape of a failure sequence (``files_per_round``: distinct files touched so
    far at each failure).

    * ``unchanged``: one failure, again and again, or the same failure twice in a row;
    * ``spreading``: the files touched grew at every failure while at least three different
      failures appeared — each fix opens a new front;
    * ``alternating``: the last rounds trade two failures (fix A breaks B, fix B breaks A);
    * ``recurring``: a failure came back after others, in no simpler shape.
    """
    if len(set(fingerprints)) == 1:
        return "unchanged"
    growing = len(files_per_round) >= 3 and all(
        b > a for a, b in itertools.pairwise(files_per_round)
    )
    if growing and len(set(fingerprints)) >= 3:
        return "spreading"
    tail = list(fingerprints[-4:])
    if len(tail) >= 3 and len(set(tail)) == 2 and all(a != b for a, b in itertools.pairwise(tail)):
        return "alternating"
    if len(fingerprints) >= 2 and fingerprints[-1] == fingerprints[-2]:
        return "unchanged"
    return "recurring"
