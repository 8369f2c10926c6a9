"""The decision an escalation report leaves for a person: the question that separates what the
attempts did, and candidate directions read from them.

Written from the ledger alone — the failures counted, the rounds (what each changed, what
failed after it), the known failures, the test edits — by fixed rules, so the same run always
gives the same words; no model is called. For each pattern:

* ``alternating``: the two checks side by side with their messages ("when A passes, B fails
  with …; when B passes, A fails with …"), and the question which behaviour is intended where
  they conflict; a direction per side, from the round whose change made that side pass;
* ``unchanged``: the failure with where it is raised, and whether any attempt changed that file;
* ``spreading``: the files the rounds spread over, and which the task may change;
* ``no_progress`` (when that signal fired, unless one failure alone came back unchanged): the
  failing checks that did not get fewer;
* ``recurring``: the failure that came back, and the rounds after which it had passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..types import Conflict, Failure, FingerprintEntry, KnownEntry, RoundEntry, TestEdit

__all__ = ["Decision", "decide"]

_MESSAGE_CHARS = 120


@dataclass(frozen=True, slots=True)
class Decision:
    question: str
    directions: tuple[str, ...]
    conflict: Conflict | None = None


def _label(f: Failure) -> str:
    """How a round names a failure (its check, else its fingerprint)."""
    return f.check if f.check else f.fingerprint()


def _called(f: Failure) -> str:
    """A failure's name for a sentence."""
    return f"`{f.check or f.error_type or f.fingerprint()}`"


def _said(f: Failure) -> str:
    text = " ".join((f.message or f.error_type or "an error").split())
    if len(text) > _MESSAGE_CHARS:
        text = text[: _MESSAGE_CHARS - 1] + "…"
    return f"“{text}”"


def _files(paths: Sequence[str]) -> str:
    return ", ".join(f"`{p}`" for p in paths) if paths else "no file"


def _changed_since(rounds: Sequence[RoundEntry], step: int) -> list[str]:
    """The files changed by the rounds after ``step``, in order."""
    out: list[str] = []
    for r in rounds:
        if r.step > step:
            out.extend(p for p in r.changed if p not in out)
    return out


def decide(
    pattern: str,
    signals: Sequence[str],
    entries: Sequence[FingerprintEntry],
    rounds: Sequence[RoundEntry],
    known: Sequence[KnownEntry],
    test_edits: Sequence[TestEdit],
    no_progress_rounds: int | None,
) -> Decision:
    """The question, directions and (for ``alternating``) conflict of a report."""
    by_print = {e.fingerprint: e for e in entries}
    counted = [r for r in rounds if r.counted is not None and r.counted in by_print]
    prints = [r.counted for r in counted if r.counted is not None]
    last = by_print[prints[-1]] if prints else (entries[-1] if entries else None)
    if last is None:  # nothing was counted: every failure was known
        decision = _stuck_on_known(rounds, known, no_progress_rounds)
    elif pattern == "alternating" and len(set(prints)) >= 2:
        decision = _alternating(counted, by_print, rounds)
    elif "no_progress" in signals and (pattern != "unchanged" or _several_failing(rounds)):
        decision = _no_progress(last, rounds, known, no_progress_rounds)
    elif pattern == "spreading" or "spreading" in signals:
        decision = _spreading(entries[0], rounds)
    elif pattern == "recurring":
        decision = _recurring(last, rounds)
    else:
        decision = _unchanged(last, rounds)
    if test_edits:
        paths = list(dict.fromkeys(t.path for t in test_edits))
        extra = (
            f"Test files were edited ({_files(paths)}): check that no test was weakened "
            "before trusting a run that passes."
        )
        decision = Decision(decision.question, (*decision.directions, extra), decision.conflict)
    return decision


def _several_failing(rounds: Sequence[RoundEntry]) -> bool:
    """The last round reported more than one failing check (so one failure coming back
    unchanged is not the whole story)."""
    return bool(rounds) and len(set(rounds[-1].failing)) > 1


def _alternating(
    counted: Sequence[RoundEntry],
    by_print: dict[str, FingerprintEntry],
    rounds: Sequence[RoundEntry],
) -> Decision:
    prints = [r.counted for r in counted if r.counted is not None]
    pair = {prints[-1], next(p for p in reversed(prints) if p != prints[-1])}
    first_print, second_print = (p for p in by_print if p in pair)  # in the order first seen
    a, b = by_print[first_print].failure, by_print[second_print].failure
    la, lb = _label(a), _label(b)
    with_sets = [r for r in rounds if r.failing]
    if with_sets:
        a_passes = tuple(r.round for r in with_sets if lb in r.failing and la not in r.failing)
        b_passes = tuple(r.round for r in with_sets if la in r.failing and lb not in r.failing)
    else:  # rounds that list no failing set: the counted failure stands for it
        a_passes = tuple(r.round for r in counted if r.counted == second_print)
        b_passes = tuple(r.round for r in counted if r.counted == first_print)
    question = (
        f"{_called(a)} and {_called(b)} trade places: when {_called(a)} passes, {_called(b)} "
        f"fails with {_said(b)}; when {_called(b)} passes, {_called(a)} fails with {_said(a)}. "
        "Which behaviour is intended where they conflict — or what change makes both pass, "
        "which no attempt so far did?"
    )
    by_round = {r.round: r for r in rounds}
    directions = []
    for passes, good, bad in ((a_passes, a, b), (b_passes, b, a)):
        if passes:
            r = by_round[passes[-1]]
            directions.append(
                f"Keep what round {r.round} changed ({_files(r.changed)}), with which "
                f"{_called(good)} passes, and add what {_called(bad)} needs: it fails with "
                f"{_said(bad)}."
            )
    directions.append(
        f"If {_called(a)} and {_called(b)} ask for contradictory behaviour, one of them states "
        "the wrong requirement: decide which, and change that test yourself."
    )
    return Decision(question, tuple(directions), Conflict(a, b, a_passes, b_passes))


def _unchanged(entry: FingerprintEntry, rounds: Sequence[RoundEntry]) -> Decision:
    f = entry.failure
    where = f" at {f.top_frame}" if f.top_frame else ""
    changed = _changed_since(rounds, entry.steps[0])
    if f.check:
        what = f"{_called(f)} keeps failing the same way ({f.error_type or 'error'}{where}: "
    else:  # an error of an action (a tool's, a command's), not a test
        what = f"The same error keeps coming back ({_called(f)}{where}: "
    question = (
        f"{what}{_said(f)}), seen {entry.count} times: what is missing to fix it — a "
        "requirement, a log, an access — or what must the next attempt do differently?"
    )
    directions = []
    if f.top_frame:
        raised = f.top_frame.rsplit(":", 1)[0]
        if any(p == raised or p.endswith("/" + raised) for p in changed):
            directions.append(
                f"The attempts changed `{raised}`, where the failure is raised, without changing "
                "the failure: question the assumption they share."
            )
        else:
            directions.append(
                f"Look at `{raised}`: the failure is raised there, and no attempt changed it "
                f"(they changed {_files(changed)})."
            )
    directions.append(_new_information(f))
    return Decision(question, tuple(directions))


def _new_information(f: Failure) -> str:
    """The direction that asks for more than the attempts had, fit for the failure's kind."""
    if f.check:
        return (
            f"Get new information before another attempt: run {_called(f)} alone with more "
            "output, or ask for the requirement it checks."
        )
    return (
        f"Get new information before another attempt: read the call that fails with "
        f"{_called(f)} (its arguments, and what the tool or command says it needs), or ask "
        "for what it needs: access, an input, a setting."
    )


def _spreading(first: FingerprintEntry, rounds: Sequence[RoundEntry]) -> Decision:
    files = _changed_since(rounds, -1)
    question = (
        f"Each round changed more files ({len(files)} now: {_files(files)}) while the failures "
        "kept changing: which files may this task change, and which failure is the one to fix?"
    )
    directions = []
    start = next((r for r in rounds if r.changed), None)
    if start is not None:
        directions.append(
            f"Go back to what round {start.round} changed ({_files(start.changed)}) and fix "
            f"{_called(first.failure)} within those files."
        )
    directions.append(
        "Narrow `writable_paths` to the files the task may change, so that a fix cannot spread."
    )
    return Decision(question, tuple(directions))


def _no_progress(
    last: FingerprintEntry,
    rounds: Sequence[RoundEntry],
    known: Sequence[KnownEntry],
    no_progress_rounds: int | None,
) -> Decision:
    now = rounds[-1].failing if rounds else ()
    fewest = min((len(set(r.failing)) for r in rounds if r.failing), default=len(now))
    shown = ", ".join(f"`{n}`" for n in now[:5]) + (", …" if len(now) > 5 else "")
    question = (
        f"The failing checks have not got fewer for {no_progress_rounds or len(rounds)} rounds "
        f"(fewest {fewest}, now {len(set(now))}: {shown}): which of them should be fixed first, "
        "and what is missing to fix it?"
    )
    f = last.failure
    first = f"Fix {_called(f)} alone first" if f.check else f"Fix what raises {_called(f)} first"
    directions = [f"{first}: the last round counted it ({_said(f)})."]
    directions += _unaffected(known, now)
    return Decision(question, tuple(directions))


def _stuck_on_known(
    rounds: Sequence[RoundEntry], known: Sequence[KnownEntry], no_progress_rounds: int | None
) -> Decision:
    now = rounds[-1].failing if rounds else ()
    question = (
        f"Only known failures were reported for {no_progress_rounds or len(rounds)} rounds: "
        "is one of them what this task is about, or is the task done?"
    )
    return Decision(question, tuple(_unaffected(known, now)))


def _unaffected(known: Sequence[KnownEntry], now: Sequence[str]) -> list[str]:
    """Directions for baseline failures that are still failing as they were."""
    return [
        f"`{k.name}` has failed since before the first edit, and no edit changed it: if it "
        "belongs to this task, it is where to look; if not, add it to `known_failures`."
        for k in known
        if k.source == "baseline" and k.released_at is None and k.name in now
    ]


def _recurring(last: FingerprintEntry, rounds: Sequence[RoundEntry]) -> Decision:
    f = last.failure
    steps = ", ".join(map(str, last.steps))
    question = (
        f"{_called(f)} came back after other failures (steps {steps}), failing with {_said(f)}: "
        "which of the changes in between should be kept?"
    )
    label = _label(f)
    passed = [r for r in rounds if r.failing and label not in r.failing and r.step > last.steps[0]]
    directions = [
        f"Keep what round {r.round} changed ({_files(r.changed)}), after which {_called(f)} "
        f"passed, and fix `{r.failing[0]}` from there."
        for r in passed[-2:]
    ]
    if not directions:
        directions.append(
            f"Find what the rounds between steps {steps} changed that {_called(f)} depends on."
        )
    return Decision(question, tuple(directions))
