"""FallbackModel: the next model is asked after the retry policy gives up on a failure of a
kind the caller names; every attempt is journaled naming the model it asked, the step says
which model answered, and resume continues with the model the journal says is next."""

from __future__ import annotations

import pytest

from polyloop import (
    ConfigError,
    FallbackModel,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    RetryPolicy,
    StopReason,
)
from polyloop.testing import FakeClock, ScriptedModel
from polyloop.types import (
    ErrorInfo,
    ModelAttemptFailed,
    ModelDelta,
    ModelIntent,
    ModelRequest,
    Usage,
    record_from_dict,
    record_to_dict,
)
from tests.conftest import Crash, RecordingJournal, call, make_tools

BUSY = ModelCallError("busy", retryable=True, kind="rate_limit")
DOWN = ModelCallError("503", retryable=True, kind="server")


def loop_of(model: object, journal: RecordingJournal, **kw: object) -> Loop:
    kw.setdefault("tools", make_tools())
    kw.setdefault("clock", FakeClock())
    kw.setdefault("retry", RetryPolicy(max_attempts=2))
    return Loop(model, journal=journal, **kw)  # type: ignore[arg-type]


def intents(journal: RecordingJournal) -> list[tuple[int, int, str | None]]:
    return [
        (r.step_idx, r.attempt, r.model)
        for batch in journal.appends
        for r in batch
        if isinstance(r, ModelIntent)
    ]


async def test_the_next_model_is_asked_once_the_primarys_retries_are_spent() -> None:
    journal = RecordingJournal()
    primary = ScriptedModel([BUSY, BUSY, "done"], name="p:one")
    backup = ScriptedModel([call("noop")], name="b:two")
    r = await loop_of(FallbackModel(primary, backup), journal).run("go")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "done"
    # Step 0: the primary twice (the policy's two attempts), then the backup, fresh; step 1
    # asks the primary again (a fallback lasts one step's call).
    assert intents(journal) == [(0, 1, "p:one"), (0, 2, "p:one"), (0, 3, "b:two"), (1, 1, "p:one")]
    assert [s.model for s in r.steps] == ["b:two", "p:one"]
    fell = [
        (r.attempt, r.fallback)
        for batch in journal.appends
        for r in batch
        if isinstance(r, ModelAttemptFailed)
    ]
    assert fell == [(1, False), (2, True)]
    assert [q.attempt for q in backup.requests] == [3]


async def test_a_failure_of_a_kind_not_named_ends_llm_error_without_asking_the_next() -> None:
    journal = RecordingJournal()
    backup = ScriptedModel(["never"], name="b")
    bad_key = ModelCallError("bad key", kind="auth")
    model = FallbackModel(ScriptedModel([bad_key], name="p"), backup)
    r = await loop_of(model, journal).run("go")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail == "ModelCallError: bad key [kind=auth, retryable=False, attempts=1]"
    assert backup.requests == []
    assert r.steps[0].model is None  # a model-failure step: no model answered


async def test_a_kind_the_caller_names_falls_back_at_once_even_when_not_retryable() -> None:
    journal = RecordingJournal()
    too_long = ModelCallError("context length exceeded", kind="context_length")
    model = FallbackModel(
        ScriptedModel([too_long], name="small"),
        ScriptedModel(["ok"], name="large"),
        fallback_on={"context_length"},
    )
    r = await loop_of(model, journal).run("go")
    assert r.final_answer == "ok"
    assert intents(journal) == [(0, 1, "small"), (0, 2, "large")]


async def test_a_wait_longer_than_the_policy_allows_falls_back_instead_of_sleeping() -> None:
    journal = RecordingJournal()
    clock = FakeClock()
    day = ModelCallError("quota", retryable=True, retry_after=86_400.0, kind="rate_limit")
    model = FallbackModel(ScriptedModel([day], name="p"), ScriptedModel(["ok"], name="b"))
    r = await loop_of(model, journal, clock=clock).run("go")
    assert r.final_answer == "ok" and r.steps[0].model == "b"
    assert clock.sleeps == []


async def test_the_last_models_failure_ends_llm_error_counting_every_attempt() -> None:
    journal = RecordingJournal()
    model = FallbackModel(
        ScriptedModel([BUSY, BUSY], name="p"),
        ScriptedModel([DOWN, DOWN], name="b"),
    )
    r = await loop_of(model, journal).run("go")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail == "ModelCallError: 503 [kind=server, retryable=True, attempts=4]"
    assert intents(journal) == [(0, 1, "p"), (0, 2, "p"), (0, 3, "b"), (0, 4, "b")]


async def test_three_models_are_asked_in_order() -> None:
    journal = RecordingJournal()
    model = FallbackModel(
        ScriptedModel([DOWN], name="a"),
        ScriptedModel([DOWN], name="b"),
        ScriptedModel(["ok"], name="c"),
    )
    r = await loop_of(model, journal, retry=RetryPolicy(max_attempts=1)).run("go")
    assert r.final_answer == "ok"
    assert [m for _, _, m in intents(journal)] == ["a", "b", "c"]


async def test_usage_sums_over_the_models_that_answered() -> None:
    journal = RecordingJournal()
    reply = ModelReply(text="ok", usage=Usage(10, 2, cached_tokens=4, reasoning_tokens=1))
    model = FallbackModel(ScriptedModel([DOWN], name="p"), ScriptedModel([reply], name="b"))
    r = await loop_of(model, journal, retry=RetryPolicy(max_attempts=1)).run("go")
    assert r.usage == Usage(10, 2, 4, 1)


def the_fallback_write(journal: RecordingJournal) -> int:
    """The 1-based number of the append that journals the fallback."""
    for n, batch in enumerate(journal.appends, start=1):
        if any(isinstance(r, ModelAttemptFailed) and r.fallback for r in batch):
            return n
    raise AssertionError("no fallback was journaled")


@pytest.mark.parametrize("crash_after", [False, True])
async def test_resume_after_a_crash_around_the_fallback_asks_the_model_the_journal_names(
    crash_after: bool,
) -> None:
    reference = RecordingJournal()
    await loop_of(
        FallbackModel(ScriptedModel([DOWN, DOWN], name="p"), ScriptedModel(["ok"], name="b")),
        reference,
    ).run("go", run_id="r")
    n = the_fallback_write(reference)
    journal = RecordingJournal(crash_at=n, crash_after=crash_after)
    model = FallbackModel(ScriptedModel([DOWN, DOWN], name="p"), ScriptedModel([], name="b"))
    with pytest.raises(Crash):
        await loop_of(model, journal).run("go", run_id="r")
    primary = ScriptedModel([DOWN], name="p")
    resumed = RecordingJournal(journal.inner)
    r = await loop_of(FallbackModel(primary, ScriptedModel(["ok"], name="b")), resumed).resume("r")
    assert r.final_answer == "ok" and r.steps[0].model == "b"
    if crash_after:  # the journal said "fall back": the backup, at once
        assert intents(resumed) == [(0, 3, "b")] and primary.requests == []
    else:  # attempt 2 was lost in the crash (uncertain, not a failure): the primary once more
        assert intents(resumed) == [(0, 3, "p"), (0, 4, "b")]


async def test_resume_after_the_fallback_record_asks_the_next_model_not_the_primary() -> None:
    # Writes: 1 intent p/1, 2 failed p/1 (fallback, max_attempts=1), 3 intent b/2: crash
    # before write 3, so the journal's last word is "fall back".
    journal = RecordingJournal(crash_at=3)
    model = FallbackModel(ScriptedModel([DOWN], name="p"), ScriptedModel([], name="b"))
    with pytest.raises(Crash):
        await loop_of(model, journal, retry=RetryPolicy(max_attempts=1)).run("go", run_id="r")
    primary = ScriptedModel(["wrong"], name="p")
    backup = ScriptedModel(["ok"], name="b")
    resumed = RecordingJournal(journal.inner)
    r = await loop_of(
        FallbackModel(primary, backup), resumed, retry=RetryPolicy(max_attempts=1)
    ).resume("r")
    assert r.final_answer == "ok" and r.steps[0].model == "b"
    assert primary.requests == [] and intents(resumed) == [(0, 2, "b")]


async def test_resume_with_fewer_models_asks_the_last_one() -> None:
    journal = RecordingJournal(crash_at=3)
    model = FallbackModel(ScriptedModel([DOWN], name="p"), ScriptedModel([], name="b"))
    with pytest.raises(Crash):
        await loop_of(model, journal, retry=RetryPolicy(max_attempts=1)).run("go", run_id="r")
    only = ScriptedModel(["ok"], name="solo")
    r = await loop_of(only, RecordingJournal(journal.inner)).resume("r")
    assert r.final_answer == "ok" and r.steps[0].model == "solo"


async def test_outside_a_run_complete_asks_each_model_once_in_order() -> None:
    request = ModelRequest("r", 0, 1, (), ())
    backup = ScriptedModel(["ok"], name="b")
    model = FallbackModel(ScriptedModel([DOWN], name="p"), backup)
    assert (await model.complete(request)).text == "ok"
    with pytest.raises(ModelCallError, match="bad"):
        await FallbackModel(
            ScriptedModel([ModelCallError("bad", kind="auth")]), ScriptedModel(["x"])
        ).complete(request)
    assert model.name == "fallback(p, b)"
    assert FallbackModel(ScriptedModel([]), backup).name == "fallback(?, b)"


async def test_outside_a_run_a_model_that_streamed_part_of_its_reply_is_not_replaced() -> None:
    cut = ModelCallError("stream cut off", retryable=True, kind="connection")
    backup = ScriptedModel(["Rome."], name="b")
    pieces: list[str] = []
    request = ModelRequest("r", 0, 1, (), (), lambda kind, text: pieces.append(text))
    with pytest.raises(ModelCallError, match="cut off"):
        await FallbackModel(Streams(["Par"], cut), backup).complete(request)
    assert pieces == ["Par"] and backup.requests == []
    # Nothing streamed: the next model is asked, its deltas still reach the caller.
    assert (await FallbackModel(Streams([], cut), backup).complete(request)).text == "Rome."


@pytest.mark.parametrize(
    ("args", "kw", "message"),
    [
        ((ScriptedModel([]),), {}, "at least one other"),
        ((ScriptedModel([]), object()), {}, "model 1"),
        ((ScriptedModel([]), ScriptedModel([])), {"fallback_on": "server"}, "not the string"),
        ((ScriptedModel([]), ScriptedModel([])), {"fallback_on": [1]}, "kind strings"),
    ],
)
def test_bad_configuration_is_a_one_line_config_error(
    args: tuple[object, ...], kw: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        FallbackModel(*args, **kw)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


async def test_a_budget_still_counts_steps_not_attempts() -> None:
    journal = RecordingJournal()
    model = FallbackModel(
        ScriptedModel([DOWN, call("noop")], name="p"), ScriptedModel([call("noop")], name="b")
    )
    r = await loop_of(model, journal, limits=Limits(max_steps=2), retry=RetryPolicy(1)).run("go")
    assert r.stop_reason == StopReason.step_budget and r.steps_used == 2
    assert [s.model for s in r.steps] == ["b", "p"]


class Streams:
    """A streaming model stand-in: delivers ``pieces`` through ``on_delta``, then fails."""

    name = "s:streams"

    def __init__(self, pieces: list[str], error: ModelCallError) -> None:
        self.pieces, self.error = pieces, error
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.calls += 1
        for piece in self.pieces:
            if request.on_delta is not None:
                request.on_delta("text", piece)
        raise self.error


async def test_a_failure_after_partial_output_was_shown_stays_with_that_model() -> None:
    cut = ModelCallError("stream cut off", retryable=True, kind="connection")
    primary = Streams(["Par"], cut)
    backup = ScriptedModel(["Rome."], name="b")
    events: list[object] = []
    r = await loop_of(
        FallbackModel(primary, backup), RecordingJournal(), observers=[events.append]
    ).run("go")
    assert r.stop_reason == StopReason.llm_error and primary.calls == 2
    assert backup.requests == []
    deltas = [e for e in events if isinstance(e, ModelDelta)]
    assert [(d.step_idx, d.attempt, d.kind, d.text) for d in deltas] == [
        (0, 1, "text", "Par"),
        (0, 2, "text", "Par"),
    ]
    assert all(d.run_id == r.run_id for d in deltas)


async def test_without_observers_nothing_was_shown_and_the_fallback_happens() -> None:
    cut = ModelCallError("stream cut off", retryable=True, kind="connection")
    primary = Streams(["Par"], cut)
    backup = ScriptedModel(["Rome."], name="b")
    r = await loop_of(FallbackModel(primary, backup), RecordingJournal()).run("go")
    assert r.final_answer == "Rome." and primary.calls == 2


async def test_a_failure_before_any_delta_falls_back_even_with_observers() -> None:
    primary = Streams([], DOWN)
    backup = ScriptedModel(["Rome."], name="b")
    events: list[object] = []
    r = await loop_of(
        FallbackModel(primary, backup), RecordingJournal(), observers=[events.append]
    ).run("go")
    assert r.final_answer == "Rome."


class StreamsThenFails(Streams):
    """The first attempt streams ``pieces`` and fails; later attempts fail before any delta."""

    async def complete(self, request: ModelRequest) -> ModelReply:
        if self.calls:
            self.pieces = []
        return await super().complete(request)


async def test_partial_output_shown_by_an_earlier_attempt_keeps_the_step_with_its_model() -> None:
    # Attempt 1 shows "Par" and is retried; attempt 2 fails before any delta. The step has
    # shown the primary's output, so it stays with the primary (its retries spent: llm_error).
    cut = ModelCallError("stream cut off", retryable=True, kind="connection")
    primary = StreamsThenFails(["Par"], cut)
    backup = ScriptedModel(["Rome."], name="b")
    events: list[object] = []
    journal = RecordingJournal()
    r = await loop_of(FallbackModel(primary, backup), journal, observers=[events.append]).run("go")
    assert r.stop_reason == StopReason.llm_error and primary.calls == 2
    assert backup.requests == []
    assert intents(journal) == [(0, 1, "s:streams"), (0, 2, "s:streams")]
    shown = [
        (r.attempt, r.partial_shown, r.fallback)
        for batch in journal.appends
        for r in batch
        if isinstance(r, ModelAttemptFailed)
    ]
    assert shown == [(1, True, False)]  # attempt 2's failure is the step's end
    assert [(d.attempt, d.text) for d in events if isinstance(d, ModelDelta)] == [(1, "Par")]


async def test_a_resumed_step_whose_journal_says_output_was_shown_stays_with_its_model() -> None:
    # Writes: 1 intent s/1, 2 failed s/1 (partial shown, retried), 3 intent s/2: crash there.
    cut = ModelCallError("stream cut off", retryable=True, kind="connection")
    journal = RecordingJournal(crash_at=3)
    with pytest.raises(Crash):
        await loop_of(
            FallbackModel(Streams(["Par"], cut), ScriptedModel([], name="b")),
            journal,
            observers=[lambda e: None],
        ).run("go", run_id="r")
    primary = Streams([], cut)  # the resumed process has no observers; nothing streams
    backup = ScriptedModel(["Rome."], name="b")
    r = await loop_of(FallbackModel(primary, backup), RecordingJournal(journal.inner)).resume("r")
    assert r.stop_reason == StopReason.llm_error and primary.calls == 1
    assert backup.requests == []


def test_the_partial_shown_mark_survives_the_journal_encoding() -> None:
    rec = ModelAttemptFailed(0, "i", 1, ErrorInfo("E", "m"), 1.0, partial_shown=True)
    assert record_from_dict(record_to_dict(rec)) == rec
    plain = ModelAttemptFailed(0, "i", 1, ErrorInfo("E", "m"), 1.0)
    assert "partial_shown" not in record_to_dict(plain)
    assert record_from_dict(record_to_dict(plain)) == plain
