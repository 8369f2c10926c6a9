"""record_json(r) is canonical_json(record_to_dict(r)), byte for byte, and raises alike.

Every comparison also calls the hand-written encoder of a hot kind directly, so a fast path
that silently fell back to the reference (or returned where the reference raises) fails here.
"""

from __future__ import annotations

import enum
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyloop.kernel.steps import (
    action_step,
    final_answer_step,
    invalid_step,
    model_failure_step,
)
from polyloop.types import (
    Action,
    ActionIntent,
    ActionResult,
    ActionStatus,
    ActionUnknown,
    ApprovalDecided,
    ApprovalRequested,
    ApprovedActionStarted,
    ErrorInfo,
    EscalationReport,
    Failure,
    FailureKnown,
    FailureSeen,
    FileEdit,
    FingerprintEntry,
    GuardVerdict,
    KnownEntry,
    Limits,
    LimitsChanged,
    ModelAttemptFailed,
    ModelFailure,
    ModelIntent,
    ModelReply,
    ModelResult,
    Outcome,
    PendingAction,
    Record,
    ReplayPolicy,
    RoundEntry,
    RunEnd,
    RunTotals,
    StepRecord,
    StepWritten,
    StopReason,
    TestEdit,
    ToolCall,
    Usage,
    canonical_json,
    record_from_dict,
    record_json,
    record_to_dict,
)
from polyloop.types._records_json import _HOT_KINDS

HOT = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fast_encoder(record: Record) -> Callable[[Any], str] | None:
    return _HOT_KINDS.get(type(record))


def reference(record: Record) -> str | Exception:
    try:
        return canonical_json(record_to_dict(record))
    except Exception as exc:
        return exc


def assert_same(record: Record) -> None:
    """record_json (and the kind's own encoder) agree with the reference: same text, or the
    same exception (type and message)."""
    fast = fast_encoder(record)
    expected = reference(record)
    if isinstance(expected, str):
        assert record_json(record) == expected
        if fast is not None:
            assert fast(record) == expected
        return
    with pytest.raises(type(expected)) as info:
        record_json(record)
    assert type(info.value) is type(expected)
    assert str(info.value) == str(expected)
    if fast is not None:
        with pytest.raises(Exception):  # noqa: B017, PT011 -- any error, as long as no text
            fast(record)


# --- realistic records of every kind, as the kernel builds them ------------------------------

ARGS: dict[str, Any] = {"path": "src/app.py", "lines": [1, 40]}
CALL = ToolCall("read_file", ARGS, "call_0")
REPLY = ModelReply(
    "I'll read the file first.",
    "The bug is probably in app.py.",
    (CALL,),
    "chatcmpl-9x",
    Usage(1834, 57),
)
NOOP_REPLY = ModelReply("", None, (ToolCall("noop", "{}", "call_0"),), "chatcmpl-1", None)
ACTION = Action('read_file({"lines":[1,40],"path":"src/app.py"})', "read_file", ARGS, "call_0")
ARGS_JSON = canonical_json(ARGS)
NOOP = Action("noop({})", "noop", {}, "call_0")
FAILURE = Failure(
    "tests/test_app.py::test_parse", "AssertionError", "src/app.py:12", "assert 1 == 2"
)
OUTCOME = Outcome(ActionStatus.executed, "def parse(s):\n    return int(s)\n", truncated_chars=3)
FAILED = Outcome(ActionStatus.executed, "1 failed", completed=False, failure=FAILURE)
OTHER = Failure("tests/test_app.py::test_dump", "KeyError", "src/app.py:30", "'k'")
TEST_RUN = Outcome(ActionStatus.executed, "2 failed", failures=(FAILURE, OTHER))
TAMPERED = Outcome(
    ActionStatus.executed,
    "Edited 'tests/test_app.py'",
    edits=(FileEdit("tests/test_app.py", True, ("assertion_deleted",)), FileEdit("src/app.py")),
)
REPORT = EscalationReport(
    "run-1",
    "repeated_failure",
    7,
    2,
    "unchanged",
    (FingerprintEntry(FAILURE.fingerprint(), FAILURE, 2, (3, 7)),),
    ("edit(a)", "edit(b)"),
    ("src/app.py",),
)
FULL_REPORT = replace(
    REPORT,
    signals=("same_failure", "no_progress"),
    why="one failure seen 2 times",
    rounds=(
        RoundEntry(1, 0, 3, ("src/app.py",), ("t::a", "t::b"), FAILURE.fingerprint()),
        RoundEntry(2, 4, 7, (), ("t::a",), None),
    ),
    known=(
        KnownEntry("t::b", "given", OTHER, 3),
        KnownEntry("t::c", "baseline", FAILURE, 1, 4),
        KnownEntry("deadbeef0000", "given"),
    ),
    test_edits=(TestEdit(5, "tests/test_app.py", ("skip_added",)),),
)

ACTION_STEP = StepWritten(
    action_step(4, REPLY, "chatcmpl-9x", ACTION, ARGS_JSON, OUTCOME, 10, 1500, 12)
)
RECORDS: list[Record] = [
    ModelIntent(0, "01J9Z8K3T6QW4M5N7P8R9S0T1U", 1),
    ModelIntent(0, "01J9Z8K3T6QW4M5N7P8R9S0T1U", 2, "anthropic:claude-sonnet-4-5"),
    ModelResult(0, "01J9Z8K3T6QW4M5N7P8R9S0T1U", 1, "chatcmpl-9x", REPLY, 812.5),
    ModelResult(
        0,
        "i0",
        2,
        "msg_01",
        ModelReply("ok", usage=Usage(900, 40, 512, 12), model="claude-sonnet-4-5-20250929"),
        640.0,
    ),
    ModelResult(1, "i1", 2, "i1", ModelReply("The answer is 42."), 3.0),
    ModelResult(2, "i2", 1, "chatcmpl-1", NOOP_REPLY, 0.25),
    ModelResult(3, "i3", 1, "chatcmpl-3", ModelReply("bad \ufffd"), 1.0, 1),
    ModelAttemptFailed(0, "i0", 1, ErrorInfo("ModelCallError", "429", "rate_limit", True, 2), 5.0),
    ModelAttemptFailed(
        0, "i0", 2, ErrorInfo("ModelCallError", "503", "server", True), 9.0, fallback=True
    ),
    ModelFailure(0, "i0", 3, ErrorInfo("TimeoutError", "timed out"), 30000.0),
    ModelFailure(0, "i0", 1, ErrorInfo("ValueError", "bad \ufffd\ufffd"), 2.0, 2),
    ActionIntent(0, "op-1", ACTION, ARGS_JSON, ReplayPolicy.never, True),
    ActionIntent(1, "op-2", Action("print('hi')"), None, ReplayPolicy.idempotent, True),
    ActionIntent(2, "op-3", Action("nope({})", "nope", {}, None), "{}", ReplayPolicy.never, False),
    ActionIntent(3, "op-4", Action("t(\ufffd)", "t"), None, ReplayPolicy.never, True, 1),
    ActionResult(0, "op-1", OUTCOME, 1.25),
    ActionResult(1, "op-2", FAILED, 17.0),
    ActionResult(2, "op-3", Outcome(ActionStatus.not_executed, "no such tool", synthetic=True), 0),
    ActionResult(3, "op-4", Outcome(ActionStatus.executed, "report_\ufffd.txt"), 2.5, 1),
    ActionResult(4, "op-5", TEST_RUN, 310.0),
    ActionResult(5, "op-6", TAMPERED, 2.0),
    ActionUnknown(6, "op-7", "HTTP timeout after the request was sent", "replayed", 1),
    ActionUnknown(6, "op-7", "still \ufffd", "ended", 2),
    ApprovalRequested(7, "op-8", 1_700_000_000.5, None, 12.25),
    ApprovalRequested(7, "op-8", 1_700_000_000.5, 1_700_003_600.5),
    ApprovalDecided(7, "op-8", True, None, "alice@host pid 1", 1_700_000_100.0),
    ApprovalDecided(7, "op-8", False, "not to the CEO \u00e9", "bob", 1_700_000_100.0),
    ApprovedActionStarted(7, "op-8"),
    StepWritten(model_failure_step(0, 1200, 30001.5)),
    StepWritten(invalid_step(1, REPLY, "chatcmpl-9x", "Reply with one tool call.", 1300, 900.0)),
    StepWritten(final_answer_step(2, ModelReply("Done: 42"), "c2", 1400, 700.0)),
    StepWritten(final_answer_step(3, ModelReply("Done"), "c3", 1400, 7.0, "Cite a source.")),
    ACTION_STEP,
    StepWritten(action_step(5, NOOP_REPLY, "c5", NOOP, "{}", FAILED, 0, 9, 1.5)),
    StepWritten(replace(model_failure_step(6, 9, 1.0), replaced_chars=3)),
    StepWritten(replace(ACTION_STEP.step, outcome_unknown="reconciled")),
    RunEnd(StopReason.agent_finished, None, "42", 3, 1, 1_700_000_000.25),
    RunEnd(
        StopReason.resume_state_unknown,
        "op_id=op-1 tool=read_file",
        None,
        4,
        2,
        1_700_000_001.0,
        PendingAction(4, "op-1", "read_file", ARGS_JSON, ACTION.text, ReplayPolicy.never),
    ),
    RunEnd(StopReason.repeated_failure, None, None, 8, 8, 1.0, report=REPORT),
    RunEnd(
        StopReason.cost_budget, None, None, 5, 4, 2.0, totals=RunTotals(81_000, 1.0125, 61.5, 1)
    ),
    StepWritten(model_failure_step(7, 9, 1.0), 12.75),
    ModelResult(
        0, "i9", 1, "c9", ModelReply("ok", usage=Usage(10, 2, cost_usd=0.0003)), 1.0, 0, 0.0003
    ),
    LimitsChanged(Limits(max_steps=50, max_actions=20, same_failure_limit=2)),
    LimitsChanged(
        Limits(no_progress_rounds=3, spreading_rounds=2, known_failures=("t::b",), baseline=True)
    ),
    GuardVerdict(3, "cites_source", True, "Cite a source."),
    GuardVerdict(4, "cites_source", False),
    FailureSeen(5, FAILURE.fingerprint(), FAILURE, ACTION.text),
    FailureSeen(
        7, OTHER.fingerprint(), OTHER, None, 3, True, (FAILURE.check or "", "t::b"), ("a.py",)
    ),
    FailureKnown(1, OTHER.fingerprint(), OTHER),
    TestEdit(6, "tests/test_app.py", ("assertion_deleted", "skip_added")),
    RunEnd(StopReason.repeated_failure, None, None, 9, 9, 2.0, report=FULL_REPORT),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind)
def test_every_kind_matches_the_reference(record: Record) -> None:
    assert_same(record)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind)
def test_every_kind_reads_back_as_written(record: Record) -> None:
    assert record_from_dict(json.loads(record_json(record))) == record


def test_every_kind_is_covered_and_the_step_kinds_take_the_fast_path() -> None:
    assert {type(r) for r in RECORDS} == set(get_args(Record))
    fast = {type(r) for r in RECORDS if fast_encoder(r) is not None}
    assert fast == {ModelIntent, ModelResult, ActionIntent, ActionResult, StepWritten}


def test_the_step_encoder_writes_every_step_field() -> None:
    body = json.loads(record_json(ACTION_STEP))
    assert set(body["step"]) == {f.name for f in fields(StepRecord)}


# --- adversarial values ----------------------------------------------------------------------

# Escaped by JSON, or not (ensure_ascii=False): quotes, backslash, controls, line separators,
# non-ASCII, a BOM, a lone surrogate.
TRICKY = ['"', "\\", "\u2028", "\u2029", "\x00", "\x1f", "\x7f", "\b\f\n\r\t", "é", "😀"]
TRICKY += ["\ufeff", "\ud800", "/", "</script>"]


class Colour(enum.StrEnum):
    red = "r\u00e9d"


class Level(enum.IntEnum):
    high = 3


class Loud(str):
    def __str__(self) -> str:
        return "LOUD"


class Odd(int):
    def __repr__(self) -> str:
        return "odd"


class Weird(float):
    def __repr__(self) -> str:
        return "weird"


texts = st.one_of(
    st.text(max_size=20),
    st.text(st.sampled_from([c for t in TRICKY for c in t] + ["a", " "]), max_size=12),
    st.sampled_from(["", *TRICKY]),
)
opt_texts = st.none() | texts
big_ints = st.sampled_from([0, -1, 2**31, -(2**63), 2**64 + 1, 10**300, -(10**4299)])
ints = st.integers() | big_ints
floats = st.floats() | st.sampled_from([-0.0, 0.0, 1e-320, 1e300, 5e-324, math.pi])
subclassed = st.sampled_from([Colour.red, Level.high, Loud('a"b'), Odd(5), Weird(2.5), True])
scalars = st.none() | st.booleans() | ints | floats | texts | subclassed
opt_ints = st.none() | ints
numbers = ints | floats | st.sampled_from([Level.high, Odd(7), Weird(0.5)])


class ReadOnly(Mapping[Any, Any]):
    """A mapping that is not a dict: record_to_dict converts it with dict(...)."""

    def __init__(self, data: dict[Any, Any]) -> None:
        self._data = data

    def __getitem__(self, key: Any) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class ItemsLie(dict[Any, Any]):
    """A dict whose items() the C encoder would call; dict(...) copies past it."""

    def items(self) -> Any:
        return [("lie", 1)]


keys = texts | st.integers(-3, 3) | st.sampled_from([1.5, float("nan"), True, None])
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=2).map(tuple)
        | st.dictionaries(texts, inner, max_size=3)
    ),
    max_leaves=6,
)
str_key_dicts = st.dictionaries(texts, json_values, max_size=3)
mixed_key_dicts = st.dictionaries(keys, json_values, max_size=3)
arg_dicts: st.SearchStrategy[dict[Any, Any]] = str_key_dicts | mixed_key_dicts
arg_mappings: st.SearchStrategy[Mapping[Any, Any]] = st.one_of(
    arg_dicts,
    arg_dicts.map(ReadOnly),
    arg_dicts.map(lambda d: MappingProxyType(d)),
    arg_dicts.map(lambda d: OrderedDict(d)),
    arg_dicts.map(ItemsLie),
)
tool_calls = st.builds(ToolCall, texts, texts | arg_mappings, opt_texts)
usages = st.none() | st.builds(
    Usage, opt_ints, opt_ints, opt_ints, opt_ints, st.none() | st.floats(allow_nan=False)
)
replies = st.builds(
    ModelReply,
    text=texts,
    reasoning=opt_texts,
    tool_calls=st.lists(tool_calls, max_size=3).map(tuple),
    call_id=opt_texts,
    usage=usages,
    model=opt_texts,
)
failures = st.none() | st.builds(Failure, opt_texts, opt_texts, opt_texts, opt_texts)
outcomes = st.builds(
    Outcome,
    status=st.sampled_from(ActionStatus),
    observation=texts,
    completed=st.booleans(),
    marker=st.booleans(),
    synthetic=st.booleans(),
    truncated_chars=st.integers(min_value=0) | st.just(10**50),
    failure=failures,
)
actions = st.builds(Action, texts, opt_texts, st.none() | arg_mappings, opt_texts)
odd_walls = st.sampled_from([math.inf, math.nan, -0.0, Level.high, Weird(1.0)])
counts = st.integers(min_value=0) | st.sampled_from([10**100])
replaced = counts | numbers  # a record's count is not checked: any value encodes alike
step_records = st.builds(
    StepRecord,
    step_idx=counts,
    raw_response=texts,
    response_chars=counts,
    reasoning_chars=counts,
    action=opt_texts,
    parse_ok=st.booleans(),
    parse_error=opt_texts,
    observation=opt_texts,
    observation_synthetic=st.booleans(),
    observation_truncated_chars=counts,
    prompt_chars=counts,
    llm_call_id=st.none() | texts.filter(bool),
    step_wall_ms=st.floats(min_value=0) | st.integers(min_value=0) | odd_walls,
    tool_name=opt_texts,
    tool_args_json=opt_texts,
    action_status=st.none() | st.sampled_from([*ActionStatus, "executed", "env_error"]),
    completed=st.booleans(),
    schema_version=st.sampled_from(["1.0", "1.7", "1"]),
    replaced_chars=counts,
    model=opt_texts,
)


@HOT
@given(st.builds(ModelIntent, scalars, scalars, scalars, opt_texts | scalars))
def test_model_intent(record: ModelIntent) -> None:
    assert_same(record)


@HOT
@given(
    st.builds(
        ModelResult,
        numbers,
        texts | scalars,
        numbers,
        opt_texts,
        replies,
        numbers,
        replaced,
        st.none() | numbers,
    )
)
def test_model_result(record: ModelResult) -> None:
    assert_same(record)


@HOT
@given(
    st.builds(
        ActionIntent,
        numbers,
        texts,
        actions,
        opt_texts,
        st.sampled_from(ReplayPolicy),
        st.booleans() | scalars,
        replaced,
    )
)
def test_action_intent(record: ActionIntent) -> None:
    assert_same(record)


@HOT
@given(st.builds(ActionResult, numbers, opt_texts, outcomes, numbers, replaced))
def test_action_result(record: ActionResult) -> None:
    assert_same(record)


@HOT
@given(step_records, st.none() | st.floats(min_value=0) | numbers)
def test_step(step: StepRecord, active_s: float | None) -> None:
    assert_same(StepWritten(step, active_s))


# --- values JSON cannot represent ------------------------------------------------------------


def cyclic() -> dict[str, Any]:
    d: dict[str, Any] = {"a": 1}
    d["self"] = [d]
    return d


def forced(value: Any, **fields: Any) -> Any:
    """``value`` with ``fields`` set past its construction checks: what the encoders meet if
    a value is changed after it was built."""
    for name, v in fields.items():
        object.__setattr__(value, name, v)
    return value


def with_call_args(arguments: Any) -> ModelResult:
    reply = ModelReply(tool_calls=(forced(ToolCall("t", {}, "call_0"), arguments=arguments),))
    return ModelResult(0, "i", 1, "c", reply, 1.0)


def with_action_args(arguments: Any, policy: Any = ReplayPolicy.never) -> ActionIntent:
    action = forced(Action("t()", "t", {}), arguments=arguments)
    return ActionIntent(0, "op", action, None, policy, True)


@pytest.mark.parametrize(
    ("record", "error"),
    [
        (with_call_args({"x": object()}), TypeError),
        (with_call_args({1: 1, "a": 2}), TypeError),  # int and str keys do not sort
        (with_call_args({(1,): 1}), TypeError),
        (with_call_args({"b": b"x"}), TypeError),
        (with_call_args(cyclic()), ValueError),
        (with_call_args(5), TypeError),  # dict(5)
        (ModelResult(0, "i", 1, "c", ModelReply(usage=Usage(10**5000, 1)), 1.0), ValueError),
        (ModelIntent(0, "i", {1, 2}), TypeError),  # type: ignore[arg-type]
        (with_action_args({"s": {1}}), TypeError),
        (with_action_args(cyclic()), ValueError),
        (with_action_args([(1, 2, 3)]), ValueError),  # dict([(1, 2, 3)])
        (with_action_args({}, "never"), AttributeError),  # "never".value
        (ActionResult(0, "op", Outcome(ActionStatus.executed, ""), object()), TypeError),  # type: ignore[arg-type]
        (StepWritten(model_failure_step(0, 10**5000, 1.0)), ValueError),
        (GuardVerdict(0, "g", True, object()), TypeError),  # type: ignore[arg-type]
        # Two faults: record_to_dict converts (dict(...) raises ValueError) before the
        # encoder meets the object in intent_id (TypeError), which sorts first.
        (ModelResult(0, object(), 1, "c", with_call_args([(1, 2, 3)]).reply, 1), ValueError),  # type: ignore[arg-type]
    ],
)
def test_unrepresentable_values_raise_like_the_reference(
    record: Record, error: type[Exception]
) -> None:
    with pytest.raises(error):
        canonical_json(record_to_dict(record))
    with pytest.raises(error):
        record_json(record)
    assert_same(record)


def test_a_failed_record_does_not_spoil_the_next() -> None:
    """The shared encoder's cycle markers are cleared after a failure."""
    bad = ActionIntent(0, "op", Action("t()", "t", cyclic()), None, ReplayPolicy.never, True)
    with pytest.raises(ValueError, match="Circular"):
        record_json(bad)
    for record in RECORDS:
        assert_same(record)


# --- subclasses take the reference path -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaggedIntent(ModelIntent):
    tag: str = "t"


@dataclass(frozen=True, slots=True)
class LoudStep(StepRecord):
    def to_dict(self) -> dict[str, Any]:
        return {**StepRecord.to_dict(self), "loud": True}


def test_subclasses_match_the_reference() -> None:
    assert_same(TaggedIntent(0, "i", 1))
    step = model_failure_step(0, 10, 1.0)
    loud = LoudStep(**{f.name: getattr(step, f.name) for f in fields(StepRecord)})
    assert '"loud":true' in record_json(StepWritten(loud))
    assert_same(StepWritten(loud))
