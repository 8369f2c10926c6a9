"""Log-probabilities, opt-in: asked for only with ``logprobs=True``, read from a reply sent
whole or streamed, checked at the adapter (a bad value is ``bad_response``), and carried to
``RunResult.logprobs`` for every attempt that returned a reply. Driven through the real openai
SDK against the scripted server on 127.0.0.1."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from polyloop import ConfigError, Loop, MalformedValue, ModelCallError, ModelReply, ModelRequest
from polyloop.models.openai import OpenAIModel
from polyloop.testing import FakeClock
from polyloop.types import AttemptLogprobs, TokenLogprob
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    completion,
    completion_stream,
    rate_limited,
    tool_call,
)
from tests.fakes.providers import adder

pytest.importorskip("openai")


def entry(token: str, logprob: Any, *top: tuple[str, Any], **extra: Any) -> dict[str, Any]:
    """One ``logprobs.content`` entry as OpenAI sends it (``bytes`` included)."""
    alternatives = [{"token": t, "logprob": lp, "bytes": None} for t, lp in top]
    return {"token": token, "logprob": logprob, "bytes": None, "top_logprobs": alternatives} | extra


HELLO = [
    entry("Hel", -0.25, ("Hel", -0.25), ("Hi", -1.5)),
    entry("lo", -0.5, ("lo", -0.5), ("p", -2.0)),
    entry("!", -1.0, ("!", -1.0), (".", -1.25)),
]
HELLO_TOKENS = (
    TokenLogprob("Hel", -0.25, None, (TokenLogprob("Hel", -0.25), TokenLogprob("Hi", -1.5))),
    TokenLogprob("lo", -0.5, None, (TokenLogprob("lo", -0.5), TokenLogprob("p", -2.0))),
    TokenLogprob("!", -1.0, None, (TokenLogprob("!", -1.0), TokenLogprob(".", -1.25))),
)


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


def request() -> ModelRequest:
    return ModelRequest("run", 0, 1, [{"role": "user", "content": "hi"}], [])


def model(fake: FakeOpenAIServer, **options: Any) -> OpenAIModel:
    return OpenAIModel("gpt-test", base_url=fake.url, api_key="sk-test", timeout_s=5, **options)


async def test_off_by_default_nothing_is_asked_and_nothing_is_kept(
    fake: FakeOpenAIServer,
) -> None:
    # The server sends logprobs unasked: a model without the option neither asks nor reads.
    fake.script(completion("Hello!", logprobs=HELLO), completion_stream("Hello!", logprobs=HELLO))
    async with model(fake) as m:
        reply = await m.complete(request())
    async with model(fake, stream=True) as m:
        streamed = await m.complete(request())
    assert reply.logprobs is None and streamed.logprobs is None
    for received in fake.requests:
        assert "logprobs" not in received.body and "top_logprobs" not in received.body


async def test_a_reply_sent_whole_keeps_each_token_its_logprob_and_the_top_k(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(completion("Hello!", logprobs=HELLO))
    async with model(fake, logprobs=True, top_logprobs=2) as m:
        reply = await m.complete(request())
    assert fake.requests[0].body["logprobs"] is True
    assert fake.requests[0].body["top_logprobs"] == 2
    assert reply.text == "Hello!"
    assert reply.logprobs == HELLO_TOKENS


async def test_a_streamed_reply_keeps_the_tokens_of_every_chunk_in_order(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(completion_stream("Hello!", size=2, logprobs=HELLO))
    async with model(fake, logprobs=True, top_logprobs=2, stream=True) as m:
        reply = await m.complete(request())
    assert fake.requests[0].body["stream"] is True and fake.requests[0].body["logprobs"] is True
    assert reply.text == "Hello!"
    assert reply.logprobs == HELLO_TOKENS


async def test_without_top_logprobs_only_logprobs_is_sent(fake: FakeOpenAIServer) -> None:
    fake.script(completion("Hi", logprobs=[entry("Hi", -0.125)]))
    async with model(fake, logprobs=True) as m:
        reply = await m.complete(request())
    assert fake.requests[0].body["logprobs"] is True
    assert "top_logprobs" not in fake.requests[0].body
    assert reply.logprobs == (TokenLogprob("Hi", -0.125),)


async def test_token_ids_are_kept_where_the_server_gives_them(fake: FakeOpenAIServer) -> None:
    # llama.cpp's server adds "id"; vLLM's return_tokens_as_token_ids spells "token_id:N".
    given = [entry("Hi", -0.5, id=9259), entry("token_id:106", -0.75, ("token_id:106", -0.75))]
    fake.script(completion("Hi", logprobs=given))
    async with model(fake, logprobs=True, top_logprobs=1) as m:
        reply = await m.complete(request())
    assert reply.logprobs == (
        TokenLogprob("Hi", -0.5, 9259),
        TokenLogprob("token_id:106", -0.75, 106, (TokenLogprob("token_id:106", -0.75, 106),)),
    )


async def test_a_server_that_sends_no_logprobs_gives_none(fake: FakeOpenAIServer) -> None:
    fake.script(completion("Hi"), completion("Hi", logprobs=[]))
    async with model(fake, logprobs=True) as m:
        assert (await m.complete(request())).logprobs is None
        assert (await m.complete(request())).logprobs == ()


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (entry("Hi", math.nan), "not a finite number"),
        (entry("Hi", math.inf), "not a finite number"),
        (entry("Hi", -math.inf), "not a finite number"),
        (entry("Hi", "high"), "not a finite number"),
        (entry("Hi", 0.5), "above 0"),
        (entry("Hi", True), "above 0"),  # the SDK makes it 1.0
        (entry(7, -0.5), "not a string"),
        (entry("Hi", -0.5, id="7"), "token id"),
        (entry("Hi", -0.5, *[("x", -1.0)] * 3), "more than 2"),
        (entry("Hi", -0.5, ("x", math.nan)), "not a finite number"),
        ({"token": "Hi", "logprob": -0.5, "top_logprobs": "many"}, "not a list"),
    ],
)
async def test_a_bad_value_makes_the_reply_bad_response(
    fake: FakeOpenAIServer, bad: dict[str, Any], said: str
) -> None:
    fake.script(completion("Hi", logprobs=[bad]), completion_stream("Hi", logprobs=[bad]))
    async with model(fake, logprobs=True, top_logprobs=1) as m:
        with pytest.raises(ModelCallError) as whole:
            await m.complete(request())
    async with model(fake, logprobs=True, top_logprobs=1, stream=True) as m:
        with pytest.raises(ModelCallError) as streamed:
            await m.complete(request())
    for info in (whole, streamed):
        assert info.value.kind == "bad_response" and info.value.retryable is True
        assert said in str(info.value)


async def test_content_that_is_not_a_list_is_bad_response(fake: FakeOpenAIServer) -> None:
    fake.script(completion("Hi", logprobs={"token": "Hi", "logprob": -0.5}))
    async with model(fake, logprobs=True) as m:
        with pytest.raises(ModelCallError, match="not a list") as info:
            await m.complete(request())
    assert info.value.kind == "bad_response"


async def test_run_result_has_the_logprobs_of_every_attempt_that_replied(
    fake: FakeOpenAIServer,
) -> None:
    # step 0: attempt 1 rate limited (no reply), attempt 2 a tool call; step 1: a bad value
    # (attempt 1, bad_response, retried), then the answer (attempt 2).
    call = [entry('{"a"', -0.5)]
    fake.script(
        rate_limited(retry_after="0"),
        completion(None, tool_calls=[tool_call("add", '{"a": 2, "b": 3}')], logprobs=call),
        completion("5", logprobs=[entry("5", math.nan)]),
        completion("5", logprobs=[entry("5", -0.0625)]),
    )
    async with model(fake, logprobs=True) as m:
        result = await Loop(m, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert result.final_answer == "5"
    assert result.logprobs == (
        AttemptLogprobs(0, 2, (TokenLogprob('{"a"', -0.5),)),
        AttemptLogprobs(1, 2, (TokenLogprob("5", -0.0625),)),
    )
    assert "logprobs" not in repr(result.steps[0])


async def test_a_run_without_the_option_has_no_logprobs(fake: FakeOpenAIServer) -> None:
    fake.script(completion("5", logprobs=[entry("5", -0.0625)]))
    async with model(fake) as m:
        result = await Loop(m, clock=FakeClock()).run("What is 2+3?")
    assert result.final_answer == "5" and result.logprobs == ()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"logprobs": 1}, "logprobs must be True or False"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs must be an int >= 0"),
        ({"logprobs": True, "top_logprobs": 2.0}, "top_logprobs must be an int >= 0"),
        ({"top_logprobs": 3}, "top_logprobs needs logprobs=True"),
    ],
)
def test_bad_options_are_config_errors(options: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        OpenAIModel("gpt-test", base_url="http://127.0.0.1:9/v1", **options)


def test_anthropic_refuses_the_option_in_one_line() -> None:
    pytest.importorskip("anthropic")
    from polyloop.models.anthropic import AnthropicModel

    with pytest.raises(ConfigError) as info:
        AnthropicModel("claude-test", base_url="http://127.0.0.1:9", logprobs=True)
    assert "\n" not in str(info.value) and "does not return them" in str(info.value)


def test_a_reply_built_by_hand_is_checked() -> None:
    assert ModelReply("x", logprobs=(TokenLogprob("x", -1),)).logprobs is not None
    with pytest.raises(MalformedValue):
        ModelReply("x", logprobs=[TokenLogprob("x", -1.0)])  # type: ignore[arg-type]
    with pytest.raises(MalformedValue):
        TokenLogprob("x", math.nan)
    with pytest.raises(MalformedValue):
        TokenLogprob("x", -1.0, top=[TokenLogprob("y", -2.0)])  # type: ignore[arg-type]


async def test_the_responses_api_asks_with_include_and_reads_output_text_logprobs() -> None:
    from polyloop.models.openai_responses import OpenAIResponsesModel
    from tests.fakes.openai_responses_server import message, response, response_stream

    item = message("Hello!")
    item["content"][0]["logprobs"] = HELLO
    with FakeOpenAIServer() as fake:
        fake.script(response(item), response_stream(item), response(message("Hi")))
        for stream in (False, True):
            async with OpenAIResponsesModel(
                "o4-test", base_url=fake.url, api_key="sk-test", logprobs=True, top_logprobs=2,
                stream=stream,
            ) as m:  # fmt: skip
                assert (await m.complete(request())).logprobs == HELLO_TOKENS
        async with OpenAIResponsesModel("o4-test", base_url=fake.url, api_key="sk-test") as m:
            assert (await m.complete(request())).logprobs is None
    asked, _, unasked = (r.body for r in fake.requests)
    assert asked["include"] == ["message.output_text.logprobs"] and asked["top_logprobs"] == 2
    assert "logprobs" not in asked
    assert not {"include", "top_logprobs", "logprobs"} & unasked.keys()


async def test_gemini_asks_with_response_logprobs_and_reads_the_chosen_candidates() -> None:
    pytest.importorskip("google.genai")
    from polyloop.models.gemini import GeminiModel
    from tests.fakes.gemini_server import FakeGeminiServer, generated, generated_stream, text

    result = {
        "chosenCandidates": [
            {"token": "Hel", "tokenId": 8, "logProbability": -0.25},
            {"token": "lo!", "tokenId": 9, "logProbability": -0.5},
        ],
        "topCandidates": [
            {"candidates": [{"token": "Hel", "tokenId": 8, "logProbability": -0.25}]},
            {"candidates": [{"token": "lo!", "tokenId": 9, "logProbability": -0.5}]},
        ],
    }
    bad = {"chosenCandidates": [{"token": "x", "logProbability": "NaN"}]}
    want = (
        TokenLogprob("Hel", -0.25, 8, (TokenLogprob("Hel", -0.25, 8),)),
        TokenLogprob("lo!", -0.5, 9, (TokenLogprob("lo!", -0.5, 9),)),
    )
    with FakeGeminiServer() as fake:
        fake.script(
            generated(text("Hello!"), logprobs_result=result),
            generated_stream(text("Hello!"), logprobs_result=result),
            generated(text("x"), logprobs_result=bad),
            generated(text("Hello!"), logprobs_result=result),
        )
        for stream in (False, True):
            async with GeminiModel(
                "gemini-test", base_url=fake.url, api_key="k", logprobs=True, top_logprobs=1,
                stream=stream,
            ) as m:  # fmt: skip
                assert (await m.complete(request())).logprobs == want
        async with GeminiModel("gemini-test", base_url=fake.url, api_key="k", logprobs=True) as m:
            with pytest.raises(ModelCallError) as info:
                await m.complete(request())
        assert info.value.kind == "bad_response"
        async with GeminiModel("gemini-test", base_url=fake.url, api_key="k") as m:
            assert (await m.complete(request())).logprobs is None
    config = fake.requests[0].body["generationConfig"]
    assert config["responseLogprobs"] is True and config["logprobs"] == 1
    assert "responseLogprobs" not in fake.requests[3].body.get("generationConfig", {})
