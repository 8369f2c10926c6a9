"""smolagents: a ``ToolCallingAgent`` with a custom ``Model`` subclass (the documented way to
plug in any model) and one ``@tool``. The model's reply is a native tool call to ``noop``, and
the run's last reply calls smolagents' own ``final_answer`` tool (its only way to finish).

smolagents is synchronous: concurrent runs use one thread each (``ThreadPoolExecutor``), and
model latency is ``time.sleep``. Logging is off (``verbosity_level=LogLevel.OFF``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from smolagents import LogLevel, Model, ToolCallingAgent, tool
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)

from ._measure import FINAL_ANSWER, GOAL, TOOL_NAME, TOOL_RESULT, Measured, Spec, timed


@tool
def noop() -> str:
    """Do nothing."""
    return TOOL_RESULT


noop.name = TOOL_NAME


class FakeModel(Model):
    def __init__(self, steps: int, latency_s: float) -> None:
        super().__init__(model_id="fake")
        self.steps = steps
        self.latency_s = latency_s
        self.calls = 0

    def generate(
        self,
        messages: list[Any],
        stop_sequences=None,
        response_format=None,
        tools_to_call_from=None,
        **kwargs: Any,
    ) -> ChatMessage:
        if self.latency_s:
            time.sleep(self.latency_s)
        self.calls += 1
        final = self.calls >= self.steps
        name, args = ("final_answer", {"answer": FINAL_ANSWER}) if final else (TOOL_NAME, {})
        call = ChatMessageToolCall(
            ChatMessageToolCallFunction(arguments=args, name=name),
            id=f"c{self.calls}",
            type="function",
        )
        return ChatMessage(role=MessageRole.ASSISTANT, content="", tool_calls=[call])


def _one(steps: int, latency_s: float) -> None:
    agent = ToolCallingAgent(
        tools=[noop],
        model=FakeModel(steps, latency_s),
        max_steps=steps + 1,
        verbosity_level=LogLevel.OFF,
    )
    out = agent.run(GOAL)
    assert out == FINAL_ANSWER, out
    assert agent.model.calls == steps


def _batches(spec: Spec) -> None:
    latency = spec.latency_ms / 1000
    for _ in range(spec.batches):
        if spec.runs == 1:
            _one(spec.steps, latency)
            continue
        with ThreadPoolExecutor(max_workers=spec.runs) as pool:
            list(pool.map(lambda _: _one(spec.steps, latency), range(spec.runs)))


async def measure(spec: Spec) -> Measured:
    _one(5, 0.0)

    async def go() -> None:
        _batches(spec)

    wall, cpu, _ = await timed(go)
    return Measured(wall, cpu)
