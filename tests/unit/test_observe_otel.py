"""OTelObserver: spans per run, model call and action (GenAI conventions), parent links, and
what is (not) exported, against the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from polyloop import (
    EnvironmentFailure,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    ModelRequest,
    RunDetached,
    ToolCall,
    ToolRegistry,
    Usage,
)
from polyloop.events import StepAppended
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

from polyloop.observe import Scrubber
from polyloop.observe.otel import OTelObserver

GOAL = "Find GOAL-MARKER-41aa for me"
ARG = "ARG-MARKER-77bc"
OBS = "OBS-MARKER-9d0e"
TEXT = "TEXT-MARKER-c3f1"
REASONING = "REASON-MARKER-2e8a"
ANSWER = "ANSWER-MARKER-6a5b"
SECRET = "sk-proj-abcdefghijklmnop1234567890"
EMAIL = "jane.doe@example.com"
MARKERS = (GOAL, ARG, OBS, TEXT, REASONING, ANSWER, SECRET, EMAIL, "GOAL-MARKER-41aa")


def setup(**kw: Any) -> tuple[OTelObserver, InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OTelObserver(provider, **kw), exporter, provider


def tools() -> ToolRegistry:
    reg = ToolRegistry()

    @reg.tool
    def lookup(query: str) -> str:
        """Look up."""
        return f"{OBS} for {query}; mail {EMAIL}; key {SECRET}"

    @reg.tool
    def broken() -> str:
        """Gone."""
        raise EnvironmentFailure("sandbox is gone")

    @reg.tool
    async def forever() -> str:
        """Blocks."""
        await asyncio.sleep(3600)
        return "never"

    @reg.tool(completion_marker=True)
    def submit(answer: str) -> str:
        """Submit."""
        return "accepted"

    return reg


def script() -> list[ModelReply]:
    return [
        ModelReply(
            text=f"{TEXT} with {SECRET}",
            reasoning=REASONING,
            tool_calls=(ToolCall("lookup", {"query": ARG}),),
            call_id="resp-1",
            usage=Usage(input_tokens=100, output_tokens=20),
        ),
        ModelReply(
            tool_calls=(ToolCall("submit", {"answer": ANSWER}),),
            call_id="resp-2",
            usage=Usage(input_tokens=150, output_tokens=10),
        ),
    ]


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def exported_text(spans: Sequence[ReadableSpan]) -> str:
    return "\n".join(s.to_json() for s in spans)


async def completed_run(obs: OTelObserver, **loop_kw: Any) -> None:
    obs.set_run_metadata("r1", {"model": "gpt-test", "provider": "openai"})
    loop = Loop(obs.instrument(ScriptedModel(script())), tools=tools(), observers=[obs], **loop_kw)
    await loop.run(GOAL, run_id="r1")


async def test_one_span_per_run_model_call_and_action_with_parent_links() -> None:
    obs, exporter, _ = setup()
    await completed_run(obs)
    spans = exporter.get_finished_spans()
    names = by_name(spans)
    assert sorted(names) == [
        "chat gpt-test",
        "execute_tool lookup",
        "execute_tool submit",
        "invoke_agent",
    ]
    assert len(names["chat gpt-test"]) == 2
    run = names["invoke_agent"][0]
    assert run.parent is None
    for s in spans:
        assert s.context.trace_id == run.context.trace_id
        if s is not run:
            assert s.parent is not None and s.parent.span_id == run.context.span_id
    assert all(s.end_time is not None for s in spans)
    assert obs.open_runs == ()


async def test_genai_attributes() -> None:
    obs, exporter, _ = setup()
    await completed_run(obs)
    names = by_name(exporter.get_finished_spans())
    run = names["invoke_agent"][0].attributes or {}
    assert run["gen_ai.operation.name"] == "invoke_agent"
    assert run["polyloop.stop_reason"] == "task_completed"
    assert run["polyloop.steps_used"] == 2 and run["polyloop.actions_executed"] == 2
    assert run["gen_ai.request.model"] == "gpt-test" and run["gen_ai.provider.name"] == "openai"
    assert run["gen_ai.usage.input_tokens"] == 250 and run["gen_ai.usage.output_tokens"] == 30
    first, second = sorted(names["chat gpt-test"], key=lambda s: s.start_time or 0)
    a = first.attributes or {}
    assert a["gen_ai.operation.name"] == "chat"
    assert a["gen_ai.request.model"] == "gpt-test"
    assert a["gen_ai.response.id"] == "resp-1"
    assert a["gen_ai.usage.input_tokens"] == 100 and a["gen_ai.usage.output_tokens"] == 20
    assert a["polyloop.step_idx"] == 0 and a["polyloop.attempt"] == 1
    assert a["polyloop.reasoning_chars"] == len(REASONING) and a["polyloop.parse_ok"] is True
    assert (second.attributes or {})["gen_ai.response.id"] == "resp-2"
    tool = names["execute_tool lookup"][0].attributes or {}
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert tool["gen_ai.tool.name"] == "lookup"
    assert tool["gen_ai.tool.call.id"] == tool["polyloop.op_id"]
    assert tool["polyloop.action_status"] == "executed"
    assert str(tool["polyloop.tool.arguments.sha256"]).startswith("sha256:")
    assert tool["polyloop.observation.chars"] > 0


async def test_no_content_leaves_by_default() -> None:
    obs, exporter, _ = setup()
    await completed_run(obs)
    text = exported_text(exporter.get_finished_spans())
    for marker in MARKERS:
        assert marker not in text
    assert "gen_ai.input.messages" not in text and "gen_ai.tool.call.arguments" not in text


async def test_content_when_included_is_scrubbed() -> None:
    obs, exporter, _ = setup(include_content=True)
    await completed_run(obs)
    spans = exporter.get_finished_spans()
    text = exported_text(spans)
    for marker in ("GOAL-MARKER-41aa", ARG, OBS, TEXT):
        assert marker in text
    assert SECRET not in text and EMAIL not in text
    assert "[REDACTED:api_key]" in text and "[REDACTED:email]" in text
    names = by_name(spans)
    tool = names["execute_tool lookup"][0].attributes or {}
    assert json.loads(str(tool["gen_ai.tool.call.arguments"])) == {"query": ARG}
    run = names["invoke_agent"][0].attributes or {}
    messages = json.loads(str(run["gen_ai.input.messages"]))
    assert (
        messages[0]["role"] == "user" and "GOAL-MARKER-41aa" in messages[0]["parts"][0]["content"]
    )


async def test_a_custom_scrubber_and_a_content_cap() -> None:
    obs, exporter, _ = setup(
        include_content=True, scrubber=Scrubber({"marker": r"ARG-MARKER-\w+"}), max_content_chars=60
    )
    await completed_run(obs)
    text = exported_text(exporter.get_finished_spans())
    assert ARG not in text and "[REDACTED:marker]" in text
    assert "chars]" in text  # cut at 60 chars, saying how much was cut
    assert SECRET in text  # only the given patterns run: the defaults were replaced


async def test_spans_end_when_a_run_is_cancelled_during_an_action() -> None:
    obs, exporter, _ = setup()
    model = ScriptedModel([ModelReply(tool_calls=(ToolCall("forever", {}),))])
    loop = Loop(model, tools=tools(), observers=[obs], cancel_grace_s=0.01)
    task = asyncio.ensure_future(loop.run("wait", run_id="c1"))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    names = by_name(exporter.get_finished_spans())
    assert (names["invoke_agent"][0].attributes or {})["polyloop.stop_reason"] == "cancelled"
    tool = names["execute_tool forever"][0]
    assert (tool.attributes or {})["polyloop.interrupted"] is True
    assert tool.status.status_code == StatusCode.ERROR
    assert obs.open_runs == ()


async def test_spans_end_when_a_run_is_cancelled_during_a_model_call() -> None:
    obs, exporter, _ = setup()

    async def hang(request: ModelRequest) -> ModelReply:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    loop = Loop(FunctionModel(hang), observers=[obs])
    task = asyncio.ensure_future(loop.run("wait", run_id="c2"))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    names = by_name(exporter.get_finished_spans())
    chat = names["chat"][0]
    assert (chat.attributes or {})["polyloop.interrupted"] is True
    assert (names["invoke_agent"][0].attributes or {})["polyloop.stop_reason"] == "cancelled"


async def test_each_attempt_is_a_span_and_errors_carry_only_their_type() -> None:
    obs, exporter, _ = setup()
    model = ScriptedModel(
        [ModelCallError(f"rate limited for {EMAIL}", retryable=True, kind="rate_limit"), "done"]
    )
    await Loop(model, observers=[obs], clock=FakeClock()).run("g", run_id="r")
    spans = exporter.get_finished_spans()
    chats = sorted(by_name(spans)["chat"], key=lambda s: (s.attributes or {})["polyloop.attempt"])
    assert len(chats) == 2
    failed = chats[0]
    assert failed.status.status_code == StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "ModelCallError"
    assert chats[1].status.status_code == StatusCode.UNSET
    assert EMAIL not in exported_text(spans)


async def test_error_stops_set_error_status_on_the_run_span() -> None:
    obs, exporter, _ = setup()
    model = ScriptedModel([ModelReply(tool_calls=(ToolCall("broken", {}),))])
    await Loop(model, tools=tools(), observers=[obs]).run("g", run_id="e")
    names = by_name(exporter.get_finished_spans())
    run = names["invoke_agent"][0]
    assert run.status.status_code == StatusCode.ERROR
    assert (run.attributes or {})["polyloop.stop_reason"] == "env_error"
    assert "sandbox is gone" not in exported_text(exporter.get_finished_spans())
    tool = names["execute_tool broken"][0]
    assert tool.status.status_code == StatusCode.ERROR
    assert (tool.attributes or {})["polyloop.action_status"] == "env_error"


async def test_budget_stops_leave_the_status_unset() -> None:
    obs, exporter, _ = setup()
    model = ScriptedModel([ModelReply(tool_calls=(ToolCall("lookup", {"query": "x"}),))] * 2)
    await Loop(model, tools=tools(), observers=[obs], limits=Limits(max_steps=2)).run("g")
    run = by_name(exporter.get_finished_spans())["invoke_agent"][0]
    assert (run.attributes or {})["polyloop.stop_reason"] == "step_budget"
    assert run.status.status_code == StatusCode.UNSET


async def test_the_run_span_is_a_child_of_the_callers_span() -> None:
    obs, exporter, provider = setup()
    with provider.get_tracer("test").start_as_current_span("request"):
        await Loop(ScriptedModel(["hi"]), observers=[obs]).run("g")
    names = by_name(exporter.get_finished_spans())
    outer, run = names["request"][0], names["invoke_agent"][0]
    assert run.parent is not None and run.parent.span_id == outer.context.span_id


async def test_the_model_name_comes_from_an_instrumented_model() -> None:
    obs, exporter, _ = setup()

    class Named(ScriptedModel):
        model = "llama-3-8b"

    await Loop(obs.instrument(Named(["hi"])), observers=[obs]).run("g")
    names = by_name(exporter.get_finished_spans())
    assert "chat llama-3-8b" in names
    assert (names["invoke_agent"][0].attributes or {})["gen_ai.request.model"] == "llama-3-8b"


async def test_the_model_name_comes_from_the_polyloop_commands_metadata() -> None:
    obs, exporter, _ = setup(agent_name="fixer")
    obs.set_run_metadata("m", {"cli": {"model": "openai:gpt-4o-mini"}})
    await Loop(ScriptedModel(["hi"]), observers=[obs]).run("g", run_id="m")
    names = by_name(exporter.get_finished_spans())
    run = names["invoke_agent fixer"][0].attributes or {}
    assert run["gen_ai.request.model"] == "gpt-4o-mini" and run["gen_ai.provider.name"] == "openai"
    assert run["gen_ai.agent.name"] == "fixer"
    assert "chat gpt-4o-mini" in names


async def test_close_ends_the_spans_of_a_detached_run() -> None:
    obs, exporter, _ = setup()
    model = ScriptedModel([ModelReply(tool_calls=(ToolCall("lookup", {"query": "x"}),))] * 3)

    def detach(event: Any) -> None:
        if isinstance(event, StepAppended):
            loop.detach("d")

    loop = Loop(model, tools=tools(), observers=[obs, detach])
    with pytest.raises(RunDetached):
        await loop.run("g", run_id="d")
    assert obs.open_runs == ("d",)
    obs.close()
    assert obs.open_runs == ()
    run = by_name(exporter.get_finished_spans())["invoke_agent"][0]
    assert (run.attributes or {})["polyloop.interrupted"] is True


def test_without_the_extra_the_error_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with pytest.raises(ImportError) as info:
        OTelObserver()
    message = str(info.value)
    assert "\n" not in message and "pip install 'polyloop[otel]'" in message


def test_importing_the_observe_package_does_not_import_opentelemetry() -> None:
    code = (
        "import sys, polyloop.observe, polyloop.observe.otel, polyloop.cli.view\n"
        "bad = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
