"""The tools and models the native-tool-call scenarios run with."""

from __future__ import annotations

from collections.abc import Sequence

from polyloop import ModelReply, ModelRequest, ToolRegistry
from polyloop.models.openai import OpenAIModel


def arithmetic() -> ToolRegistry:
    """``add`` (idempotent) and the completion marker ``submit``; integer arguments only, so
    a forced call's arguments are short and always valid."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tools.tool(completion_marker=True)
    def submit(answer: int) -> str:
        """Submit the final answer, an integer."""
        return f"submitted {answer}"

    return tools


class ByStep:
    """The Model seam over several ``OpenAIModel`` s on one server: step ``i`` is answered by
    ``models[i]`` (the last one for every later step). Each forces its tool with
    ``tool_choice``, so which tool a step calls is fixed, and the scenario asserts what
    PolyLoop does around the call, not the model's choice."""

    def __init__(self, models: Sequence[OpenAIModel]) -> None:
        self.models = tuple(models)

    async def complete(self, request: ModelRequest) -> ModelReply:
        model = self.models[min(request.step_idx, len(self.models) - 1)]
        return await model.complete(request)
