"""``polyloop demo --real``: one short run with a real local model, offline.

The model is Gemma 3 270M (instruction-tuned, Q4_K_M) behind llama.cpp's OpenAI-compatible
server, found and started by :mod:`polyloop.testing.real_model` on 127.0.0.1 (install it with
``bash .ci/real_model.sh`` from a checkout). The run goes through ``OpenAIModel`` and the real
loop, tools and SQLite journal; the model chooses its tool calls itself (``tool_choice="auto"``),
so how the run ends is the model's doing: the demo shows what it did and what was recorded, and
promises nothing about its competence. Each call takes a few seconds on a CPU.
"""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

from polyloop import Limits, Loop, RunResult, ToolRegistry
from polyloop.journal import SQLiteJournal
from polyloop.models.openai import OpenAIModel
from polyloop.testing.real_model import MODEL_ALIAS, LlamaServer, RealModel

from .demo import _Printer, demo_journal

__all__ = ["REAL_GOAL", "real_tools", "run_real_demo"]

REAL_GOAL = "What is 19 plus 23? Use the add tool, then submit the sum with the submit tool."
REAL_LIMITS = Limits(max_steps=4)


def real_tools() -> ToolRegistry:
    """``add`` and the completion marker ``submit``."""
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


async def _run(base_url: str, journal_path: Path, say: Callable[[str], None]) -> RunResult:
    model = OpenAIModel(MODEL_ALIAS, base_url=base_url, api_key="x", temperature=0.0, max_tokens=64)
    printer = _Printer(say, waiting=True)  # the first call waits for the model to load
    try:
        async with SQLiteJournal(journal_path) as journal:
            loop = Loop(
                model,
                tools=real_tools(),
                journal=journal,
                limits=REAL_LIMITS,
                observers=(printer,),
            )
            return await loop.run(REAL_GOAL, run_id="demo-real")
    finally:
        printer.close()
        await model.aclose()


def run_real_demo(
    model: RealModel, run: Callable[..., RunResult], say: Callable[[str], None] = print
) -> RunResult:
    """Start the server, run :data:`REAL_GOAL` once, print its steps and what the journal's
    ``model_calls`` table holds, stop the server. ``run`` drives a coroutine to its result
    (``asyncio.run`` or the CLI's wrapper). Blocks; call it outside an event loop.

    Raises:
        RuntimeError: the server did not start (the message names its log).
    """
    journal_path = demo_journal("polyloop-demo-real.db")
    with tempfile.TemporaryDirectory(prefix="polyloop-demo-real-") as tmp:
        root = Path(tmp)
        say(f"A real model: {model.gguf.name} behind llama.cpp's server (llama-cpp-python)")
        with LlamaServer(model, log_path=root / "server.log") as server:
            say(f"  server pid {server.pid} at {server.base_url}; a call takes a few seconds")
            say(f"  goal: {REAL_GOAL}")
            say(f"  journal: {journal_path} (each demo --real replaces it)")
            result = run(lambda: _run(server.base_url, journal_path, say))
        say(f"  run {result.run_id}: {result.stop_reason}")
        if result.final_answer:
            say(f"  answer: {result.final_answer}")
        say(f"  look inside: polyloop show {result.run_id} --journal {journal_path}")
        conn = sqlite3.connect(journal_path)
        try:
            calls = conn.execute(
                "SELECT step_idx, attempt, state, llm_call_id, input_tokens, output_tokens "
                "FROM model_calls WHERE run_id = ? ORDER BY step_idx, attempt",
                (result.run_id,),
            ).fetchall()
        finally:
            conn.close()
        say("  model_calls (step, attempt, state, llm_call_id, tokens in/out):")
        for step, attempt, state, call_id, tokens_in, tokens_out in calls:
            say(f"    {step}  {attempt}  {state:<9} {call_id}  {tokens_in}/{tokens_out}")
        say("The model chose its calls: the stop reason is its doing, the records are PolyLoop's.")
        return result
