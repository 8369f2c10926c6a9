"""An Inspect task whose solver is PolyLoop's agent, for the tests of
polyloop.integrations.inspect (run by the real ``inspect eval`` in a subprocess).

With ``-T plan=add+slow`` the model is Inspect's own mock model scripted to call ``add(2, 3)``,
then ``slow()``, then to answer "The answer is 5." (without it, the eval's ``--model``). Each
reply depends only on how many tool results the
conversation holds, so a resumed run gets the same replies. Files named by environment
variables record what the tools did:

* ``INSPECT_TASK_CALLS``: one line per tool execution (``add 2 3``, ``slow``, ``multiply 4 5``;
  ``multiply`` is an Inspect tool);
* ``INSPECT_TASK_SLOW``: ``slow()`` creates it and then blocks (for the kill test) unless it
  exists already, when it returns at once.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import (
    ChatMessage,
    ChatMessageTool,
    GenerateConfig,
    Model,
    ModelOutput,
    ModelUsage,
    get_model,
)
from inspect_ai.scorer import includes
from inspect_ai.tool import Tool, ToolChoice, ToolInfo, tool

from polyloop import ToolRegistry
from polyloop.integrations.inspect import add_inspect_tools, polyloop_agent

ANSWER = "The answer is 5."
_ARGUMENTS: dict[str, dict[str, Any]] = {
    "add": {"a": 2, "b": 3},
    "slow": {},
    "multiply": {"a": 4, "b": 5},
}


def _record(line: str) -> None:
    with open(os.environ["INSPECT_TASK_CALLS"], "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _first_time() -> bool:
    """Whether ``slow()`` has not run before (its marker file is made now)."""
    marker = Path(os.environ["INSPECT_TASK_SLOW"])
    if marker.exists():
        return False
    marker.touch()
    return True


def _tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        _record(f"add {a} {b}")
        return a + b

    @tools.tool(replay="idempotent")
    async def slow() -> str:
        """Take a long time, the first time."""
        _record("slow")
        if _first_time():
            await asyncio.sleep(3600)
        return "done"

    return add_inspect_tools(tools, [multiply()])


@tool
def multiply() -> Tool:
    """An Inspect tool, wrapped as a PolyLoop tool."""

    async def execute(a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: the first factor.
            b: the second factor.
        """
        _record(f"multiply {a} {b}")
        return str(a * b)

    return execute


def scripted(plan: str) -> Model:
    """Inspect's mock model (``mockllm/model``) scripted to make the tool calls of ``plan``
    (names joined by ``+``), in order, one per reply, then to answer."""
    calls = [name for name in plan.split("+") if name]

    def reply(
        input: list[ChatMessage], tools: list[ToolInfo], choice: ToolChoice, config: GenerateConfig
    ) -> ModelOutput:
        done = sum(isinstance(m, ChatMessageTool) for m in input)
        if done < len(calls):
            name = calls[done]
            output = ModelOutput.for_tool_call(
                "mockllm/model", name, _ARGUMENTS[name], tool_call_id=f"call-{done}"
            )
        else:
            output = ModelOutput.from_content("mockllm/model", ANSWER)
        # Reported usage (else the mock counts tokens with tiktoken, which downloads its
        # encoding): 10 tokens in per message, 5 out.
        output.usage = ModelUsage(
            input_tokens=10 * len(input), output_tokens=5, total_tokens=10 * len(input) + 5
        )
        return output

    return get_model("mockllm/model", custom_outputs=reply)


@task
def arithmetic(plan: str | None = None, samples: int = 1) -> Task:
    """``plan``: the mock model's script (see :func:`scripted`); None: the eval's model
    (``--model``)."""
    return Task(
        model=None if plan is None else scripted(plan),
        dataset=[Sample(input="What is 2 + 3?", target="5", id=i + 1) for i in range(samples)],
        solver=polyloop_agent(_tools()),
        scorer=includes(),
    )
