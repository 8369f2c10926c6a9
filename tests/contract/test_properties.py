"""Random scripts of replies through the real loop: the invariants of kernel.md §4–§7 hold."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from polyloop import (
    ActionStatus,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    RetryPolicy,
    RunResult,
    StopReason,
    ToolCall,
)
from polyloop.journal import MemoryJournal
from polyloop.testing import FakeClock, ScriptedModel
from polyloop.types import RunEnd
from tests.conftest import call, make_tools

ITEMS = {
    "final": lambda: "the answer",
    "noop": lambda: call("noop"),
    "count": lambda: call("count", {"n": 3}),
    "unknown_tool": lambda: call("does_not_exist"),
    "bad_args": lambda: call("count", {"n": "three"}),
    "malformed_json": lambda: ModelReply(tool_calls=(ToolCall("noop", '{"x": '),)),
    "two_calls": lambda: ModelReply(tool_calls=(ToolCall("noop", {}), ToolCall("noop", {}))),
    "empty": lambda: "",
    "retryable": lambda: ModelCallError("429", retryable=True, kind="rate_limit"),
    "fatal": lambda: ModelCallError("401", kind="auth"),
    "marker": lambda: call("done", {"answer": "x"}),
    "marker_raises": lambda: call("bad_submit"),
    "tool_raises": lambda: call("boom"),
    "env_broken": lambda: call("broken"),
    "env_complete": lambda: call("finish_env"),
    "big": lambda: call("big", {"n": 300}),
}

scripts = st.lists(st.sampled_from(sorted(ITEMS)), min_size=0, max_size=14)
limits = st.builds(
    Limits,
    max_steps=st.integers(1, 10),
    max_actions=st.none() | st.integers(1, 6),
    max_consecutive_invalid=st.integers(1, 4),
    max_prompt_chars=st.none() | st.integers(1500, 4000),
    max_observation_chars=st.none() | st.integers(1, 200),
)


def check_invariants(r: RunResult, lim: Limits, journal: MemoryJournal) -> None:
    steps = r.steps
    assert r.steps_used == len(steps)
    assert [s.step_idx for s in steps] == list(range(len(steps)))
    assert r.actions_executed == sum(s.action_status == ActionStatus.executed for s in steps)
    assert r.steps_used <= lim.max_steps
    if lim.max_actions is not None:
        assert r.actions_executed <= lim.max_actions
    ends = [x for x in journal.records(r.run_id) if isinstance(x, RunEnd)]
    assert len(ends) == 1 and ends[0].stop_reason == r.stop_reason
    for s in steps:
        assert (s.llm_call_id is None) == (not s.parse_ok and s.parse_error is None)
        assert s.llm_call_id != ""
        if s.observation is not None and lim.max_observation_chars is not None:
            assert s.observation_truncated_chars == max(
                0, len(s.observation) - lim.max_observation_chars
            )
    for s in steps[:-1]:  # only the last step may be one that ends a run
        assert s.llm_call_id is not None
        assert s.action_status != ActionStatus.env_error
        assert not (s.parse_ok and s.action is None)  # a final answer ends the run
    last = steps[-1] if steps else None
    reason = r.stop_reason
    if reason == StopReason.task_completed:
        assert last is not None and last.action_status == ActionStatus.executed
        assert last.completed or last.tool_name == "done"
    elif reason == StopReason.agent_finished:
        assert last is not None and last.parse_ok and last.action is None
        assert r.final_answer == "the answer"
    elif reason == StopReason.llm_error:
        assert last is not None and last.llm_call_id is None
    elif reason == StopReason.env_error:
        assert last is not None and last.action_status == ActionStatus.env_error
    elif reason == StopReason.parse_failed_repeatedly:
        tail = steps[-lim.max_consecutive_invalid :]
        assert len(tail) == lim.max_consecutive_invalid
        assert all(not s.parse_ok and s.parse_error for s in tail)
    elif reason == StopReason.step_budget:
        assert r.steps_used == lim.max_steps
    elif reason == StopReason.action_budget:
        assert r.actions_executed == lim.max_actions and r.steps_used < lim.max_steps
    elif reason == StopReason.context_overflow:
        assert lim.max_prompt_chars is not None
    else:
        raise AssertionError(f"unexpected stop reason {reason}")
    if reason != StopReason.agent_finished:
        assert r.final_answer is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts, lim=limits)
def test_any_script_keeps_the_invariants_and_the_journal_rebuilds_the_result(
    script: list[str], lim: Limits
) -> None:
    async def go() -> None:
        journal = MemoryJournal()
        loop = Loop(
            ScriptedModel([ITEMS[k]() for k in script]),
            tools=make_tools(),
            journal=journal,
            limits=lim,
            clock=FakeClock(),
            retry=RetryPolicy(max_attempts=2),
        )
        r = await loop.run("goal")
        check_invariants(r, lim, journal)
        event(f"stop={r.stop_reason}")
        again = await loop.resume(r.run_id)
        assert again == r  # resume of an ended run rebuilds exactly what run returned

    asyncio.run(go())
