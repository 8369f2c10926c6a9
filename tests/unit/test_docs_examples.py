"""The examples behind docs/tools.md run and do what the docs say; the docs' code compiles."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import runpy
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from polyloop import Action, ActionStatus, StopReason, ToolContext
from polyloop.seams import Environment, Interpreter
from polyloop.types import FinalAnswer, InvalidDecision, ModelReply

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs" / "tools.md"
CTX = ToolContext("run", 0, "op-1")


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


write_a_tool = load("write_a_tool")
custom_environment = load("custom_environment")
custom_interpreter = load("custom_interpreter")


# --- examples/write_a_tool.py ------------------------------------------------------------------


def test_write_a_tool_ends_through_the_completion_marker(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = write_a_tool.main()
    assert result.stop_reason == StopReason.task_completed
    assert [s.tool_name for s in result.steps] == [
        "place_order",
        "check_stock",
        "place_order",
        "charge",
        "submit",
    ]
    assert [s.action_status for s in result.steps] == [
        ActionStatus.not_executed,  # the tool's own Outcome: refused, nothing happened
        *[ActionStatus.executed] * 4,
    ]
    assert result.steps[0].observation == "only 0 pears"
    assert "stop_reason=task_completed" in capsys.readouterr().out


async def test_write_a_tool_place_order_is_idempotent_by_op_id() -> None:
    shop = write_a_tool.Shop()
    tool = write_a_tool.build_tools(shop).get("place_order")
    assert tool is not None
    values = tool.parse_arguments({"item": "apple", "quantity": 2})
    await tool.call(values, CTX)
    await tool.call(values, CTX)  # replayed after a crash: same op_id
    assert shop.orders == {"op-1": ("apple", 2)}


async def test_write_a_tool_reconcile_hook_tells_whether_a_charge_happened() -> None:
    shop = write_a_tool.Shop()
    tool = write_a_tool.build_tools(shop).get("charge")
    assert tool is not None and tool.reconcile_hook is not None
    assert tool.reconcile_hook("op-1", {"amount": 2.0}) is None
    await tool.call({"amount": 2.0}, CTX)
    outcome = tool.reconcile_hook("op-1", {"amount": 2.0})
    assert outcome is not None and outcome.observation == "charged 2.00"


# --- examples/custom_environment.py ------------------------------------------------------------


def test_custom_environment_completes_when_the_check_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = custom_environment.main()
    assert result.stop_reason == StopReason.task_completed
    invalid, computed, saved = result.steps
    assert not invalid.parse_ok and "```python" in (invalid.parse_error or "")
    assert computed.action.startswith("a, b = 0, 1") and computed.tool_name is None
    assert (computed.observation, computed.completed) == ("6765\n", False)
    assert (saved.action_status, saved.completed) == (ActionStatus.executed, True)
    assert "stop_reason=task_completed" in capsys.readouterr().out


def test_custom_environment_implements_the_seam(tmp_path: Path) -> None:
    assert isinstance(custom_environment.PythonEnvironment(tmp_path, "pass"), Environment)


async def test_custom_environment_reports_errors_and_exit_status(tmp_path: Path) -> None:
    env = custom_environment.PythonEnvironment(tmp_path, "raise SystemExit(1)")
    outcome = await env.execute(Action("raise ValueError('boom')"), CTX)
    assert outcome.status is ActionStatus.executed and not outcome.completed
    assert "ValueError: boom" in outcome.observation
    assert outcome.observation.endswith("[exit status 1]")


async def test_custom_environment_times_out_without_blocking_the_event_loop(
    tmp_path: Path,
) -> None:
    env = custom_environment.PythonEnvironment(tmp_path, "pass", timeout_s=0.5)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    outcome = await env.execute(Action("while True: pass"), CTX)
    ticker.cancel()
    assert outcome.status is ActionStatus.executed and not outcome.completed
    assert "timed out after 0.5s" in outcome.observation
    assert outcome.failure is not None and outcome.failure.error_type == "TimeoutError"
    assert ticks > 10  # the event loop kept running while the code did


async def test_custom_environment_kills_the_process_when_cancelled(tmp_path: Path) -> None:
    env = custom_environment.PythonEnvironment(tmp_path, "pass", timeout_s=30)
    code = "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(30)"
    task = asyncio.create_task(env.execute(Action(code), CTX))
    pid_file = tmp_path / "pid"
    for _ in range(1000):  # wait (at most 10 s) until the code runs
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.01)
    pid = int(pid_file.read_text())
    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - started < 5
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(pid, 0)


async def test_custom_environment_refuses_tool_actions(tmp_path: Path) -> None:
    env = custom_environment.PythonEnvironment(tmp_path, "pass")
    outcome = await env.execute(Action("t({})", tool_name="t", arguments={}), CTX)
    assert outcome.status is ActionStatus.not_executed


# --- examples/custom_interpreter.py ------------------------------------------------------------


def test_custom_interpreter_reads_react_replies(capsys: pytest.CaptureFixture[str]) -> None:
    result = custom_interpreter.main()
    assert result.stop_reason == StopReason.agent_finished
    assert result.final_answer == "330 metres."
    assert result.steps[0].action == "lookup[Eiffel Tower]"
    assert result.steps[0].tool_args_json == '{"topic":"Eiffel Tower"}'
    assert result.steps[0].observation == "The Eiffel Tower is 330 metres tall."
    assert "stop_reason=agent_finished" in capsys.readouterr().out


def test_custom_interpreter_implements_the_seam() -> None:
    interpreter = custom_interpreter.ReActInterpreter()
    assert isinstance(interpreter, Interpreter)
    decision = interpreter.interpret(ModelReply(text="Hmm."), ())
    assert isinstance(decision, InvalidDecision) and "Action:" in decision.feedback
    decision = interpreter.interpret(ModelReply(text="Final Answer: a\nb"), ())
    assert decision == FinalAnswer("a\nb")


# --- the docs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["write_a_tool", "custom_environment", "custom_interpreter"])
def test_each_example_runs_as_a_script(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    assert "stop_reason=" in capsys.readouterr().out


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, re.MULTILINE | re.DOTALL)


def test_every_python_block_in_the_docs_compiles() -> None:
    blocks = python_blocks(DOCS.read_text(encoding="utf-8"))
    assert len(blocks) >= 8
    for n, block in enumerate(blocks):
        compile(block, f"{DOCS.name}[python block {n}]", "exec")


def test_the_docs_link_only_to_examples_that_exist() -> None:
    linked = re.findall(r"\(\.\./(examples/[\w.]+)\)", DOCS.read_text(encoding="utf-8"))
    assert set(linked) == {
        "examples/write_a_tool.py",
        "examples/custom_environment.py",
        "examples/custom_interpreter.py",
    }
    assert all((ROOT / path).is_file() for path in linked)
