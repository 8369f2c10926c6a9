"""Value types that cross the seams: model requests and replies, decisions, outcomes, limits."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeAlias

from ._checks import check_amount, check_limit, check_number
from ._enums import ActionStatus
from ._errors import ConfigError, MalformedValue
from ._fast import fast_init
from ._tool_context import ToolContext
from ._usage import Pricing, Usage

__all__ = [
    "Action",
    "Decision",
    "Escalation",
    "Failure",
    "FileEdit",
    "FinalAnswer",
    "InvalidDecision",
    "Limits",
    "Message",
    "ModelReply",
    "ModelRequest",
    "Outcome",
    "Pricing",
    "RetryPolicy",
    "ToolCall",
    "ToolContext",
    "ToolSpec",
    "Usage",
    "canonical_json",
    "raw_response_of",
]

Message: TypeAlias = Mapping[str, Any]
"""One chat message in the OpenAI chat format (``role``, ``content``, ``tool_calls``, ...).
Messages handed out by PolyLoop are never mutated after they are built; do not mutate them."""

ToolSpec: TypeAlias = Mapping[str, Any]
"""One tool as the model sees it, in the OpenAI format:
``{"type": "function", "function": {"name", "description", "parameters"}}``."""


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _bad(field: str, expected: str, value: object) -> MalformedValue:
    """The error of a field that breaks its type's contract (``Outcome.completed`` ...)."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:79] + "…"
    if value is not None:
        shown += f" ({type(value).__name__})"
    return MalformedValue(f"{field} must be {expected}, got {shown}")


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _c_encoder() -> Callable[[Any], str] | None:
    """The C encoder behind ``_CANONICAL``, made once. ``JSONEncoder.encode`` builds a new
    one on every call, which costs more than encoding a small record."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without the _json accelerator
        return None
    # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys,
    # allow_nan): exactly what _CANONICAL.iterencode passes. The markers dict detects cycles;
    # a failed call can leave ids in it, so it is emptied then (ids get reused).
    markers: dict[int, Any] = {}
    encode = make(
        markers, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, True
    )
    join = "".join

    def fast(value: Any) -> str:
        try:
            return join(encode(value, 0))
        except BaseException:
            markers.clear()
            raise

    return fast


_FAST = _c_encoder()


def canonical_json(value: Any) -> str:
    """The one JSON form PolyLoop stores and measures: sorted keys, no spaces, real unicode
    (``json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``).

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
        ValueError: ``value`` contains itself.
    """
    if _FAST is None:
        return _CANONICAL.encode(value)
    return _FAST(value)


@fast_init
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One native tool call in a model reply.

    ``arguments`` is a mapping or a JSON string; the string form is kept exactly as received
    (``raw_response`` records it verbatim, and malformed JSON is the interpreter's to judge).
    The field types are checked here: a wrong one raises ``MalformedValue``.
    """

    name: str
    arguments: Mapping[str, Any] | str
    id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise _bad("ToolCall.name", "a str", self.name)
        a = self.arguments
        if type(a) is not str and type(a) is not dict and not isinstance(a, str | Mapping):
            raise _bad("ToolCall.arguments", "a mapping or a JSON str", a)
        if self.id is not None and not isinstance(self.id, str):
            raise _bad("ToolCall.id", "a str or None", self.id)

    @property
    def arguments_text(self) -> str:
        """The arguments as a string: verbatim if received as a string, else canonical JSON."""
        if isinstance(self.arguments, str):
            return self.arguments
        return canonical_json(dict(self.arguments))


@fast_init
@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What the kernel hands the model for one call.

    ``messages`` is an immutable snapshot of the context at call time; ``attempt`` starts at 1
    and grows with each retry of the same step (also across a resume).
    """

    run_id: str
    step_idx: int
    attempt: int
    messages: Sequence[Message]
    tool_specs: Sequence[ToolSpec]
    on_delta: Callable[[str, str], None] | None = None
    """For a streaming adapter: call ``on_delta(kind, text)`` with each piece of the reply as
    it arrives (``kind`` is ``"text"``, ``"reasoning"`` or ``"tool_call"``, the latter with a
    fragment of a call's arguments); the kernel turns each into a ``ModelDelta`` event. None
    when nothing listens. Deltas are for display only: the journal records the complete reply
    that ``complete`` returns, or the attempt's failure."""
    tool_choice: str | None = None
    """None: the adapter's own tool choice. ``"none"``: ``tool_specs`` are sent (a provider may
    refuse a conversation with tool calls but no tool definitions) and the model must not call
    any: the built-in adapters send their API's "none" choice (the wrap-up call,
    ``Loop(wrap_up=True)``, asks this way)."""


@fast_init
@dataclass(frozen=True, slots=True)
class ModelReply:
    """One model reply: visible ``text``, optional ``reasoning``, native ``tool_calls``, the
    provider's ``call_id`` (None or "" when it gave none: PolyLoop then uses its intent id),
    ``usage`` (None when the provider did not report it) and ``model``, the name of the model
    that answered as the provider reported it (e.g. a dated snapshot of the model asked for;
    None when not reported). ``tool_calls`` may be given as
    any sequence of :class:`ToolCall` (it is kept as a tuple); a field of the wrong type raises
    ``MalformedValue`` here (inside ``Model.complete``, that makes the call a failed one)."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None
    usage: Usage | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        # Straight-line checks: a reply is built every step.
        if not isinstance(self.text, str):
            raise _bad("ModelReply.text", "a str", self.text)
        if self.reasoning is not None and not isinstance(self.reasoning, str):
            raise _bad("ModelReply.reasoning", "a str or None", self.reasoning)
        if self.call_id is not None and not isinstance(self.call_id, str):
            raise _bad("ModelReply.call_id", "a str or None", self.call_id)
        if self.usage is not None and not isinstance(self.usage, Usage):
            raise _bad("ModelReply.usage", "a Usage or None", self.usage)
        if self.model is not None and not isinstance(self.model, str):
            raise _bad("ModelReply.model", "a str or None", self.model)
        calls = self.tool_calls
        if type(calls) is not tuple:
            if isinstance(calls, str | bytes | Mapping):
                raise _bad("ModelReply.tool_calls", "a sequence of ToolCall", calls)
            try:
                calls = tuple(calls)
            except TypeError:
                raise _bad("ModelReply.tool_calls", "a sequence of ToolCall", calls) from None
            object.__setattr__(self, "tool_calls", calls)
        for call in calls:
            if not isinstance(call, ToolCall):
                raise _bad("each of ModelReply.tool_calls", "a ToolCall", call)


def raw_response_of(reply: ModelReply) -> str:
    """``raw_response`` of kernel.md §7: the visible text, and for native tool calls a newline
    plus the canonical JSON of the calls as received (``arguments`` verbatim)."""
    if not reply.tool_calls:
        return reply.text
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments_text} for c in reply.tool_calls]
    return reply.text + "\n" + canonical_json(calls)


@fast_init
@dataclass(frozen=True, slots=True)
class Action:
    """A decision to act. ``text`` is how the action appears in the trajectory (the interpreter
    decides: ``name(args)`` for a tool call, the code for a code block). ``tool_name`` and
    ``arguments`` are set for tool actions; ``call_id`` is the native tool call's id. A field of
    the wrong type raises ``MalformedValue`` here."""

    text: str
    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = None
    call_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise _bad("Action.text", "a str", self.text)
        if self.tool_name is not None and not isinstance(self.tool_name, str):
            raise _bad("Action.tool_name", "a str or None", self.tool_name)
        a = self.arguments
        if a is not None and type(a) is not dict and not isinstance(a, Mapping):
            raise _bad("Action.arguments", "a mapping or None", a)
        if self.call_id is not None and not isinstance(self.call_id, str):
            raise _bad("Action.call_id", "a str or None", self.call_id)


@fast_init
@dataclass(frozen=True, slots=True)
class FinalAnswer:
    """A decision to stop with an answer (``text``: a str, else ``MalformedValue``)."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise _bad("FinalAnswer.text", "a str", self.text)


@fast_init
@dataclass(frozen=True, slots=True)
class InvalidDecision:
    """The reply could not be read as an action or a final answer. ``feedback`` is sent back to
    the model and recorded as the step's ``parse_error`` (a str, else ``MalformedValue``)."""

    feedback: str

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, str):
            raise _bad("InvalidDecision.feedback", "a str", self.feedback)


Decision: TypeAlias = Action | FinalAnswer | InvalidDecision


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


def _check_limit(name: str, value: object, *, optional: bool) -> None:
    check_limit(f"Limits.{name}", value, optional=optional)


def _check_amount(name: str, value: object) -> None:
    check_amount(f"Limits.{name}", value)


_ADDED_LIMITS = (
    "no_progress_rounds",
    "spreading_rounds",
    "known_failures",
    "baseline",
    "max_tokens",
    "max_cost",
    "max_seconds",
    "max_consecutive_model_failures",
)


@dataclass(frozen=True, slots=True)
class Limits:
    """The budgets and caps of one run (kernel.md §5). Stored with the run.

    ``max_steps`` is always a positive int (the hard backstop); the others may be None
    (unbounded, never ``inf``). Any value <= 0, a bool, NaN or ``inf`` raises
    :class:`ConfigError` here, at construction; but ``max_consecutive_model_failures=0`` is
    taken as 1 (see there).
    """

    max_steps: int = 30
    """Step records appended (invalid, model-failure and env-error steps included)."""
    max_actions: int | None = None
    """Times the environment returned ``executed``."""
    max_consecutive_invalid: int = 3
    """Consecutive invalid decisions that end the run ``parse_failed_repeatedly``."""
    max_prompt_chars: int | None = None
    """Largest prompt (``prompt_chars``, in code points) the model may be sent."""
    max_observation_chars: int | None = None
    """Characters of an observation the model sees; the step keeps the full text."""
    same_failure_limit: int | None = None
    """Stop ``repeated_failure`` when one failure fingerprint has been seen this many times
    (kernel.md §10); None (the default) turns this signal off. 2 is a good start."""
    no_progress_rounds: int | None = None
    """Stop ``repeated_failure`` when the number of failing checks has not gone below its
    fewest for this many rounds in a row (no net progress); None turns it off."""
    spreading_rounds: int | None = None
    """Stop ``repeated_failure`` when the files changed so far grew in this many rounds in a
    row (each fix opens a new front); None turns it off."""
    known_failures: tuple[str, ...] = ()
    """Failures unrelated to the goal: a check (``tests/test_x.py::test_y``), a fingerprint, or
    the ``error_type`` of failures naming no check (``MCPToolError``). They never count toward
    ``same_failure_limit``; the escalation report lists them apart."""
    baseline: bool = False
    """Take the failures the run sees before its first reported edit (its first test run)
    as known too, each until an edit is seen to affect it (see :mod:`polyloop.kernel.ledger`)."""
    max_tokens: int | None = None
    """Input plus output tokens over every model-call attempt of the run, as the providers
    reported them (``token_budget``). An attempt with no usage, or a usage that cannot be
    believed (see :class:`Usage`), counts 0 (``usage_missing``): a report can never lower the
    total, and then only ``max_steps`` and the other budgets bound the run. The first attempt
    a budget cannot count is warned about once (``polyloop`` logger), and the run's
    ``stop_detail`` ends with ``"max_tokens cannot be measured: ..."`` (after its own detail)."""
    max_cost: float | None = None
    """US dollars over every attempt: the provider's reported cost, else the tokens at the
    model's ``Pricing``, else at its price in :mod:`polyloop.models.prices` (``cost_budget``).
    An attempt with no price, or a refused usage, counts 0 (``usage_missing``), warned about as
    for ``max_tokens`` (``"max_cost cannot be measured: ..."``). A finite number > 0, or None."""
    max_seconds: float | None = None
    """Seconds the run was active: wall time while a process drove it, summed over its
    executions and resumes (``time_budget``). Parked or detached time does not count; of a
    crashed execution, the time after its last journaled step does not either. A finite
    number > 0, or None."""
    max_consecutive_model_failures: int = 1
    """Steps in a row whose model call failed after the retry policy that end the run
    ``llm_error``. 1 (the default): the first such step does (kernel.md §6 C). With N > 1, a
    failed step is recorded (a model-failure step: ``llm_call_id`` None) and the next iteration
    calls the model again, from A, so ``max_steps`` still bounds it; a step whose model call
    succeeded resets the count. A failed step adds nothing to the conversation: the next call
    is sent the same messages. Resume counts the model-failure steps at the end of the
    trajectory. 0 is taken as 1 (the seed's rule: a ceiling of zero is tightened to one, so a
    failing model never turns into a run that does not end); a negative number, a bool or a
    non-int is a ``ConfigError``."""

    def __post_init__(self) -> None:
        _check_limit("max_steps", self.max_steps, optional=False)
        _check_limit("max_actions", self.max_actions, optional=True)
        _check_limit("max_consecutive_invalid", self.max_consecutive_invalid, optional=False)
        _check_limit("max_prompt_chars", self.max_prompt_chars, optional=True)
        _check_limit("max_observation_chars", self.max_observation_chars, optional=True)
        _check_limit("same_failure_limit", self.same_failure_limit, optional=True)
        _check_limit("max_tokens", self.max_tokens, optional=True)
        _check_amount("max_cost", self.max_cost)
        _check_amount("max_seconds", self.max_seconds)
        _check_limit("no_progress_rounds", self.no_progress_rounds, optional=True)
        _check_limit("spreading_rounds", self.spreading_rounds, optional=True)
        if type(self.max_consecutive_model_failures) is int and (
            self.max_consecutive_model_failures == 0
        ):
            object.__setattr__(self, "max_consecutive_model_failures", 1)  # tightened to one
        _check_limit(
            "max_consecutive_model_failures", self.max_consecutive_model_failures, optional=False
        )
        known = self.known_failures
        if type(known) is not tuple:
            if isinstance(known, str) or not isinstance(known, Sequence):
                raise ConfigError(
                    f"Limits.known_failures must be a list of checks or fingerprints, got {known!r}"
                )
            known = tuple(known)
            object.__setattr__(self, "known_failures", known)
        for item in known:
            if not isinstance(item, str) or not item:
                raise ConfigError(
                    f"Limits.known_failures holds {item!r}: each must be a non-empty str (a "
                    "failing check or a fingerprint)"
                )
        if type(self.baseline) is not bool:
            raise ConfigError(f"Limits.baseline must be a bool, got {self.baseline!r}")

    @property
    def failure_guard(self) -> bool:
        """Any of the failure guard's stop signals is on (its ledger is kept)."""
        return bool(self.same_failure_limit or self.no_progress_rounds or self.spreading_rounds)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the limits: the first six always, those added since (the
        failure guard's, the token, cost and time budgets, ``max_consecutive_model_failures``)
        only when not their default, so a run that sets none of them stores what older
        readers read."""
        d: dict[str, Any] = {
            name: getattr(self, name) for name in self.__slots__ if name not in _ADDED_LIMITS
        }
        for name in _ADDED_LIMITS:
            value = getattr(self, name)
            if value != _ADDED_DEFAULTS[name]:
                d[name] = list(value) if isinstance(value, tuple) else value
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Limits:
        """Read :meth:`to_dict` output; unknown keys are an error (they mean a newer writer).
        An infinite ``max_cost`` or ``max_seconds``, which older versions took for no limit,
        is read as None (what it meant)."""
        unknown = set(data) - set(cls.__slots__)
        if unknown:
            raise ConfigError(f"unknown limits {sorted(unknown)}")
        inf = [k for k in ("max_cost", "max_seconds") if data.get(k) == math.inf]
        return cls(**{**data, **dict.fromkeys(inf)}) if inf else cls(**data)


_ADDED_DEFAULTS = {f.name: f.default for f in fields(Limits) if f.name in _ADDED_LIMITS}


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How model calls are retried. Only ``ModelCallError(retryable=True)`` is retried.

    The wait before attempt ``n + 1`` is ``initial_backoff_s * multiplier ** (n - 1)``, capped
    at ``max_backoff_s``, spread by ``±jitter`` (a fraction), and never shorter than the
    provider's ``retry_after``. A provider that asks to wait longer than ``max_retry_after_s``
    is not waited for: that failure is final (``llm_error``), so a rollout never sleeps for
    a day on one ``Retry-After`` header (None: no such cap).

    Every field is a finite number (``jitter`` in [0, 1), the others >= 0), never a bool;
    anything else is a ``ConfigError`` here, at construction.
    """

    max_attempts: int = 3
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    multiplier: float = 2.0
    jitter: float = 0.1
    max_retry_after_s: float | None = 300.0
    """None: wait as long as any provider asks."""

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"RetryPolicy.max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        for name in ("initial_backoff_s", "max_backoff_s", "multiplier"):
            check_number(f"RetryPolicy.{name}", getattr(self, name))
        check_number("RetryPolicy.max_retry_after_s", self.max_retry_after_s, none="no cap")
        check_number("RetryPolicy.jitter", self.jitter, below=1)

    def allows_retry(self, failures: int, retry_after: float | None) -> bool:
        """May a retryable failure be retried, after ``failures`` failed attempts?"""
        if failures >= self.max_attempts:
            return False
        cap = self.max_retry_after_s
        return retry_after is None or cap is None or retry_after <= cap

    def backoff_s(self, attempt: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait after failed ``attempt`` (1-based); ``rand`` is uniform in [0, 1)."""
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))
        base *= 1 + self.jitter * (2 * rand - 1)
        return max(base, retry_after or 0.0)
