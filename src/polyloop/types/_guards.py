"""Guards (kernel.md §10): run-end guards, the failure ledger, and the escalation report."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias

from ._errors import ConfigError, MalformedValue
from ._step import StepRecord
from ._values import Failure, canonical_json

__all__ = [
    "Complete",
    "EscalationReport",
    "FailureSeen",
    "FingerprintEntry",
    "GuardCheck",
    "GuardContext",
    "GuardVerdict",
    "RunEndGuard",
    "Steer",
    "Verdict",
    "detect_pattern",
]


@dataclass(frozen=True, slots=True)
class Complete:
    """A run-end guard accepts the final answer."""


@dataclass(frozen=True, slots=True)
class Steer:
    """A run-end guard sends the run on: ``feedback`` goes to the model as the final-answer
    step's (synthetic) observation, and the run continues (it costs a step). ``feedback`` is
    a str, else ``MalformedValue``."""

    feedback: str

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, str):
            raise MalformedValue(f"Steer.feedback must be a str, got {self.feedback!r}")


Verdict: TypeAlias = Complete | Steer


@dataclass(frozen=True, slots=True)
class GuardContext:
    """What a run-end guard reads: the immutable history at the moment of a final answer.

    ``steps`` are the steps before the final answer; ``steers`` is how often this guard has
    steered this run so far.
    """

    run_id: str
    goal: str
    steps: tuple[StepRecord, ...]
    final_answer: str
    steers: int


GuardCheck: TypeAlias = Callable[[GuardContext], Verdict | Awaitable[Verdict]]


@dataclass(frozen=True, slots=True)
class RunEndGuard:
    """A condition on the finished conversation, checked when the model gives a final answer.

    Args:
        check: ``check(ctx) -> Complete() | Steer(feedback)`` (sync or async). It must not
            block; an exception it raises is a bug and propagates (the run stays resumable).
        name: names the guard in the journal (its steer count is rebuilt by name on resume).
        max_steers: after steering this many times in a run, the guard is skipped and the
            answer stands. ``Limits.max_steps`` stays the hard backstop.

    Guards check conditions on the conversation (e.g. "the answer cites a source"); they are
    not a second step, time or token budget: those are ``Limits``. They do not run when a
    completion-marker tool or the environment completed the run.
    """

    check: GuardCheck
    name: str = ""
    max_steers: int = 2

    def __post_init__(self) -> None:
        if not callable(self.check):
            raise ConfigError(f"RunEndGuard.check must be callable, got {self.check!r}")
        if not self.name:
            object.__setattr__(self, "name", getattr(self.check, "__name__", "guard"))
        if isinstance(self.max_steers, bool) or not isinstance(self.max_steers, int):
            raise ConfigError(f"RunEndGuard.max_steers must be an int, got {self.max_steers!r}")
        if self.max_steers < 1:
            raise ConfigError(f"RunEndGuard.max_steers must be >= 1, got {self.max_steers}")


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """Journal record: a run-end guard's verdict, written with the step it judged."""

    kind: ClassVar[str] = "guard_verdict"
    step_idx: int
    guard: str
    steer: bool
    feedback: str | None = None


@dataclass(frozen=True, slots=True)
class FailureSeen:
    """Journal record: the failure ledger's entry for a step, written with that step."""

    kind: ClassVar[str] = "failure_seen"
    step_idx: int
    fingerprint: str
    failure: Failure
    action: str | None


@dataclass(frozen=True, slots=True)
class FingerprintEntry:
    """One fingerprint in an escalation report."""

    fingerprint: str
    failure: Failure
    count: int
    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EscalationReport:
    """Why a run going in circles was stopped, for the human who takes over.

    ``pattern`` is ``unchanged`` (one failure keeps coming back), ``alternating`` (two
    failures trade places: fixing A breaks B and back), ``spreading`` (the failures keep
    changing while the files touched keep growing) or ``recurring`` (a failure came back
    among others); see :func:`detect_pattern`. ``attempts`` lists, in order, the actions
    between the first and the last failure. ``question`` is left for the caller to decide.
    """

    run_id: str
    stop_reason: str
    stopped_at_step: int
    limit: int
    pattern: str
    fingerprints: tuple[FingerprintEntry, ...]
    attempts: tuple[str, ...]
    files_touched: tuple[str, ...] = ()
    question: str = field(
        default="The same failure keeps coming back: which behaviour is intended, and what "
        "should the next attempt change?"
    )

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
                    "check": e.failure.check,
                    "error_type": e.failure.error_type,
                    "top_frame": e.failure.top_frame,
                    "message": e.failure.message,
                    "count": e.count,
                    "steps": list(e.steps),
                }
                for e in self.fingerprints
            ],
            "attempts": list(self.attempts),
            "files_touched": list(self.files_touched),
            "question": self.question,
        }

    def to_json(self) -> str:
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EscalationReport:
        entries = tuple(
            FingerprintEntry(
                e["fingerprint"],
                Failure(e["check"], e["error_type"], e["top_frame"], e["message"]),
                e["count"],
                tuple(e["steps"]),
            )
            for e in d["fingerprints"]
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
        )

    def to_markdown(self) -> str:
        """The report as Markdown: status, fingerprints, attempts, pattern, the question."""
        lines = [
            f"## Escalation: run {self.run_id}",
            "",
            f"**Status:** stopped `{self.stop_reason}` at step {self.stopped_at_step} "
            f"(one failure seen {self.limit} times).",
            f"**Pattern:** {self.pattern}.",
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
                (f.message or "").replace("|", "\\|").replace("\n", " ")[:120],
                str(e.count),
                ", ".join(map(str, e.steps)),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", "**Attempts between the failures**", ""]
        lines += [f"{i}. `{a}`" for i, a in enumerate(self.attempts, start=1)] or ["(none)"]
        if self.files_touched:
            lines += ["", "**Files touched:** " + ", ".join(f"`{p}`" for p in self.files_touched)]
        lines += ["", f"**Left for you to decide:** {self.question}", ""]
        return "\n".join(lines)


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
