"""A custom interpreter: ReAct-style replies (``Action: tool[input]`` / ``Final Answer: ...``)
over ordinary registry tools. Runs offline with a scripted model; swap in a real model to use
it for real.

    python examples/custom_interpreter.py
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from polyloop import (
    Action,
    FinalAnswer,
    InvalidDecision,
    Limits,
    Loop,
    ModelReply,
    RunResult,
    ToolRegistry,
)
from polyloop.context import ChatContextBuilder
from polyloop.testing import ScriptedModel
from polyloop.types import Decision, ToolSpec

FORMAT = (
    "To use a tool, write a line 'Action: tool_name[input]'. When you are done, write a line "
    "'Final Answer: ' followed by your answer."
)
_ACTION = re.compile(r"^Action:\s*([\w-]+)\[(.*)\]\s*$", re.MULTILINE)
_FINAL = re.compile(r"^Final Answer:\s*(.+)", re.MULTILINE | re.DOTALL)


class ReActInterpreter:
    """Reads ReAct-style replies (the Interpreter seam). Pure: no I/O, and the same reply
    always gives the same decision (resume re-interprets journaled replies).

    * The first line ``Action: name[input]`` -> an action calling ``name`` with ``input`` as
      its first parameter (from the tool specs).
    * Else a line ``Final Answer: text`` -> the final answer (to the end of the reply).
    * Else an invalid decision that tells the model the format.
    """

    def interpret(self, reply: ModelReply, tool_specs: Sequence[ToolSpec]) -> Decision:
        if action := _ACTION.search(reply.text):
            name, value = action[1], action[2].strip()
            parameter = _first_parameter(name, tool_specs)
            arguments = {parameter: value} if parameter else {}
            return Action(text=f"{name}[{value}]", tool_name=name, arguments=arguments)
        if final := _FINAL.search(reply.text):
            return FinalAnswer(final[1].strip())
        return InvalidDecision(f"I found no action and no final answer. {FORMAT}")


def _first_parameter(tool: str, specs: Sequence[ToolSpec]) -> str | None:
    for spec in specs:
        function = spec.get("function", {})
        if function.get("name") == tool:
            return next(iter(function.get("parameters", {}).get("properties", {})), None)
    return None  # an unknown tool: the environment answers that it does not exist


def build_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def lookup(topic: str) -> str:
        """Look a topic up in the encyclopedia."""
        facts = {"eiffel tower": "The Eiffel Tower is 330 metres tall."}
        return facts.get(topic.lower(), f"Nothing found about {topic!r}.")

    return tools


SCRIPT = [
    "Thought: I should look this up.\nAction: lookup[Eiffel Tower]",
    "Thought: the height is in the observation.\nFinal Answer: 330 metres.",
]


async def ask(model: ScriptedModel) -> RunResult:
    loop = Loop(
        model,
        tools=build_tools(),
        interpreter=ReActInterpreter(),
        context=ChatContextBuilder(system_prompt=f"Answer questions with tools. {FORMAT}"),
        limits=Limits(max_steps=5),
    )
    return await loop.run("How tall is the Eiffel Tower?")


def main() -> RunResult:
    result = asyncio.run(ask(ScriptedModel(SCRIPT)))
    for step in result.steps:
        if step.action is not None:
            print(f"step {step.step_idx}: {step.action} -> {step.observation!r}")
    print(f"stop_reason={result.stop_reason} final_answer={result.final_answer!r}")
    return result


if __name__ == "__main__":
    main()
