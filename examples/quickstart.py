"""A first PolyLoop run, offline: a scripted model uses two tools and submits an answer.

    python examples/quickstart.py

Swap ``ScriptedModel`` for ``polyloop.models.openai.OpenAIModel("gpt-4o-mini")`` to let a
real model decide; nothing else changes.
"""

from __future__ import annotations

from polyloop import Limits, Loop, ModelReply, RunResult, ToolCall, ToolRegistry
from polyloop.testing import ScriptedModel

tools = ToolRegistry()
inventory = {"apples": 3, "pears": 0}


@tools.tool(replay="idempotent")
def stock(item: str) -> int:
    """How many of an item are in stock.

    Args:
        item: the item's name, e.g. "apples".
    """
    return inventory.get(item, 0)


@tools.tool(completion_marker=True)
def submit(answer: str) -> str:
    """Submit the final answer; this ends the run."""
    return f"submitted: {answer}"


def tool_call(name: str, **arguments: object) -> ModelReply:
    return ModelReply(tool_calls=(ToolCall(name, arguments),))


def main() -> RunResult:
    model = ScriptedModel(
        [
            tool_call("stock", item="apples"),
            tool_call("stock", item="pears"),
            tool_call("submit", answer="3 apples, no pears"),
        ]
    )
    loop = Loop(model, tools=tools, limits=Limits(max_steps=10))
    result = loop.run_sync("What fruit do we have?")
    print(f"stop reason: {result.stop_reason}  steps: {result.steps_used}")
    for step in result.steps:
        print(f"  {step.step_idx}  {step.action:<45} -> {step.observation}")
    return result


if __name__ == "__main__":
    main()
