"""kernel.md §4–§6: stop reasons, budgets, and the stop decision A–H. One test per rule."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from polyloop import (
    ActionStatus,
    ConfigError,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    Outcome,
    RetryPolicy,
    RunDetached,
    StopReason,
    ToolRegistry,
)
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import ActionIntent, Failure, ModelIntent, ModelRequest
from tests.conftest import RecordingJournal, call, make_tools

TEN = [
    "task_completed",
    "step_budget",
    "parse_failed_repeatedly",
    "context_overflow",
    "env_error",
    "llm_error",
    "agent_finished",
    "action_budget",
    "cancelled",
    "resume_state_unknown",
]


def loop_with(script: list[object], journal: RecordingJournal, **kw: object) -> Loop:
    kw.setdefault("tools", make_tools())
    kw.setdefault("clock", FakeClock())
    return Loop(ScriptedModel(script), journal=journal, **kw)  # type: ignore[arg-type]


# --- §4 the stop reasons -------------------------------------------------------------------


def test_the_ten_original_stop_reasons_keep_their_strings_and_order() -> None:
    assert [s.value for s in StopReason][:10] == TEN


def test_stop_reasons_only_grow_at_the_end() -> None:
    assert [s.value for s in StopReason][10:] == [
        "repeated_failure",
        "token_budget",
        "cost_budget",
        "time_budget",
        "stopped",
        "escalated",
    ]


def test_str_and_format_of_a_stop_reason_are_its_value() -> None:
    assert issubclass(StopReason, enum.StrEnum)
    assert str(StopReason.step_budget) == f"{StopReason.step_budget}" == "step_budget"
    assert str(ActionStatus.not_executed) == f"{ActionStatus.not_executed}" == "not_executed"
    assert [a.value for a in ActionStatus] == ["executed", "not_executed", "env_error"]


def test_stop_reason_docstring_states_growth_and_the_cancelled_asymmetry() -> None:
    doc = StopReason.__doc__ or ""
    assert "append-only" in doc.lower()
    for growth in ("final-output validation", "compaction", "intervention"):
        assert growth in doc
    assert "cancelled" in doc and "re-raised" in doc


# --- §5 budgets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "max_steps",
        "max_actions",
        "max_consecutive_invalid",
        "max_prompt_chars",
        "max_observation_chars",
        "same_failure_limit",
    ],
)
@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_a_limit_of_zero_or_less_or_not_an_int_is_rejected_at_construction(
    field: str, bad: object
) -> None:
    with pytest.raises(ConfigError, match=field):
        Limits(**{field: bad})  # type: ignore[arg-type]


def test_max_steps_cannot_be_unbounded() -> None:
    with pytest.raises(ConfigError, match="max_steps"):
        Limits(max_steps=None)  # type: ignore[arg-type]


async def test_steps_count_invalid_and_not_executed_steps_actions_count_executed_only(
    journal: RecordingJournal,
) -> None:
    script = [call("noop"), "", call("nope"), call("noop"), "done"]
    r = await loop_with(script, journal).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert r.steps_used == 5 == len(r.steps)
    assert r.actions_executed == 2


async def test_both_budgets_exhausted_at_once_is_step_budget(journal: RecordingJournal) -> None:
    r = await loop_with(
        [call("noop"), call("noop")], journal, limits=Limits(max_steps=2, max_actions=2)
    ).run("g")
    assert (r.steps_used, r.actions_executed) == (2, 2)
    assert r.stop_reason == StopReason.step_budget


async def test_action_budget_stops_when_executed_actions_reach_the_limit(
    journal: RecordingJournal,
) -> None:
    script = [call("noop"), call("nope"), call("noop"), call("noop")]
    r = await loop_with(script, journal, limits=Limits(max_steps=10, max_actions=2)).run("g")
    assert r.stop_reason == StopReason.action_budget
    assert (r.steps_used, r.actions_executed) == (3, 2)


async def test_limits_are_stored_with_the_run(journal: RecordingJournal) -> None:
    limits = Limits(max_steps=7, max_actions=3)
    r = await loop_with(["x"], journal, limits=limits).run("g")
    spec, _ = await journal.read(r.run_id)
    assert spec.limits == limits


# --- §6 A: budgets settle at the start of the next iteration -------------------------------


async def test_completion_on_the_last_allowed_step_is_task_completed(
    journal: RecordingJournal,
) -> None:
    script = [call("noop"), call("done", {"answer": "42"})]
    r = await loop_with(script, journal, limits=Limits(max_steps=2)).run("g")
    assert r.stop_reason == StopReason.task_completed
    assert r.steps_used == 2


async def test_a_final_answer_on_the_last_allowed_step_is_agent_finished(
    journal: RecordingJournal,
) -> None:
    r = await loop_with([call("noop"), "the answer"], journal, limits=Limits(max_steps=2)).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert r.final_answer == "the answer"


async def test_step_budget_is_decided_before_the_next_model_call(
    journal: RecordingJournal,
) -> None:
    model = ScriptedModel([call("noop"), call("noop"), "never asked"])
    r = await Loop(model, tools=make_tools(), journal=journal, limits=Limits(max_steps=2)).run("g")
    assert r.stop_reason == StopReason.step_budget
    assert len(model.requests) == 2 and model.remaining == 1


# --- §6 B: context size ---------------------------------------------------------------------


async def test_context_overflow_leaves_no_step_and_no_intent(journal: RecordingJournal) -> None:
    model = ScriptedModel([call("count", {"n": 400}), "never asked"])
    loop = Loop(model, tools=make_tools(), journal=journal, clock=FakeClock())
    first = await loop.run("g", limits=Limits(max_prompt_chars=10_000))
    ceiling = first.steps[0].prompt_chars + 50  # the first prompt fits, the second cannot
    model2 = ScriptedModel([call("count", {"n": 400}), "never asked"])
    j2 = RecordingJournal()
    r = await Loop(model2, tools=make_tools(), journal=j2, clock=FakeClock()).run(
        "g", limits=Limits(max_prompt_chars=ceiling)
    )
    assert r.stop_reason == StopReason.context_overflow
    assert r.steps_used == 1 and len(model2.requests) == 1
    records = j2.inner.records(r.run_id)
    assert sum(isinstance(x, ModelIntent) for x in records) == 1  # none for the stopped step
    assert j2.kinds()[-1] == ["end"]  # the stop wrote the end record alone
    # issue 29: the detail says the prompt's size and the limit (it was None)
    assert r.stop_detail is not None
    assert r.stop_detail.endswith(f" chars, over max_prompt_chars={ceiling}")


async def test_context_overflow_before_the_first_call_never_calls_the_model(
    journal: RecordingJournal,
) -> None:
    model = ScriptedModel(["never asked"])
    r = await Loop(model, journal=journal).run("g" * 100, limits=Limits(max_prompt_chars=50))
    assert r.stop_reason == StopReason.context_overflow
    assert r.steps == () and model.requests == []


# --- §6 C: the model call -------------------------------------------------------------------


async def test_model_failure_appends_a_step_with_llm_call_id_none(
    journal: RecordingJournal,
) -> None:
    r = await loop_with([ModelCallError("bad key", kind="auth")], journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    (step,) = r.steps
    assert step.llm_call_id is None and step.parse_ok is False and step.parse_error is None
    assert r.stop_detail == "ModelCallError: bad key [kind=auth, retryable=False, attempts=1]"


async def test_retryable_model_errors_are_retried_with_backoff_honouring_retry_after(
    journal: RecordingJournal,
) -> None:
    clock = FakeClock()
    script = [
        ModelCallError("slow down", retryable=True, retry_after=30.0, kind="rate_limit"),
        ModelCallError("503", retryable=True, kind="server"),
        "fine now",
    ]
    r = await loop_with(script, journal, clock=clock).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert len(clock.sleeps) == 2
    assert clock.sleeps[0] >= 30.0  # retry_after is a floor
    assert 0 < clock.sleeps[1] < 30.0
    intents = [x for x in journal.inner.records(r.run_id) if isinstance(x, ModelIntent)]
    assert [i.attempt for i in intents] == [1, 2, 3]
    assert len({i.intent_id for i in intents}) == 1  # one intent id for every attempt


async def test_retry_exhaustion_is_llm_error_with_kind_retryable_and_attempts(
    journal: RecordingJournal,
) -> None:
    script = [ModelCallError("busy", retryable=True, kind="rate_limit")] * 3
    r = await loop_with(script, journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail == "ModelCallError: busy [kind=rate_limit, retryable=True, attempts=3]"
    assert r.steps_used == 1


async def test_any_other_model_exception_is_a_non_retryable_llm_error(
    journal: RecordingJournal,
) -> None:
    r = await loop_with([RuntimeError("socket exploded"), "unused"], journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail == (
        "RuntimeError: socket exploded [kind=error, retryable=False, attempts=1]"
    )


async def test_a_providers_context_length_error_is_llm_error_not_context_overflow(
    journal: RecordingJournal,
) -> None:
    err = ModelCallError("maximum context length exceeded", kind="context_length")
    r = await loop_with([err], journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    assert "kind=context_length" in (r.stop_detail or "")


async def test_running_out_of_script_ends_llm_error_saying_so(journal: RecordingJournal) -> None:
    r = await loop_with([call("noop")], journal).run("g")
    assert r.stop_reason == StopReason.llm_error
    assert "ran out" in (r.stop_detail or "")


async def test_a_reply_without_call_id_gets_the_intent_id_and_with_one_keeps_it(
    journal: RecordingJournal,
) -> None:
    script = [
        ModelReply(tool_calls=call("noop").tool_calls, call_id="resp_1"),
        ModelReply(tool_calls=call("noop").tool_calls, call_id=""),
        "bye",
    ]
    r = await loop_with(script, journal).run("g")
    intents = [x for x in journal.inner.records(r.run_id) if isinstance(x, ModelIntent)]
    assert r.steps[0].llm_call_id == "resp_1"
    assert r.steps[1].llm_call_id == intents[1].intent_id
    assert r.steps[2].llm_call_id == intents[2].intent_id


# --- §6 D: invalid decisions ----------------------------------------------------------------


async def test_parse_failed_repeatedly_after_n_consecutive_invalid_decisions(
    journal: RecordingJournal,
) -> None:
    r = await loop_with(["", "", ""], journal, limits=Limits(max_consecutive_invalid=3)).run("g")
    assert r.stop_reason == StopReason.parse_failed_repeatedly
    assert r.steps_used == 3
    assert all(s.parse_ok is False and s.parse_error for s in r.steps)


async def test_a_valid_decision_resets_the_invalid_counter(journal: RecordingJournal) -> None:
    script = ["", "", call("nope"), "", "", "stop"]
    r = await loop_with(script, journal, limits=Limits(max_consecutive_invalid=3)).run("g")
    assert r.stop_reason == StopReason.agent_finished  # never three in a row
    assert r.steps_used == 6


async def test_invalid_decisions_skip_the_completion_check(journal: RecordingJournal) -> None:
    class AlwaysComplete:
        """An environment that reports completion for anything it is asked."""

        def __init__(self) -> None:
            self.executed = 0

        def tool_specs(self) -> list[dict[str, object]]:
            return []

        async def execute(self, action: object, ctx: object) -> Outcome:
            self.executed += 1
            return Outcome(ActionStatus.executed, "done", completed=True)

        def replay_policy(self, action: object) -> str:
            return "never"

        async def reconcile(self, action: object, ctx: object) -> None:
            return None

    env = AlwaysComplete()
    r = await Loop(ScriptedModel(["", "", ""]), environment=env, journal=journal).run("g")
    assert r.stop_reason == StopReason.parse_failed_repeatedly
    assert env.executed == 0


class _Reporting:
    """An environment whose every action returns ``outcome``."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def tool_specs(self) -> list[dict[str, object]]:
        return []

    async def execute(self, action: object, ctx: object) -> Outcome:
        return self.outcome

    def replay_policy(self, action: object) -> str:
        return "idempotent"

    async def reconcile(self, action: object, ctx: object) -> None:
        return None


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(ActionStatus.env_error, "sandbox gone", completed=True),
        Outcome(ActionStatus.env_error, "sandbox gone", marker=True),
        Outcome(ActionStatus.env_error, "sandbox gone", failure=Failure(error_type="Gone")),
    ],
    ids=["with-completed", "with-marker", "with-a-repeatable-failure"],
)
async def test_env_error_is_checked_before_completion_and_the_failure_guard(
    outcome: Outcome, journal: RecordingJournal
) -> None:
    """§6 G: an environment failure ends the run env_error even when the same outcome also
    says completed, is a completion marker, or carries a failure the guard would count."""
    loop = Loop(
        ScriptedModel([call("x")] * 3),
        environment=_Reporting(outcome),
        journal=journal,
        limits=Limits(same_failure_limit=1),
    )
    r = await loop.run("g")
    assert r.stop_reason == StopReason.env_error and r.steps_used == 1
    assert r.stop_detail == "sandbox gone" if outcome.failure is None else "Gone: None"


# --- §6 E: final answer ---------------------------------------------------------------------


async def test_a_final_answer_ends_agent_finished_with_the_answer(
    journal: RecordingJournal,
) -> None:
    r = await loop_with(["42, of course"], journal).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert r.final_answer == "42, of course"
    assert r.stop_detail is None


async def test_final_answer_is_none_unless_agent_finished(journal: RecordingJournal) -> None:
    r = await loop_with([call("done", {"answer": "x"})], journal).run("g")
    assert r.stop_reason == StopReason.task_completed and r.final_answer is None


# --- §6 F: actions ---------------------------------------------------------------------------


async def test_unknown_tool_costs_a_step_not_an_action_and_says_what_exists(
    journal: RecordingJournal,
) -> None:
    r = await loop_with([call("frobnicate"), "ok"], journal).run("g")
    step = r.steps[0]
    assert step.action_status == ActionStatus.not_executed
    assert step.observation_synthetic is True
    assert "frobnicate" in (step.observation or "") and "noop" in (step.observation or "")
    assert r.actions_executed == 0 and r.steps_used == 2


async def test_invalid_arguments_cost_a_step_not_an_action_and_say_what_is_wrong(
    journal: RecordingJournal,
) -> None:
    r = await loop_with([call("count", {"n": "three"}), "ok"], journal).run("g")
    step = r.steps[0]
    assert step.action_status == ActionStatus.not_executed
    assert "'n'" in (step.observation or "") and "three" in (step.observation or "")
    assert r.actions_executed == 0


async def test_unknown_tools_and_invalid_arguments_reset_the_invalid_counter(
    journal: RecordingJournal,
) -> None:
    script = ["", "", call("nope"), "", "", call("count", {"n": "x"}), "", "", "fin"]
    r = await loop_with(script, journal, limits=Limits(max_consecutive_invalid=3)).run("g")
    assert r.stop_reason == StopReason.agent_finished


async def test_not_executed_never_completes(journal: RecordingJournal) -> None:
    class RefusingButComplete:
        def tool_specs(self) -> list[dict[str, object]]:
            return []

        async def execute(self, action: object, ctx: object) -> Outcome:
            return Outcome(
                ActionStatus.not_executed, "refused", completed=True, marker=True, synthetic=True
            )

        def replay_policy(self, action: object) -> str:
            return "idempotent"

        async def reconcile(self, action: object, ctx: object) -> None:
            return None

    r = await Loop(
        ScriptedModel([call("x"), call("x"), "give up"]),
        environment=RefusingButComplete(),
        journal=journal,
    ).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert [s.action_status for s in r.steps[:2]] == [ActionStatus.not_executed] * 2


async def test_a_tools_ordinary_exception_is_executed_with_the_error_as_observation(
    journal: RecordingJournal,
) -> None:
    r = await loop_with([call("boom"), "ok"], journal).run("g")
    step = r.steps[0]
    assert step.action_status == ActionStatus.executed
    assert step.observation_synthetic is True
    assert "ValueError" in (step.observation or "") and "kaboom" in (step.observation or "")
    assert r.actions_executed == 1


async def test_a_marker_tool_that_returned_completes(journal: RecordingJournal) -> None:
    r = await loop_with([call("done", {"answer": "7"})], journal).run("g")
    assert r.stop_reason == StopReason.task_completed
    assert r.steps[0].tool_name == "done" and r.steps[0].completed is False


async def test_a_marker_tool_that_raised_does_not_complete(journal: RecordingJournal) -> None:
    r = await loop_with([call("bad_submit"), "giving up"], journal).run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert r.steps[0].action_status == ActionStatus.executed
    assert "submission rejected" in (r.steps[0].observation or "")


async def test_the_environments_completion_signal_completes(journal: RecordingJournal) -> None:
    r = await loop_with([call("finish_env")], journal).run("g")
    assert r.stop_reason == StopReason.task_completed
    assert r.steps[0].completed is True


async def test_environment_failure_is_env_error(journal: RecordingJournal) -> None:
    r = await loop_with([call("broken"), "unused"], journal).run("g")
    assert r.stop_reason == StopReason.env_error
    assert r.steps[0].action_status == ActionStatus.env_error
    assert r.stop_detail == "EnvironmentFailure: sandbox is gone"


async def test_the_step_that_ends_a_run_is_written_with_its_end_record(
    journal: RecordingJournal,
) -> None:
    loops = [
        ([ModelCallError("x")], "llm_error"),
        (["", "", ""], "parse_failed_repeatedly"),
        (["answer"], "agent_finished"),
        ([call("done", {"answer": "a"})], "task_completed"),
        ([call("broken")], "env_error"),
    ]
    for script, reason in loops:
        j = RecordingJournal()
        r = await loop_with(script, j).run("g")
        assert r.stop_reason == reason
        assert j.kinds()[-1][-2:] == ["step", "end"], reason
        assert j.end(r.run_id) is not None


async def test_the_model_intent_of_each_attempt_is_durable_before_the_model_is_called() -> None:
    journal = RecordingJournal()
    seen: list[tuple[int, int, ModelIntent]] = []

    def model(request: ModelRequest) -> ModelReply:
        written = [r for batch in journal.appends for r in batch if isinstance(r, ModelIntent)]
        seen.append((request.step_idx, request.attempt, written[-1]))
        if request.step_idx == 0 and request.attempt == 1:
            raise ModelCallError("busy", retryable=True, kind="rate_limit")
        return call("noop") if request.step_idx == 0 else ModelReply("done")

    loop = Loop(
        FunctionModel(model),
        tools=make_tools(),
        journal=journal,
        clock=FakeClock(),
        retry=RetryPolicy(initial_backoff_s=0.0, jitter=0.0),
    )
    r = await loop.run("g")
    assert r.stop_reason == StopReason.agent_finished
    assert [(s, a) for s, a, _ in seen] == [(0, 1), (0, 2), (1, 1)]
    for step_idx, attempt, intent in seen:  # the newest intent is this very call's
        assert (intent.step_idx, intent.attempt) == (step_idx, attempt)
    assert seen[0][2].intent_id == seen[1][2].intent_id != seen[2][2].intent_id


async def test_the_action_intent_is_durable_before_the_environment_is_called() -> None:
    seen: list[int] = []
    journal = RecordingJournal()
    tools = ToolRegistry()

    @tools.tool
    def probe() -> str:
        """Look at the journal from inside the tool."""
        seen.append(len(journal.appends))
        return "ok"

    r = await Loop(ScriptedModel([call("probe"), "x"]), tools=tools, journal=journal).run("g")
    kinds = journal.kinds()
    assert kinds[seen[0] - 1] == ["model_result", "action_intent"]
    assert kinds[seen[0]] == ["action_result", "step", "model_intent"]  # the next step's
    intent = next(x for x in journal.inner.records(r.run_id) if isinstance(x, ActionIntent))
    assert intent.action.tool_name == "probe"


async def test_a_retry_after_beyond_the_policys_ceiling_is_not_waited_for(
    journal: RecordingJournal,
) -> None:
    clock = FakeClock()
    script = [
        ModelCallError(
            "come back tomorrow", retryable=True, retry_after=86_400.0, kind="rate_limit"
        ),
        "unused",
    ]
    r = await loop_with(script, journal, clock=clock).run("g")
    assert r.stop_reason == StopReason.llm_error and clock.sleeps == []
    assert "attempts=1" in (r.stop_detail or "")


async def test_a_step_is_written_with_the_next_intent_unless_the_run_will_stop() -> None:
    # The run goes on: the step and the next model intent in one write. The run will stop (a
    # stop request, a detach, a spent budget): the step alone, and no intent without a call.
    class Journal(RecordingJournal):
        async def request_end(self, *args: Any, **kwargs: Any) -> Any:
            return await self.inner.request_end(*args, **kwargs)

    journal = Journal()
    tools = ToolRegistry()
    holder: dict[str, Any] = {}

    @tools.tool
    async def work(then: str) -> str:
        """Work, then ask for something."""
        if then == "stop":
            await holder["loop"].stop("s", reason="enough")
        elif then == "detach":
            assert holder["loop"].detach("d") is True
        return "ok"

    def loop(script: list[Any], limits: Limits | None = None) -> Loop:
        holder["loop"] = Loop(ScriptedModel(script), tools=tools, journal=journal, limits=limits)
        return holder["loop"]

    r = await loop([call("work", {"then": ""}), call("work", {"then": "stop"}), "x"]).run(
        "g", run_id="s"
    )
    assert r.stop_reason == StopReason.stopped and r.steps_used == 2
    assert journal.kinds()[2] == ["action_result", "step", "model_intent"]
    assert journal.kinds()[-3:] == [
        ["model_result", "action_intent"],
        ["action_result", "step"],
        ["end"],
    ]
    intents = [x for x in journal.inner.records("s") if isinstance(x, ModelIntent)]
    assert [i.step_idx for i in intents] == [0, 1]  # none for a step that never began

    before = len(journal.appends)
    with pytest.raises(RunDetached):
        await loop([call("work", {"then": "detach"}), "x"]).run("g", run_id="d")
    assert journal.kinds()[before:][-1] == ["action_result", "step"]
    intents = [x for x in journal.inner.records("d") if isinstance(x, ModelIntent)]
    assert [i.step_idx for i in intents] == [0]

    before = len(journal.appends)
    r = await loop([call("work", {"then": ""})] * 3, Limits(max_steps=2)).run("g", run_id="b")
    assert r.stop_reason == StopReason.step_budget
    assert journal.kinds()[before:][-2:] == [["action_result", "step"], ["end"]]
