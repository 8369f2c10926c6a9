"""PolyLoop as an Inspect AI agent: the real ``inspect eval`` (a subprocess) of
``inspect_task.py``, whose model is Inspect's own mock model scripted to call tools."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from inspect_ai.agent import AgentState
from inspect_ai.log import EvalLog, read_eval_log
from inspect_ai.model import ChatMessageUser

from polyloop import ConfigError, Limits
from polyloop.integrations.inspect import budgets, polyloop_agent, sample_run_id
from polyloop.integrations.inspect._model import _failure

HERE = Path(__file__).parent
INSPECT = str(Path(sys.executable).with_name("inspect"))
ANSWER = "The answer is 5."


class Eval:
    """One eval's files: its log directory (the journal beside the logs) and the task's
    record of its tool executions."""

    def __init__(self, tmp_path: Path) -> None:
        self.logs = tmp_path / "logs"
        self.calls = tmp_path / "calls"
        self.slow = tmp_path / "slow"
        self.env = {
            **os.environ,
            "INSPECT_TASK_CALLS": str(self.calls),
            "INSPECT_TASK_SLOW": str(self.slow),
        }
        self.env.pop("POLYLOOP_INSPECT_JOURNAL", None)

    def command(self, plan: str, *options: str) -> list[str]:
        return [
            INSPECT, "eval", "inspect_task.py", "-T", f"plan={plan}", "--model", "mockllm/model",
            "--log-dir", str(self.logs), "--display", "none", *options,
        ]  # fmt: skip

    def run(self, args: list[str]) -> None:
        done = subprocess.run(
            args, cwd=HERE, env=self.env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stdout + done.stderr

    def eval(self, plan: str, *options: str) -> EvalLog:
        self.run(self.command(plan, *options))
        return self.log()

    def log(self) -> EvalLog:
        (newest,) = sorted(self.logs.glob("*.eval"))[-1:]
        return read_eval_log(str(newest))

    def journal(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.logs / "polyloop.sqlite") as db:
            return db.execute(sql, args).fetchall()

    def executions(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


@pytest.fixture
def ev(tmp_path: Path) -> Eval:
    return Eval(tmp_path)


def test_inspect_eval_runs_the_sample_as_a_journaled_polyloop_run(ev: Eval) -> None:
    log = ev.eval("add+multiply")

    assert log.status == "success"
    (sample,) = log.samples or []
    assert sample.error is None
    assert sample.output.completion == ANSWER
    assert sample.scores is not None
    assert sample.scores["includes"].value == "C"
    run_id = sample_run_id(log.eval.task_id, 1, 1)
    summary = sample.metadata["polyloop"]
    assert summary["run_id"] == run_id
    assert summary["stop_reason"] == "agent_finished"
    assert summary["steps_used"] == 3
    assert summary["actions_executed"] == 2
    # the scripted usage: 10 tokens per message sent, 5 out; 2, 4 and 6 messages sent
    assert summary["tokens"] == (20 + 5) + (40 + 5) + (60 + 5)
    assert summary["journal"] == str((ev.logs / "polyloop.sqlite").resolve())
    assert sample.store["polyloop"] == summary
    # the sample's conversation is the run's: the tool results as the model saw them
    tool_results = [(m.function, m.text) for m in sample.messages if m.role == "tool"]
    assert tool_results == [("add", "5"), ("multiply", "20")]
    assert sample.messages[-1].text == ANSWER

    assert ev.journal("SELECT run_id, stop_reason, steps_used FROM runs") == [
        (run_id, "agent_finished", 3)
    ]
    assert ev.journal(
        "SELECT step_idx, tool_name, tool_args_json, observation FROM steps ORDER BY step_idx"
    ) == [
        (0, "add", '{"a":2,"b":3}', "5"),
        (1, "multiply", '{"a":4,"b":5}', "20"),
        (2, None, None, None),
    ]
    assert ev.journal("SELECT raw_response FROM steps WHERE step_idx = 2") == [(ANSWER,)]
    assert ev.journal("SELECT DISTINCT model FROM model_calls") == [("inspect:mockllm/model",)]
    assert ev.executions() == ["add 2 3", "multiply 4 5"]


def test_each_sample_and_epoch_is_its_own_run_in_one_shared_journal(ev: Eval) -> None:
    log = ev.eval("add", "-T", "samples=3", "--epochs", "2", "--max-samples", "6")

    samples = log.samples or []
    assert len(samples) == 6
    ids = {
        (s.id, s.epoch): s.metadata["polyloop"]["run_id"]
        for s in samples
        if s.output.completion == ANSWER
    }
    assert ids == {(i, e): sample_run_id(log.eval.task_id, i, e) for i in (1, 2, 3) for e in (1, 2)}
    assert sorted(ev.journal("SELECT run_id, stop_reason FROM runs")) == sorted(
        (run_id, "agent_finished") for run_id in ids.values()
    )
    assert ev.executions() == ["add 2 3"] * 6


@pytest.mark.parametrize(
    ("option", "stop_reason"),
    [
        # 2 messages to start (system, user) + 2 per step: 6 messages leave room for 2 steps
        (("--message-limit", "6"), "step_budget"),
        # steps of 25 and 45 tokens: the second reaches 50
        (("--token-limit", "50"), "token_budget"),
    ],
)
def test_a_sample_limit_ends_the_run_with_polyloops_stop_reason(
    ev: Eval, option: tuple[str, str], stop_reason: str
) -> None:
    log = ev.eval("add+add+add+add", *option)

    (sample,) = log.samples or []
    assert sample.error is None
    assert sample.limit is None  # PolyLoop's budget ended it, not Inspect's limit
    assert sample.metadata["polyloop"]["stop_reason"] == stop_reason
    assert sample.metadata["polyloop"]["steps_used"] == 2
    assert sample.output.completion == ""
    assert ev.journal("SELECT stop_reason, steps_used FROM runs") == [(stop_reason, 2)]
    assert ev.executions() == ["add 2 3", "add 2 3"]


def test_eval_retry_after_a_kill_resumes_the_samples_run(ev: Eval) -> None:
    """The eval is SIGKILLed while the second step's tool runs; ``inspect eval-retry`` of its
    log finds the same run and resumes it: the first step is kept (its tool not run again),
    the interrupted idempotent tool runs again, and the run ends in the retried eval."""
    child = subprocess.Popen(
        ev.command("add+slow"),
        cwd=HERE,
        env=ev.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not ev.slow.exists():  # slow() started: step 0 is journaled
            assert child.poll() is None, "the eval ended before its slow tool started"
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.2)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    (killed,) = ev.logs.glob("*.eval")
    [(run_id, status, steps)] = ev.journal("SELECT run_id, status, steps_used FROM runs")
    assert (status, steps) == ("running", 1)

    ev.run([INSPECT, "eval-retry", str(killed), "--log-dir", str(ev.logs), "--display", "none"])

    retried = ev.log()
    assert retried.location != str(killed)
    (sample,) = retried.samples or []
    assert sample.output.completion == ANSWER
    assert sample.metadata["polyloop"]["run_id"] == run_id
    assert run_id == sample_run_id(retried.eval.task_id, 1, 1)
    assert ev.journal("SELECT run_id, stop_reason, steps_used FROM runs") == [
        (run_id, "agent_finished", 3)
    ]
    assert ev.journal("SELECT step_idx, tool_name FROM steps ORDER BY step_idx") == [
        (0, "add"),
        (1, "slow"),
        (2, None),
    ]
    assert ev.executions() == ["add 2 3", "slow", "slow"]


async def test_outside_an_inspect_sample_the_agent_says_where_it_belongs() -> None:
    agent = polyloop_agent()
    with pytest.raises(ConfigError, match="runs inside an Inspect sample"):
        await agent(AgentState(messages=[ChatMessageUser(content="hi")]))


class _StatusError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_StatusError(429), "rate_limit"),
        (_StatusError(503), "server"),
        (_StatusError(401), "auth"),
        (TimeoutError("slow"), "timeout"),
        (ConnectionRefusedError("refused"), "connection"),
        (ValueError("odd"), "error"),
    ],
)
def test_a_generate_failure_is_a_model_call_error_inspect_already_retried(
    exc: Exception, kind: str
) -> None:
    error = _failure(exc, "Inspect model mockllm/model")
    assert error.kind == kind
    assert error.retryable is False
    assert "after Inspect's retries" in str(error)


def test_the_sample_limits_tighten_the_budgets_and_never_loosen_them() -> None:
    base = Limits(max_steps=30, max_tokens=1000, max_seconds=600.0, max_actions=7)
    tight = budgets(
        base,
        conversation=2,
        message_limit=9,
        turns_left=10,
        tokens_left=400,
        seconds_left=100.0,
    )
    assert (tight.max_steps, tight.max_tokens, tight.max_seconds) == (3, 400, 94.0)
    assert tight.max_actions == 7
    assert budgets(base, conversation=2, turns_left=2).max_steps == 2
    loose = budgets(base, conversation=2, message_limit=1000, tokens_left=10**6, seconds_left=10**5)
    assert (loose.max_steps, loose.max_tokens, loose.max_seconds) == (30, 1000, 600.0)
    assert budgets(Limits(), conversation=2).max_tokens is None
    spent = budgets(base, conversation=2, message_limit=2, tokens_left=-5, seconds_left=0.5)
    assert (spent.max_steps, spent.max_tokens, spent.max_seconds) == (1, 1, 0.001)
