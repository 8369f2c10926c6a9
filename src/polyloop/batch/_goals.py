"""Goals of a batch, their deterministic run ids, and the JSONL goal file."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Goal", "GoalFileError", "goal_run_id", "load_goals", "parse_goal_line"]


@dataclass(frozen=True, slots=True)
class Goal:
    """One run to make: its goal text, and optionally its run id and metadata.

    Attributes:
        goal: what the run is for (its first user message).
        run_id: the run's id; None (the usual case) derives one from ``source``, ``goal`` and
            ``metadata`` (:func:`goal_run_id`), so submitting the same batch twice makes each
            run once.
        metadata: JSON-ready data stored with the run (``runs.metadata_json``).
        source: where the goal comes from (a file, an experiment name); part of the derived
            id, so the same goal text from two sources makes two runs. Not stored.
    """

    goal: str
    run_id: str | None = None
    metadata: Mapping[str, Any] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.goal, str):
            raise TypeError(f"Goal.goal must be a str, got {type(self.goal).__name__}")
        if self.run_id is not None and (not isinstance(self.run_id, str) or not self.run_id):
            raise TypeError(f"Goal.run_id must be a non-empty str or None, got {self.run_id!r}")
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise TypeError(
                f"Goal.metadata must be a mapping or None, got {type(self.metadata).__name__}"
            )


def _canonical(value: object) -> str:
    """JSON with sorted keys and no whitespace; refuses NaN/Infinity and non-JSON values."""

    def check(v: object) -> None:
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"metadata holds a non-finite number ({v})")

    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # json.dumps writes NaN/Infinity as bare words; the journal's JSON would refuse them later.
    json.loads(text, parse_constant=lambda c: check(float(c)))
    return text


def goal_run_id(goal: Goal | str) -> str:
    """The goal's run id: ``goal.run_id`` when set, else the first 24 hex digits of the
    SHA-256 of the canonical JSON of its source, text and metadata. The same goal always gets
    the same id, on any machine and Python version (key order of the metadata is irrelevant).

    Raises:
        TypeError / ValueError: the metadata is not JSON (a non-string key, a set, NaN, ...).
    """
    if isinstance(goal, str):
        goal = Goal(goal)
    if goal.run_id is not None:
        return goal.run_id
    meta = None if goal.metadata is None else dict(goal.metadata)
    body = _canonical({"source": goal.source, "goal": goal.goal, "metadata": meta})
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:24]


class GoalFileError(ValueError):
    """A line of a goal file cannot be read; the message names the file and line number."""

    def __init__(self, where: str, line_no: int, why: str) -> None:
        super().__init__(f"{where}, line {line_no}: {why}")
        self.where = where
        self.line_no = line_no
        self.why = why


_KEYS = frozenset({"goal", "run_id", "metadata"})


def parse_goal_line(line: str, *, source: str = "", reserved: Collection[str] = ()) -> Goal | None:
    """One JSONL line as a :class:`Goal`: ``{"goal": "...", "run_id"?: "...", "metadata"?:
    {...}}``. A blank line is None. ``reserved``: metadata keys a line may not use (the caller
    fills them in). Raises ``ValueError`` saying what is wrong."""
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(
            f'expected a JSON object like {{"goal": "..."}}, got {type(data).__name__}'
        )
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}: a line takes goal, run_id, metadata")
    goal, run_id, metadata = data.get("goal"), data.get("run_id"), data.get("metadata")
    if not isinstance(goal, str) or not goal.strip():
        raise ValueError('"goal" must be a non-empty string')
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
        raise ValueError('"run_id" must be a non-empty string when given')
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError('"metadata" must be a JSON object when given')
    taken = sorted(set(metadata or ()) & set(reserved))
    if taken:
        raise ValueError(f'"metadata" key(s) {taken} are reserved (filled in by the caller)')
    try:
        _canonical(metadata)
    except ValueError as exc:
        raise ValueError(f'"metadata" cannot be stored: {exc}') from None
    return Goal(goal, run_id=run_id, metadata=metadata, source=source)


def load_goals(
    path: str | Path, *, source: str | None = None, reserved: Collection[str] = ()
) -> list[Goal]:
    """Read a JSONL goal file, one goal per line (blank lines are skipped).

    ``source`` (default: the file's absolute path) goes into each derived run id, so re-reading
    the same file gives the same ids. ``reserved``: as for :func:`parse_goal_line`.

    Raises:
        GoalFileError: a bad line (the message names the line number and what is wrong),
            or a file with no goal at all.
        OSError: the file cannot be read.
    """
    p = Path(path)
    where = str(path)
    src = str(p.resolve()) if source is None else source
    goals: list[Goal] = []
    line_no = 0
    with p.open(encoding="utf-8") as f:
        try:
            for line_no, line in enumerate(f, start=1):
                try:
                    goal = parse_goal_line(line, source=src, reserved=reserved)
                except ValueError as exc:
                    raise GoalFileError(where, line_no, str(exc)) from None
                if goal is not None:
                    goals.append(goal)
        except UnicodeDecodeError as exc:
            raise GoalFileError(where, line_no + 1, f"not UTF-8 text ({exc.reason})") from None
    if not goals:
        raise GoalFileError(where, max(line_no, 1), "the file holds no goal")
    return goals
