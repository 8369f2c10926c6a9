"""A server that refuses to stream: llama-cpp-python's server answers a streamed request it
cannot stream (a tool call chosen under ``tool_choice`` "auto") with an event stream that ends
before its first event (:func:`tests.fakes.openai_server.stream_refused`, its recorded bytes).
``OpenAIModel(stream=True)`` takes that as what it is: the attempt fails with kind
``stream_refused`` (retryable, so the kernel's next attempt goes out), and the model sends
every request after it whole, saying so once in the log."""

from __future__ import annotations

import json
import logging

import pytest

from polyloop import Loop, ModelCallError, ModelRequest, RetryPolicy, StopReason
from polyloop.journal import MemoryJournal
from polyloop.models.openai import OpenAIModel
from tests.fakes._server import cut
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    completion,
    completion_stream,
    stream_refused,
    tool_call,
)
from tests.fakes.providers import ADD_SPEC, adder

pytest.importorskip("openai")


def request(attempt: int = 1) -> ModelRequest:
    return ModelRequest("run-1", 0, attempt, [{"role": "user", "content": "2+3?"}], [ADD_SPEC])


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "whole from now on" in r.getMessage()]


async def test_an_empty_event_stream_is_a_refusal_and_later_requests_are_sent_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    call = [tool_call("add", json.dumps({"a": 2, "b": 3}))]
    caplog.set_level(logging.WARNING, logger="polyloop")
    with FakeOpenAIServer() as fake:
        fake.script(stream_refused(), completion(tool_calls=call), completion("5"))
        async with OpenAIModel("gemma", base_url=fake.url, stream=True) as model:
            with pytest.raises(ModelCallError) as info:
                await model.complete(request())
            assert model.stream is False
            again = await model.complete(request(2))
            later = await model.complete(request())
        refused, whole, after = fake.requests
    error = info.value
    assert (error.kind, error.retryable) == ("stream_refused", True)
    assert "before its first event" in error.message and fake.url in error.message
    assert refused.body["stream"] is True
    assert "stream" not in whole.body and "stream" not in after.body
    assert whole.body["messages"] == refused.body["messages"]
    assert [c.name for c in again.tool_calls] == ["add"] and later.text == "5"
    (said,) = refusals(caplog)  # once, however many requests follow
    assert fake.url in said


async def test_a_stream_cut_off_after_it_began_is_still_a_connection_failure() -> None:
    streamed = completion_stream("The answer is 5.")
    with FakeOpenAIServer() as fake:
        fake.script(cut(streamed, 2, end="complete"), streamed)
        async with OpenAIModel("gemma", base_url=fake.url, stream=True) as model:
            with pytest.raises(ModelCallError) as info:
                await model.complete(request())
            assert model.stream is True
            reply = await model.complete(request(2))
    assert info.value.kind == "connection"
    assert reply.text == "The answer is 5."
    assert all(r.body["stream"] is True for r in fake.requests)


async def test_a_run_whose_server_refuses_to_stream_goes_on_with_whole_replies() -> None:
    call = [tool_call("add", json.dumps({"a": 2, "b": 3}))]
    journal = MemoryJournal()
    with FakeOpenAIServer() as fake:
        fake.script(stream_refused(), completion(tool_calls=call), completion("It is 5."))
        async with OpenAIModel("gemma", base_url=fake.url, stream=True) as model:
            loop = Loop(model, tools=adder(), journal=journal, retry=RetryPolicy(jitter=0))
            result = await loop.run("2+3?")
        asked = [r.body.get("stream") for r in fake.requests]
    assert result.stop_reason == StopReason.agent_finished, result.stop_detail
    assert result.final_answer == "It is 5."
    assert asked == [True, None, None]  # the refused stream, then whole requests


async def test_with_one_attempt_the_refusal_ends_the_step_and_the_next_run_is_sent_whole() -> None:
    journal = MemoryJournal()
    with FakeOpenAIServer() as fake:
        fake.script(stream_refused(), completion("It is 5."))
        async with OpenAIModel("gemma", base_url=fake.url, stream=True) as model:
            loop = Loop(model, journal=journal, retry=RetryPolicy(max_attempts=1))
            refused = await loop.run("2+3?")
            after = await loop.run("2+3?")
        asked = [r.body.get("stream") for r in fake.requests]
    assert refused.stop_reason == StopReason.llm_error
    assert "[kind=stream_refused, retryable=True, attempts=1]" in (refused.stop_detail or "")
    assert after.stop_reason == StopReason.agent_finished and after.final_answer == "It is 5."
    assert asked == [True, None]
