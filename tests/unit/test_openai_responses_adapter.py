"""OpenAIResponsesModel, driven through the real openai SDK (``client.responses.create``)
against a scripted server on 127.0.0.1 serving the Responses API's shapes."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    ConfigError,
    Loop,
    ModelCallError,
    ModelRequest,
    StopReason,
    ToolCall,
    Usage,
)
from polyloop.models.openai_responses import OpenAIResponsesModel
from polyloop.testing import FakeClock
from tests.fakes.openai_responses_server import (
    function_call,
    message,
    reasoning,
    response,
    response_stream,
)
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    Reply,
    context_length_exceeded,
    rate_limited,
    unauthorized,
)
from tests.fakes.providers import adder
from tests.unit.test_openai_adapter import ADD_SPEC, ERROR_CASES

openai = pytest.importorskip("openai")

ADD_TOOL = {
    "type": "function",
    "name": "add",
    "parameters": ADD_SPEC["function"]["parameters"],
    "strict": False,
    "description": "Add two numbers.",
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def model(fake: FakeOpenAIServer) -> AsyncIterator[OpenAIResponsesModel]:
    async with OpenAIResponsesModel(
        "o4-mini", base_url=fake.url, api_key="sk-test", timeout_s=5
    ) as m:
        yield m


def request(
    messages: Sequence[dict[str, Any]] | None = None, tools: Sequence[dict[str, Any]] = ()
) -> ModelRequest:
    return ModelRequest(
        "run-1", 0, 1, messages or [{"role": "user", "content": "What is 2+3?"}], tools
    )


# --- the request -----------------------------------------------------------------------------


async def test_a_request_posts_to_responses_stateless_with_converted_tools(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(response(message("5")))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    await model.complete(request(messages, [ADD_SPEC]))
    (got,) = fake.requests
    assert got.path == "/v1/responses"
    assert got.headers["authorization"] == "Bearer sk-test"
    assert got.body == {
        "model": "o4-mini",
        "input": [
            {"type": "message", "role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": "2+3?"},
        ],
        "store": False,
        "tools": [ADD_TOOL],
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "reasoning": {"summary": "auto"},
    }


async def test_tool_choice_none_sends_the_tools_and_forbids_calling_them(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(response(message("best guess")))
    await model.complete(dataclasses.replace(request(tools=[ADD_SPEC]), tool_choice="none"))
    body = fake.requests[0].body
    assert body["tools"] == [ADD_TOOL] and body["tool_choice"] == "none"


async def test_a_request_without_tools_leaves_tools_parallel_and_tool_choice_out(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(response(message("hi")))
    await model.complete(request())
    body = fake.requests[0].body
    assert not {"tools", "parallel_tool_calls", "tool_choice"} & body.keys()


async def test_a_history_becomes_input_items_paired_by_call_id_and_is_not_mutated(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(response(message("5")))
    messages: list[dict[str, Any]] = [
        {"role": "developer", "content": "Use the tools."},
        {"role": "user", "content": [{"type": "text", "text": "Add these:"}]},
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_9", "content": "5"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_10",
                    "type": "function",
                    "function": {"name": "add", "arguments": None},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_10", "content": None},
        {"role": "assistant", "content": "It is 5."},
    ]
    before = copy.deepcopy(messages)
    await model.complete(request(messages))
    assert fake.requests[0].body["input"] == [
        {"type": "message", "role": "developer", "content": "Use the tools."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Add these:"}],
        },
        {"type": "message", "role": "assistant", "content": "Adding."},
        {
            "type": "function_call",
            "call_id": "call_9",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        },
        {"type": "function_call_output", "call_id": "call_9", "output": "5"},
        {"type": "function_call", "call_id": "call_10", "name": "add", "arguments": ""},
        {"type": "function_call_output", "call_id": "call_10", "output": ""},
        {"type": "message", "role": "assistant", "content": "It is 5."},
    ]
    assert messages == before


async def test_options_become_responses_fields(fake: FakeOpenAIServer) -> None:
    fake.script(response(message("ok")))
    choice = {"type": "function", "function": {"name": "add"}}
    async with OpenAIResponsesModel(
        "o4-mini",
        base_url=fake.url,
        reasoning_effort="high",
        reasoning_summary="detailed",
        max_tokens=2048,
        store=True,
        tool_choice=choice,
        extra_body={"service_tier": "flex"},
    ) as m:
        await m.complete(request(tools=[ADD_SPEC]))
    body = fake.requests[0].body
    assert body["reasoning"] == {"effort": "high", "summary": "detailed"}
    assert body["max_output_tokens"] == 2048 and "max_tokens" not in body
    assert body["store"] is True
    assert body["tool_choice"] == {"type": "function", "name": "add"}
    assert body["service_tier"] == "flex"


async def test_no_reasoning_settings_send_no_reasoning_field(fake: FakeOpenAIServer) -> None:
    fake.script(response(message("ok")))
    async with OpenAIResponsesModel("gpt-4.1", base_url=fake.url, reasoning_summary=None) as m:
        await m.complete(request())
    assert "reasoning" not in fake.requests[0].body


async def test_a_message_it_cannot_convert_is_bad_request_and_nothing_is_sent(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    with pytest.raises(ModelCallError) as info:
        await model.complete(request([{"role": "tool", "content": "5"}]))
    assert (info.value.kind, info.value.retryable) == ("bad_request", False)
    assert "tool_call_id" in info.value.message and "\n" not in info.value.message
    assert fake.requests == []


# --- the reply -------------------------------------------------------------------------------


async def test_reasoning_summaries_text_usage_and_the_response_id(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(
        response(
            reasoning("**Adding**\n\n2 plus 3.", "It is 5."),
            message("The answer is 5."),
            id="resp_abc",
            usage=(75, 1186, 1024),
            cached_tokens=60,
            model="o4-mini-2025-04-16",
        )
    )
    reply = await model.complete(request())
    assert reply.text == "The answer is 5."
    assert reply.reasoning == "**Adding**\n\n2 plus 3.\n\nIt is 5."
    assert reply.call_id == "resp_abc"
    # The 1024 reasoning tokens are part of the output, the 60 cached ones of the input.
    assert reply.usage == Usage(75, 1186, cached_tokens=60, reasoning_tokens=1024)
    assert reply.model == "o4-mini-2025-04-16"
    assert reply.tool_calls == ()


async def test_a_function_call_keeps_its_call_id_and_arguments_string_exactly(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    args = '{"a": 2,   "b":3 }'
    fake.script(response(reasoning(), function_call("add", args, call_id="call_xyz")))
    reply = await model.complete(request(tools=[ADD_SPEC]))
    assert reply.tool_calls == (ToolCall("add", args, "call_xyz"),)
    assert (reply.text, reply.reasoning) == ("", None)


async def test_no_usage_and_no_id_are_none(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(response(message("hi", refusal="no"), usage=None, id=None))
    reply = await model.complete(request())
    assert (reply.text, reply.usage, reply.call_id) == ("hino", None, None)


async def test_a_failed_response_is_a_retryable_server_error(
    model: OpenAIResponsesModel, fake: FakeOpenAIServer
) -> None:
    fake.script(response(status="failed", error={"code": "server_error", "message": "boom\nagain"}))
    with pytest.raises(ModelCallError) as info:
        await model.complete(request())
    assert (info.value.kind, info.value.retryable) == ("server", True)
    assert "server_error: boom again" in info.value.message


@pytest.mark.parametrize(
    ("reply", "kind", "retryable", "retry_after"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
async def test_failures_become_model_call_errors_with_the_chat_adapters_kinds(
    model: OpenAIResponsesModel,
    fake: FakeOpenAIServer,
    reply: Reply,
    kind: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    fake.script(reply)
    with pytest.raises(ModelCallError) as info:
        await model.complete(request())
    err = info.value
    assert (err.kind, err.retryable, err.retry_after) == (kind, retryable, retry_after)
    assert fake.url in err.message and "o4-mini" in err.message
    assert "\n" not in err.message
    assert len(fake.requests) == 1


# --- construction ----------------------------------------------------------------------------


def test_a_remote_server_without_a_key_names_the_class() -> None:
    with pytest.raises(ConfigError, match=r"^OpenAIResponsesModel has no API key"):
        OpenAIResponsesModel("o4-mini")


@pytest.mark.parametrize(
    "kwargs",
    [{"reasoning_summary": "long"}, {"reasoning_effort": 3}, {"store": "no"}],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="OpenAIResponsesModel"):
        OpenAIResponsesModel("o4-mini", api_key="k", **kwargs)


def test_repr_names_the_class_and_never_the_key() -> None:
    m = OpenAIResponsesModel("o4-mini", base_url="https://api.example.com/v1", api_key="sk-s3")
    assert (
        repr(m) == "OpenAIResponsesModel(model='o4-mini', base_url='https://api.example.com/v1/')"
    )


# --- end to end through Loop -----------------------------------------------------------------


async def test_loop_round_trip_pairs_function_call_and_output_by_call_id(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(
        response(
            reasoning("Use add."),
            function_call("add", '{"a": 2, "b": 3}', call_id="call_1"),
            id="resp_a",
            usage=(50, 40, 32),
        ),
        response(message("2 + 3 = 5"), id="resp_b", usage=(120, 8, 0)),
    )
    async with OpenAIResponsesModel("o4-mini", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert (result.stop_reason, result.stop_detail) == (StopReason.agent_finished, None)
    assert result.final_answer == "2 + 3 = 5"
    assert [s.llm_call_id for s in result.steps] == ["resp_a", "resp_b"]
    assert result.steps[0].observation == "5"
    assert result.steps[0].reasoning_chars == len("Use add.")
    assert result.usage == Usage(50 + 120, 40 + 8, cached_tokens=0, reasoning_tokens=32)
    first, second = (r.body for r in fake.requests)
    assert first["parallel_tool_calls"] is False and first["store"] is False
    assert [t["name"] for t in first["tools"]] == ["add"]
    assert second["input"][-2:] == [
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "add",
            "arguments": '{"a": 2, "b": 3}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]


async def test_loop_retries_a_rate_limit_after_the_servers_retry_after(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(rate_limited("2"), response(message("done"), id="resp_ok"))
    clock = FakeClock()
    async with OpenAIResponsesModel("o4-mini", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=clock).run("go")
    assert result.stop_reason is StopReason.agent_finished
    assert [s.llm_call_id for s in result.steps] == ["resp_ok"]
    assert clock.sleeps == [2.0]
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("reply", "kind"),
    [(unauthorized(), "auth"), (context_length_exceeded(), "context_length")],
    ids=["auth", "context_length"],
)
async def test_loop_ends_llm_error_on_a_non_retryable_failure(
    fake: FakeOpenAIServer, reply: Reply, kind: str
) -> None:
    fake.script(reply)
    async with OpenAIResponsesModel("o4-mini", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("go")
    assert result.stop_reason is StopReason.llm_error
    assert result.stop_detail is not None
    assert f"kind={kind}, retryable=False, attempts=1" in result.stop_detail


# --- the polyloop command --------------------------------------------------------------------


def test_the_command_runs_an_openai_responses_model(fake: FakeOpenAIServer, tmp_path: Path) -> None:
    pytest.importorskip("typer")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("the code is 7\n", encoding="utf-8")
    fake.script(
        response(function_call("read_file", '{"path": "notes.txt"}', call_id="call_r1")),
        response(message("The code is 7.")),
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "POLYLOOP_"))}
    model = ("--model", "openai-responses:o4-mini", "--base-url", fake.url)
    where = ("--workspace", "ws", "--journal", "j.db", "--tools", "files")
    done = subprocess.run(
        [sys.executable, "-m", "polyloop.cli", "run", "read notes", *model, *where],
        cwd=tmp_path,
        env={**clean, "PYTHONUNBUFFERED": "1", "OPENAI_API_KEY": "sk-e"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    assert "agent_finished" in done.stdout, done
    first, second = fake.requests
    assert first.path == "/v1/responses" and first.body["model"] == "o4-mini"
    assert second.body["input"][-1] == {
        "type": "function_call_output",
        "call_id": "call_r1",
        "output": "the code is 7\n",
    }


async def test_streamed_deltas_add_up_to_the_reply_across_items_and_summary_parts(
    fake: FakeOpenAIServer,
) -> None:
    # The reply joins message items with "\n" and summary parts with a blank line: the deltas
    # carry the same separators, so that what was shown is what is journaled.
    output = (
        reasoning("First, read.", "Then, answer."),
        message("Paris", id="msg_1"),
        message("is the capital.", id="msg_2", refusal=" (no more)"),
    )
    fake.script(response(*output), response_stream(*output))
    shown: list[tuple[str, str]] = []
    on_delta = lambda kind, text: shown.append((kind, text))  # noqa: E731
    req = ModelRequest("r", 0, 1, [{"role": "user", "content": "?"}], (), on_delta)
    async with OpenAIResponsesModel("o4-mini", base_url=fake.url, api_key="k") as whole:
        expected = await whole.complete(req)
    async with OpenAIResponsesModel("o4-mini", base_url=fake.url, api_key="k", stream=True) as m:
        reply = await m.complete(req)
    assert reply == expected
    assert reply.text == "Paris\nis the capital. (no more)"
    assert "".join(t for k, t in shown if k == "text") == reply.text
    assert "".join(t for k, t in shown if k == "reasoning") == reply.reasoning


async def test_a_stream_failing_with_response_failed_is_a_server_error(
    fake: FakeOpenAIServer,
) -> None:
    failed = {"code": "server_error", "message": "The model failed."}
    fake.script(response_stream(message("Par"), status="failed", error=failed))
    async with OpenAIResponsesModel("o4-mini", base_url=fake.url, api_key="k", stream=True) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == ("server", True)
    assert "The model failed." in info.value.message
