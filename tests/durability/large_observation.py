"""A run whose actions answer with large observations (longer than ``SHARED_ABOVE``): two reads,
each stored once (their step records refer to their action results), then a ``submit`` whose
large answer a completion guard checks, so its result is written before its step (the step
keeps its copy). Used by test_observation_once.py and, as the ``large`` scenario, by the
crash-injection harness."""

from __future__ import annotations

from typing import Any

from polyloop import Complete, GuardContext, Loop, ModelReply, RunEndGuard, ToolRegistry
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelRequest
from tests.conftest import call

SIZE = 5_000
"""Characters of each observation: above the 4,096 the journal stores once."""


def text(part: str, size: int = SIZE) -> str:
    """A deterministic observation of ``size`` characters (every line different)."""
    lines = [f"{part} line {i:06d} é\n" for i in range(size // 10 + 1)]
    return "".join(lines)[:size]


def tools(size: int = SIZE) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(replay="idempotent")
    def read(part: str) -> str:
        """Read a part of the corpus."""
        return text(part, size)

    @registry.tool(completion_marker=True, replay="idempotent")
    def submit(answer: str) -> str:
        """Submit the answer."""
        return text(f"submitted {answer}", size)

    return registry


def script(request: ModelRequest) -> ModelReply:
    match request.step_idx:
        case 0:
            return call("read", {"part": "a"})
        case 1:
            return call("read", {"part": "b"})
        case _:
            return call("submit", {"answer": "ok"})


def accept(ctx: GuardContext) -> Complete:
    return Complete()


def large_loop(journal: Any, size: int = SIZE) -> Loop:
    return Loop(
        FunctionModel(script),
        tools=tools(size),
        guards=[RunEndGuard(accept, on_task_completed=True)],
        journal=journal,
        clock=FakeClock(),
    )
