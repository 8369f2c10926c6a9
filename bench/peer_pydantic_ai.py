"""pydantic-ai: an ``Agent`` on its own test double ``FunctionModel`` (the reply is a function of
the message history: a ``ToolCallPart`` for ``noop``, then a ``TextPart`` final answer) with one
``@agent.tool_plain`` async tool. ``request_limit`` lifted (default 50). Concurrent runs are
asyncio tasks; model latency is ``asyncio.sleep`` inside the function."""

from __future__ import annotations

import asyncio

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits

from ._measure import FINAL_ANSWER, GOAL, TOOL_NAME, TOOL_RESULT, Measured, Spec, is_final, timed


def _agent(steps: int, latency_s: float) -> Agent[None, str]:
    async def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if latency_s:
            await asyncio.sleep(latency_s)
        step_idx = sum(1 for m in messages if isinstance(m, ModelResponse))
        if is_final(step_idx, steps):
            return ModelResponse(parts=[TextPart(FINAL_ANSWER)])
        return ModelResponse(parts=[ToolCallPart(TOOL_NAME, {}, tool_call_id=f"c{step_idx}")])

    agent: Agent[None, str] = Agent(FunctionModel(reply))

    @agent.tool_plain(name=TOOL_NAME)
    async def noop() -> str:
        """Do nothing."""
        return TOOL_RESULT

    return agent


async def _one(agent: Agent[None, str], steps: int) -> None:
    result = await agent.run(GOAL, usage_limits=UsageLimits(request_limit=steps + 1))
    assert result.output == FINAL_ANSWER, result.output
    assert result.usage().requests == steps


async def _batches(agent: Agent[None, str], spec: Spec) -> None:
    for _ in range(spec.batches):
        await asyncio.gather(*(_one(agent, spec.steps) for _ in range(spec.runs)))


async def measure(spec: Spec) -> Measured:
    await _one(_agent(5, 0.0), 5)
    agent = _agent(spec.steps, spec.latency_ms / 1000)
    wall, cpu, _ = await timed(lambda: _batches(agent, spec))
    return Measured(wall, cpu)
