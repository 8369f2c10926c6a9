"""The localhost fakes stream what the providers stream: every event of a streamed reply is a
valid event of the provider's SDK types (validated, not just constructed), in the server-sent
events framing its parser reads, and the stream carries the reply the fake sends whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.fakes import anthropic_server as anthropic
from tests.fakes import gemini_server as gemini
from tests.fakes import openai_responses_server as responses
from tests.fakes import openai_server as openai
from tests.fakes._server import Reply, cut, sse, then


def frames(reply: Reply) -> list[tuple[str | None, str]]:
    """``(event name, data)`` of each event of a streamed reply; each event is one frame that
    ends with a blank line."""
    assert reply.mode == "stream"
    out = []
    for frame in reply.events:
        text = frame.decode()
        newline = "\r\n" if "\r\n" in text else "\n"
        assert text.endswith(newline * 2) and text.count(newline * 2) == 1
        fields = dict(line.split(": ", 1) for line in text.split(newline) if line)
        assert set(fields) <= {"event", "data"}
        out.append((fields.get("event"), fields["data"]))
    return out


def test_sse_frames_an_event_as_the_providers_do() -> None:
    assert sse({"a": 1}) == b'data: {"a":1}\n\n'
    assert sse("[DONE]", "done") == b"event: done\ndata: [DONE]\n\n"
    assert sse({}, newline="\r\n") == b"data: {}\r\n\r\n"


def test_cut_and_then_reshape_a_stream() -> None:
    streamed = openai.completion_stream("hello world")
    short = cut(streamed, 2, "stall")
    assert (short.events, short.end, short.headers) == (
        streamed.events[:2],
        "stall",
        streamed.headers,
    )
    extended = then(streamed, 1, b"data: x\n\n")
    assert extended.events == (streamed.events[0], b"data: x\n\n") and extended.end == "complete"


def test_openai_chat_chunks_are_chat_completion_chunks_ending_in_done() -> None:
    sdk = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    options: dict[str, Any] = {
        "tool_calls": [openai.tool_call("add", '{"a": 2, "b": 3}')],
        "reasoning_content": "Add them.",
        "cached_tokens": 30,
    }
    whole = ChatCompletion.model_validate(json.loads(openai.completion("Sum:", **options).body))
    events = frames(openai.completion_stream("Sum:", **options))
    assert events[-1] == (None, "[DONE]") and all(name is None for name, _ in events)
    chunks = [ChatCompletionChunk.model_validate(json.loads(data)) for _, data in events[:-1]]
    assert sdk is not None and all(c.id == whole.id and c.model == whole.model for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
    calls = [t for d in deltas for t in d.tool_calls or ()]
    assert calls[0].id == "call_1" and calls[0].function is not None
    assert "".join(t.function.arguments or "" for t in calls if t.function) == '{"a": 2, "b": 3}'
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "tool_calls" and set(finish[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage  # include_usage


def test_openai_responses_events_are_response_stream_events_ending_in_completed() -> None:
    pytest.importorskip("openai")
    import pydantic
    from openai.types.responses import Response, ResponseStreamEvent

    output = (
        responses.reasoning("First.", "Second."),
        responses.message("Hi", refusal="no"),
        responses.function_call("add", '{"a": 1}'),
    )
    whole = Response.model_validate(json.loads(responses.response(*output).body))
    events = frames(responses.response_stream(*output))
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)
    parsed = [adapter.validate_python(json.loads(data)) for _, data in events]
    assert [name for name, _ in events] == [e.type for e in parsed]  # event: is the type
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    assert parsed[0].type == "response.created" and parsed[-1].type == "response.completed"
    assert parsed[-1].response == whole
    types = {e.type for e in parsed}
    assert {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.output_item.done",
    } <= types
    error = adapter.validate_python(
        json.loads(frames(then(responses.response_stream(), 0, responses.error_event("x")))[0][1])
    )
    assert error.type == "error"


def test_anthropic_events_are_raw_message_stream_events_from_start_to_stop() -> None:
    pytest.importorskip("anthropic")
    import pydantic
    from anthropic.types import Message, RawMessageStreamEvent

    content = (
        anthropic.thinking("Hmm.", signature="sig-1"),
        anthropic.text("Sum:"),
        anthropic.tool_use("add", {"a": 2, "b": 3}),
    )
    whole = Message.model_validate(json.loads(anthropic.message(*content).body))
    events = frames(anthropic.message_stream(*content))
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
    assert ("ping", '{"type":"ping"}') in events  # the SDK skips pings
    parsed = [adapter.validate_python(json.loads(d)) for name, d in events if name != "ping"]
    assert [n for n, _ in events if n != "ping"] == [e.type for e in parsed]
    assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop"
    assert parsed[0].message.id == whole.id and parsed[0].message.content == []
    deltas = [e.delta for e in parsed if e.type == "content_block_delta"]
    assert "".join(d.partial_json for d in deltas if d.type == "input_json_delta") == json.dumps(
        {"a": 2, "b": 3}
    )
    assert [d.signature for d in deltas if d.type == "signature_delta"] == ["sig-1"]
    (end,) = [e for e in parsed if e.type == "message_delta"]
    assert (
        end.delta.stop_reason == "tool_use" and end.usage.output_tokens == whole.usage.output_tokens
    )
    name, data = frames(then(anthropic.message_stream(), 0, anthropic.error_event(529, "Over")))[0]
    assert name == "error" and json.loads(data)["error"]["type"] == "overloaded_error"


def test_gemini_chunks_are_generate_content_responses_with_the_finish_last() -> None:
    pytest.importorskip("google.genai")
    from google.genai import types

    parts = (
        gemini.text("Hmm.", thought=True),
        gemini.text("Sum:"),
        gemini.function_call("add", {"a": 2, "b": 3}, id="fc-1", signature=b"sig"),
    )
    whole = types.GenerateContentResponse.model_validate_json(gemini.generated(*parts).body)
    events = frames(gemini.generated_stream(*parts))
    assert all(name is None for name, _ in events)
    # The SDK's types forbid fields they do not know: every key is one Gemini sends.
    chunks = [types.GenerateContentResponse.model_validate_json(data) for _, data in events]
    assert all(c.response_id == whole.response_id for c in chunks)
    finishes = [c.candidates[0].finish_reason for c in chunks if c.candidates]
    assert finishes[-1] == types.FinishReason.STOP and set(finishes[:-1]) == {None}
    assert chunks[-1].usage_metadata == whole.usage_metadata
    streamed = [p for c in chunks if c.candidates for p in c.candidates[0].content.parts or ()]
    assert "".join(p.text or "" for p in streamed if not p.thought) == "Sum:"
    assert [p.function_call for p in streamed if p.function_call] == [
        p.function_call for p in whole.candidates[0].content.parts or () if p.function_call
    ]
    error = json.loads(
        frames(then(gemini.generated_stream(), 0, gemini.error_chunk(503, "x", "UNAVAILABLE")))[0][
            1
        ]
    )
    assert error == {"error": {"code": 503, "message": "x", "status": "UNAVAILABLE"}}
