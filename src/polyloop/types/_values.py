"""What an action reports: its ``Outcome``, the failures it describes (``Failure``, for the
failure guard), the files it changed (``FileEdit``) and a hand-over to a person
(``Escalation``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._checks import bad_value as _bad
from ._enums import ActionStatus
from ._fast import fast_init

__all__ = ["TAMPERING_SIGNS", "Escalation", "Failure", "FileEdit", "Outcome"]


@fast_init
@dataclass(frozen=True, slots=True)
class Failure:
    """A failure described by stable fields, for the failure guard (kernel.md §10).

    Only these fields feed the fingerprint; never timings, addresses or temp paths. Each is a
    str or None, else ``MalformedValue``.
    """

    check: str | None = None
    """The failing check, e.g. a test id with its path."""
    error_type: str | None = None
    """The exception or error class name."""
    top_frame: str | None = None
    """``file:line`` of the innermost relevant frame."""
    message: str | None = None
    """The key assertion or message."""

    def __post_init__(self) -> None:
        if self.check is not None and not isinstance(self.check, str):
            raise _bad("Failure.check", "a str or None", self.check)
        if self.error_type is not None and not isinstance(self.error_type, str):
            raise _bad("Failure.error_type", "a str or None", self.error_type)
        if self.top_frame is not None and not isinstance(self.top_frame, str):
            raise _bad("Failure.top_frame", "a str or None", self.top_frame)
        if self.message is not None and not isinstance(self.message, str):
            raise _bad("Failure.message", "a str or None", self.message)

    def to_dict(self) -> dict[str, str | None]:
        """The four fields by name (the JSON form; ``Failure(**d)`` reads it back)."""
        return {
            "check": self.check,
            "error_type": self.error_type,
            "top_frame": self.top_frame,
            "message": self.message,
        }

    def fingerprint(self) -> str:
        """A short stable hash of the four fields only, after normalising away what changes
        between two runs of the same failure: timings, memory addresses, temporary paths and
        random ids. Equal failures give equal fingerprints; a different failing check, error
        type, top frame or message gives a different one."""
        parts = [
            _normalise(x or "") for x in (self.check, self.error_type, self.top_frame, self.message)
        ]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


_VOLATILE = [
    # Temporary paths: /tmp/..., pytest's basetemp, macOS /var/folders and /private/var.
    (
        re.compile(
            r"(/private)?/var/folders/[^\s:'\"]+|/tmp/[^\s:'\"]+|"
            r"pytest-of-[^\s/]+/pytest-\d+[^\s:'\"]*"
        ),
        "<tmp>",
    ),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x?"),  # memory addresses
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
            r"[0-9a-fA-F]{12}\b"
        ),
        "<id>",
    ),  # uuids
    (re.compile(r"\b[0-9a-fA-F]{16,}\b"), "<id>"),  # long hex ids and hashes
    (re.compile(r"\b\d+(\.\d+)?\s?(ms|us|µs|ns|s|sec|secs|seconds)\b"), "<t>"),  # timings
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?\S*"), "<when>"),
]


def _normalise(text: str) -> str:
    for pattern, replacement in _VOLATILE:
        text = pattern.sub(replacement, text)
    return " ".join(text.split())


TAMPERING_SIGNS = ("test_deleted", "assertion_deleted", "assertion_changed", "skip_added")
"""What an edit of a test file can be seen to do to its tests (:attr:`FileEdit.tampering`):
a test function removed, an assertion removed, an assertion changed (loosened or not: a
reader of text cannot tell), a skip or expected-failure marker added."""


@dataclass(frozen=True, slots=True)
class FileEdit:
    """A file an action changed, as the environment reports it in :attr:`Outcome.edits` (the
    workspace tools' ``write_file`` and ``edit_file`` do, and ``shell`` for the test files a
    command changed and, with ``writable_paths``, the files it changed outside them). The
    failure guard reads it (the first edit ends the baseline, the files changed per round
    show a fix spreading), and every edit of a test file is journaled as a ``test_edit``
    record, so that tests weakened to turn red into green are visible.

    Each field is checked here (``MalformedValue``).
    """

    path: str
    """The file, relative to the workspace root, with "/" separators."""
    test_file: bool = False
    """The file is a test file (the workspace tools' ``test_paths`` globs)."""
    tampering: tuple[str, ...] = ()
    """What the edit did to the tests in the file, each a value of :data:`TAMPERING_SIGNS`,
    in that order; () when it removed or changed no test, assertion or skip marker."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str):
            raise _bad("FileEdit.path", "a str", self.path)
        if type(self.test_file) is not bool:
            raise _bad("FileEdit.test_file", "a bool", self.test_file)
        signs = self.tampering
        if type(signs) is not tuple:
            if isinstance(signs, str) or not isinstance(signs, Sequence):
                raise _bad("FileEdit.tampering", "a sequence of str", signs)
            signs = tuple(signs)
            object.__setattr__(self, "tampering", signs)
        for sign in signs:
            if sign not in TAMPERING_SIGNS:
                raise _bad("each of FileEdit.tampering", f"one of {TAMPERING_SIGNS}", sign)


@dataclass(frozen=True, slots=True)
class Escalation:
    """A hand-over to a person (:class:`~polyloop.types.Escalate`), as an outcome and the
    escalation report carry it. ``source`` names who raised it (``tool read_secret``,
    ``guard cites_a_source``; "" in an outcome, whose step names the tool)."""

    reason: str
    evidence: Any = None
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str):
            raise _bad("Escalation.reason", "a str", self.reason)
        if not isinstance(self.source, str):
            raise _bad("Escalation.source", "a str", self.source)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "evidence": self.evidence, "source": self.source}

    def describe(self) -> str:
        """``<source>: <reason>``, the ``stop_detail`` of an ``escalated`` run."""
        return f"{self.source}: {self.reason}" if self.source else self.reason


def _as_tuple(value: object, field: str, item: type, expected: str) -> tuple[Any, ...]:
    """A sequence field of an Outcome as a tuple of ``item``, else ``MalformedValue``."""
    if type(value) is not tuple:
        if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
            raise _bad(field, expected, value)
        value = tuple(value)
    for x in value:
        if not isinstance(x, item):
            raise _bad(f"each of {field}", f"a {item.__name__}", x)
    return value


@fast_init
@dataclass(frozen=True, slots=True)
class Outcome:
    """What the environment reports for one action.

    Args:
        status: ``executed`` / ``not_executed`` / ``env_error``.
        observation: the environment's text, in full (the kernel cuts what the model sees).
        completed: the environment's completion signal; a plain bool (a failure to query it
            is ``env_error`` in ``status``, never a third value).
        marker: a completion-marker tool returned normally.
        synthetic: PolyLoop, not the environment, wrote ``observation``.
        truncated_chars: characters a tool cut from its own output (an int >= 0).
        failure: a description of the failure, for the failure guard (a ``Failure`` or None).
        failures: every failure the action reported, in order (each failing test of a test
            run); given without ``failure``, its first becomes ``failure``. The failure guard
            reads the whole set (known failures, net progress); () means just ``failure``.
        edits: the files the action changed (:class:`FileEdit`); only an ``executed``
            outcome's edits count.
        escalation: the action handed the run to a person (:class:`Escalation`): the run
            ends ``escalated`` after this step. The kernel sets it when ``execute`` raises
            ``Escalate``; an environment may return it too.

    Raises:
        MalformedValue: a field breaks this contract (``completed``, ``marker`` and
            ``synthetic`` must be exactly bools; ``status`` an ``ActionStatus`` or its string).
            The kernel records an environment whose ``execute``/``reconcile`` raised this
            building its Outcome, or returned something that is not an Outcome, as an
            ``env_error`` step with this message.
    """

    status: ActionStatus
    observation: str
    completed: bool = False
    marker: bool = False
    synthetic: bool = False
    truncated_chars: int = 0
    failure: Failure | None = None
    failures: tuple[Failure, ...] = ()
    edits: tuple[FileEdit, ...] = ()
    escalation: Escalation | None = None

    def __post_init__(self) -> None:
        # Straight-line checks: an environment builds one every step, and the kernel relies on
        # them (a bool that is None would fail only after the action, when the step is built).
        if type(self.status) is not ActionStatus:
            try:
                object.__setattr__(self, "status", ActionStatus(self.status))
            except ValueError:
                raise _bad("Outcome.status", "an ActionStatus", self.status) from None
        if not isinstance(self.observation, str):
            raise _bad("Outcome.observation", "a str", self.observation)
        if type(self.completed) is not bool:
            raise _bad("Outcome.completed", "a bool", self.completed)
        if type(self.marker) is not bool:
            raise _bad("Outcome.marker", "a bool", self.marker)
        if type(self.synthetic) is not bool:
            raise _bad("Outcome.synthetic", "a bool", self.synthetic)
        n = self.truncated_chars
        if type(n) is not int and (isinstance(n, bool) or not isinstance(n, int)):
            raise _bad("Outcome.truncated_chars", "an int >= 0", n)
        if n < 0:
            raise _bad("Outcome.truncated_chars", "an int >= 0", n)
        if self.failure is not None and not isinstance(self.failure, Failure):
            raise _bad("Outcome.failure", "a Failure or None", self.failure)
        if self.failures:
            failures = _as_tuple(self.failures, "Outcome.failures", Failure, "a tuple of Failure")
            object.__setattr__(self, "failures", failures)
            if self.failure is None:
                object.__setattr__(self, "failure", failures[0])
        elif type(self.failures) is not tuple:
            _as_tuple(self.failures, "Outcome.failures", Failure, "a tuple of Failure")
            object.__setattr__(self, "failures", ())
        if self.edits or type(self.edits) is not tuple:
            edits = _as_tuple(self.edits, "Outcome.edits", FileEdit, "a tuple of FileEdit")
            object.__setattr__(self, "edits", edits)
        if self.escalation is not None and not isinstance(self.escalation, Escalation):
            raise _bad("Outcome.escalation", "an Escalation or None", self.escalation)

    @property
    def failing(self) -> tuple[Failure, ...]:
        """The failures the failure guard reads: ``failures``, else ``(failure,)``, else ()."""
        if self.failures:
            return self.failures
        return () if self.failure is None else (self.failure,)
