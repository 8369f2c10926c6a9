"""LangGraph: the prebuilt ``create_react_agent`` (graph: model node → tools node → model …)
with a fake chat model (a ``BaseChatModel`` subclass answering from the number of AI messages so
far, the way ``langchain_core``'s fake chat models work, with ``bind_tools`` returning itself) and
one async ``@tool``. Runs with ``ainvoke``; concurrent runs are asyncio tasks.

``langgraph_sqlite`` adds the ``AsyncSqliteSaver`` checkpointer (WAL, SQLite's default
``synchronous``), one ``thread_id`` per run: LangGraph's way to make a run durable."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from ._measure import (
    FINAL_ANSWER,
    GOAL,
    TOOL_NAME,
    TOOL_RESULT,
    Measured,
    Spec,
    is_final,
    sqlite_bytes,
    stored_bytes,
    timed,
)


@tool(TOOL_NAME)
async def noop() -> str:
    """Do nothing."""
    return TOOL_RESULT


class FakeChatModel(BaseChatModel):
    steps: int
    latency_s: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> FakeChatModel:
        return self

    def _reply(self, messages: list[BaseMessage]) -> ChatResult:
        step_idx = sum(1 for m in messages if isinstance(m, AIMessage))
        if is_final(step_idx, self.steps):
            msg = AIMessage(content=FINAL_ANSWER)
        else:
            msg = AIMessage(
                content="", tool_calls=[{"name": TOOL_NAME, "args": {}, "id": f"c{step_idx}"}]
            )
        return ChatResult(generations=[ChatGeneration(message=msg)])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return self._reply(messages)

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return self._reply(messages)


async def _one(graph: Any, steps: int) -> None:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": 2 * steps + 10}
    out = await graph.ainvoke({"messages": [("user", GOAL)]}, config)
    last = out["messages"][-1]
    assert last.content == FINAL_ANSWER, last
    assert sum(1 for m in out["messages"] if isinstance(m, AIMessage)) == steps


async def _batches(graph: Any, spec: Spec) -> None:
    for _ in range(spec.batches):
        await asyncio.gather(*(_one(graph, spec.steps) for _ in range(spec.runs)))


async def measure(spec: Spec) -> Measured:
    model = FakeChatModel(steps=spec.steps, latency_s=spec.latency_ms / 1000)
    warm_model = FakeChatModel(steps=5)
    if spec.system != "langgraph_sqlite":
        await _one(create_react_agent(warm_model, [noop]), 5)
        graph = create_react_agent(model, [noop])
        wall, cpu, _ = await timed(lambda: _batches(graph, spec))
        return Measured(wall, cpu)
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    async with AsyncSqliteSaver.from_conn_string(os.path.join(spec.workdir, "warm.db")) as saver:
        await _one(create_react_agent(warm_model, [noop], checkpointer=saver), 5)
    path = os.path.join(spec.workdir, "checkpoints.db")
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
        graph = create_react_agent(model, [noop], checkpointer=saver)
        before = sqlite_bytes(path)
        wall, cpu, _ = await timed(lambda: _batches(graph, spec))
        grown = sqlite_bytes(path) - before
    return Measured(
        wall, cpu, {"journal_bytes": grown, "stored_bytes": stored_bytes(path) - before}
    )
