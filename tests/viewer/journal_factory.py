"""A SQLite journal holding a run of every stop reason, made by real runs of ``polyloop.Loop``.

Content that must never leave the owner's hands in a shared artefact carries marker strings
(``MARKERS``) so that redaction tests can assert their absence.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from polyloop import (
    EnvironmentFailure,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    ToolCall,
    ToolRegistry,
)
from polyloop.journal import SQLiteJournal
from polyloop.testing import ScriptedModel
from tests.conftest import Crash, RecordingJournal

MARKERS = {
    "goal": "GOAL-MARKER-7d1e",
    "text": "TEXT-MARKER-52ab",
    "reasoning": "REASON-MARKER-c04f",
    "argument": "ARG-MARKER-913c",
    "observation": "OBS-MARKER-e6d2",
    "answer": "ANSWER-MARKER-0b7a",
    "secret": "sk-proj-SECRETMARKER1234567890abcdef",
    "email": "marker.person@example.org",
}
"""Unique strings planted in the content of ``run-task_completed``."""

ALL_REASONS = (
    "task_completed",
    "agent_finished",
    "step_budget",
    "action_budget",
    "parse_failed_repeatedly",
    "context_overflow",
    "env_error",
    "llm_error",
    "cancelled",
    "resume_state_unknown",
    "repeated_failure",
)


def call(name: str, args: dict[str, Any] | None = None, **reply: Any) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall(name, args or {}),), **reply)


def tools() -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    def lookup(query: str) -> str:
        """Look something up."""
        return f"result for {query}: {MARKERS['observation']} (contact {MARKERS['email']})"

    @reg.tool
    def noop() -> str:
        """Do nothing."""
        return "ok"

    @reg.tool
    def big(n: int) -> str:
        """Return n characters."""
        return "".join(chr(ord("a") + i % 26) for i in range(n))

    @reg.tool
    def broken() -> str:
        """The environment is gone."""
        raise EnvironmentFailure("sandbox is gone")

    @reg.tool
    def flaky() -> str:
        """Always fails the same way."""
        raise ValueError("the same failure again")

    @reg.tool
    def charge(amount: int) -> str:
        """Charge a card (never replayed)."""
        return f"charged {amount}"

    @reg.tool
    async def wait_forever() -> str:
        """Blocks."""
        await asyncio.sleep(3600)
        return "never"

    @reg.tool(completion_marker=True)
    def submit(answer: str) -> str:
        """Submit the answer."""
        return "accepted"

    return reg


async def _run(journal: Any, run_id: str, replies: list[Any], **kw: Any) -> None:
    limits = kw.pop("limits", Limits(max_steps=10))
    metadata = kw.pop("metadata", {"suite": "viewer", "reason": run_id.removeprefix("run-")})
    goal = kw.pop("goal", f"goal of {run_id}")
    loop = Loop(ScriptedModel(replies), tools=tools(), journal=journal, limits=limits, **kw)
    await loop.run(goal, run_id=run_id, metadata=metadata)


async def build_journal(path: Path) -> dict[str, str]:
    """Fill a new journal at ``path``; returns stop reason -> run id."""
    journal = SQLiteJournal(path, durability="normal")  # test data: no fsync per write
    try:
        await _fill(journal)
    finally:
        await journal.aclose()
    return {reason: f"run-{reason}" for reason in ALL_REASONS}


async def _fill(journal: SQLiteJournal) -> None:
    m = MARKERS
    await _run(
        journal,
        "run-task_completed",
        [
            call(
                "lookup",
                {"query": m["argument"]},
                text=f"Let me look. {m['text']}",
                reasoning=f"thinking {m['reasoning']} with key {m['secret']}",
            ),
            call("big", {"n": 300}),
            ModelReply(""),  # an invalid decision: a parse error, then carry on
            call("submit", {"answer": m["answer"]}),
        ],
        goal=f"Find the thing {m['goal']}",
        limits=Limits(max_steps=10, max_observation_chars=120),
        metadata={"suite": "viewer", "model": "scripted-1", "team": {"name": "blue"}},
    )
    await _run(journal, "run-agent_finished", [call("noop"), ModelReply("the answer is 42")])
    await _run(journal, "run-step_budget", [call("noop")] * 3, limits=Limits(max_steps=3))
    await _run(
        journal,
        "run-action_budget",
        [call("noop")] * 3,
        limits=Limits(max_steps=10, max_actions=2),
    )
    await _run(
        journal,
        "run-parse_failed_repeatedly",
        [ModelReply(""), ModelReply("")],
        limits=Limits(max_steps=10, max_consecutive_invalid=2),
    )
    await _run(journal, "run-context_overflow", [], limits=Limits(max_steps=5, max_prompt_chars=10))
    await _run(journal, "run-env_error", [call("noop"), call("broken")])
    await _run(
        journal,
        "run-llm_error",
        [call("noop"), ModelCallError("the provider said no", retryable=False, kind="auth")],
    )
    await _run(
        journal,
        "run-repeated_failure",
        [call("flaky")] * 5,
        limits=Limits(max_steps=10, same_failure_limit=2),
    )
    # cancelled: the task running the run is cancelled while its action blocks.
    loop = Loop(
        ScriptedModel([call("noop"), call("wait_forever")]),
        tools=tools(),
        journal=journal,
        cancel_grace_s=0.01,
    )
    task = asyncio.ensure_future(
        loop.run("goal of run-cancelled", run_id="run-cancelled", metadata={"suite": "viewer"})
    )
    for _ in range(500):
        await asyncio.sleep(0.01)
        rows = await journal.list_runs(run_id="run-cancelled")
        if rows and rows[0]["steps_used"] >= 1:
            await asyncio.sleep(0.05)
            break
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    # resume_state_unknown: the process "dies" right after the intent of a never-replay
    # action is durable (write 2: the model result with the action intent); resuming cannot
    # know whether the card was charged.
    crashing = RecordingJournal(journal, crash_at=2, crash_after=True)  # type: ignore[arg-type]
    with contextlib.suppress(Crash):
        await _run(crashing, "run-resume_state_unknown", [call("charge", {"amount": 5})])
    await Loop(ScriptedModel([]), tools=tools(), journal=journal).resume("run-resume_state_unknown")

    # paused: detached after its first step, never resumed (status running, no lease).
    def detach_after_first(event: Any) -> None:
        if type(event).__name__ == "StepAppended":
            paused.detach("run-paused")

    paused = Loop(
        ScriptedModel([call("noop"), call("noop")]),
        tools=tools(),
        journal=journal,
        observers=[detach_after_first],
    )
    with contextlib.suppress(Exception):
        await paused.run("goal of run-paused", run_id="run-paused", metadata={"suite": "other"})


async def long_run(journal: Any, run_id: str, steps: int, observation_chars: int = 400) -> None:
    """One run of ``steps`` steps whose observations are ``observation_chars`` long."""
    replies: list[Any] = [call("big", {"n": observation_chars})] * (steps - 1)
    replies.append(ModelReply("done"))
    await _run(
        journal,
        run_id,
        replies,
        limits=Limits(max_steps=steps + 1, max_observation_chars=max(observation_chars // 2, 1)),
        goal=f"a long run of {steps} steps",
    )
