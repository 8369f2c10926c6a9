"""Phase orchestration on top of the kernel: plan -> execute -> summarize, as three runs.

The kernel knows one run; phases are many runs. This example builds them from the public
API only: each phase is its own run with its own limits, the next phase continues from the
previous one's transcript (``history=``), and the caller checks each phase's stop reason.
It runs offline with scripted models; swap in a real model to use it for real.

    python examples/phases.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polyloop import Limits, Loop, ModelReply, RunResult, StopReason, ToolCall, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.testing import ScriptedModel


@dataclass
class PhaseReport:
    name: str
    result: RunResult


def make_tools(notes: dict[str, str]) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def write_note(key: str, text: str) -> str:
        """Store a note under a key (overwrites)."""
        notes[key] = text
        return f"stored {key!r}"

    @tools.tool(replay="idempotent")
    def read_note(key: str) -> str:
        """Read the note stored under a key."""
        return notes.get(key, f"no note {key!r}")

    @tools.tool(completion_marker=True)
    def submit(summary: str) -> str:
        """Submit the final summary; ends the phase."""
        notes["summary"] = summary
        return "submitted"

    return tools


def call(name: str, **args: object) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall(name, dict(args)),))


async def orchestrate(goal: str, models: dict[str, ScriptedModel]) -> list[PhaseReport]:
    """Run plan, execute and summarize; stop early if a phase does not end as expected."""
    notes: dict[str, str] = {}
    journal = MemoryJournal()  # one journal for all phases: one place to query them
    tools = make_tools(notes)
    reports: list[PhaseReport] = []
    history: Sequence[Mapping[str, Any]] = ()
    phases = [
        ("plan", Limits(max_steps=3), {StopReason.agent_finished}),
        ("execute", Limits(max_steps=10, max_actions=5), {StopReason.agent_finished}),
        ("summarize", Limits(max_steps=3), {StopReason.task_completed}),
    ]
    for name, limits, expected in phases:
        loop = Loop(models[name], tools=tools, journal=journal, limits=limits)
        result = await loop.run(
            f"[{name}] {goal}",
            history=history,
            metadata={"phase": name},
        )
        reports.append(PhaseReport(name, result))
        if result.stop_reason not in expected:
            break  # the caller decides what a failed phase means; the kernel only reports it
        # The next phase continues this phase's conversation, system message included: a
        # history that starts with one brings it, so each request has exactly one.
        history = result.messages
    return reports


def scripted() -> dict[str, ScriptedModel]:
    return {
        "plan": ScriptedModel(["1. record the facts  2. summarize them"]),
        "execute": ScriptedModel(
            [
                call("write_note", key="fact1", text="PolyLoop runs one bounded session."),
                call("write_note", key="fact2", text="Phases are runs on top."),
                "facts recorded",
            ]
        ),
        "summarize": ScriptedModel(
            [call("read_note", key="fact1"), call("submit", summary="One run per phase.")]
        ),
    }


def main() -> None:
    reports = asyncio.run(orchestrate("explain phases", scripted()))
    for r in reports:
        print(f"{r.name:10} {r.result.stop_reason:16} steps={r.result.steps_used}")


if __name__ == "__main__":
    main()
