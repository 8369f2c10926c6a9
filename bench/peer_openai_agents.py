"""openai-agents: an ``Agent`` whose ``model`` is a custom ``agents.Model`` (the interface every
provider implements: ``get_response`` returning output items) answering a
``ResponseFunctionToolCall`` for ``noop`` and finally an output message, with one async
``@function_tool``. Tracing disabled (``RunConfig(tracing_disabled=True)``; the default would
export traces over the network). ``max_turns`` lifted. Concurrent runs are asyncio tasks."""

from __future__ import annotations

import asyncio
from typing import Any

from agents import Agent, Model, ModelResponse, RunConfig, Runner, Usage, function_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from ._measure import FINAL_ANSWER, GOAL, TOOL_NAME, TOOL_RESULT, Measured, Spec, is_final, timed


@function_tool(name_override=TOOL_NAME)
async def noop() -> str:
    """Do nothing."""
    return TOOL_RESULT


class FakeModel(Model):
    def __init__(self, steps: int, latency_s: float) -> None:
        self.steps = steps
        self.latency_s = latency_s

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        items = input if isinstance(input, list) else []
        step_idx = sum(
            1
            for item in items
            if (item.get("type") if isinstance(item, dict) else None) == "function_call_output"
        )
        if is_final(step_idx, self.steps):
            out: Any = ResponseOutputMessage(
                id=f"m{step_idx}",
                content=[ResponseOutputText(text=FINAL_ANSWER, type="output_text", annotations=[])],
                role="assistant",
                status="completed",
                type="message",
            )
        else:
            out = ResponseFunctionToolCall(
                arguments="{}",
                call_id=f"c{step_idx}",
                name=TOOL_NAME,
                type="function_call",
                id=f"f{step_idx}",
                status="completed",
            )
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


_CONFIG = RunConfig(tracing_disabled=True)


async def _one(steps: int, latency_s: float) -> None:
    agent = Agent(
        name="bench",
        instructions="You are an agent.",
        model=FakeModel(steps, latency_s),
        tools=[noop],
    )
    result = await Runner.run(agent, GOAL, max_turns=steps + 1, run_config=_CONFIG)
    assert result.final_output == FINAL_ANSWER, result.final_output
    assert len(result.raw_responses) == steps


async def _batches(spec: Spec) -> None:
    latency = spec.latency_ms / 1000
    for _ in range(spec.batches):
        await asyncio.gather(*(_one(spec.steps, latency) for _ in range(spec.runs)))


async def measure(spec: Spec) -> Measured:
    await _one(5, 0.0)
    wall, cpu, _ = await timed(lambda: _batches(spec))
    return Measured(wall, cpu)
