"""OpenAIModel, driven through the real openai SDK against a scripted server on 127.0.0.1."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence
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
from polyloop.models.openai import _ERROR_KINDS, OpenAIModel, _translate
from polyloop.testing import FakeClock
from tests.fakes._server import then
from tests.fakes.openai_server import (
    FakeOpenAIServer,
    Reply,
    completion,
    completion_stream,
    context_length_exceeded,
    error,
    error_chunk,
    rate_limited,
    strict_violation,
    tool_call,
    unauthorized,
)
from tests.fakes.providers import adder

openai = pytest.importorskip("openai")

INSTALL_HINT = "the OpenAI adapter needs the openai package: pip install 'polyloop[openai]'"
ADD_SPEC = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_ADMIN_KEY",
        "OPENAI_ORG_ID",
        "OPENAI_PROJECT_ID",
        "OPENAI_CUSTOM_HEADERS",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def model(fake: FakeOpenAIServer) -> AsyncIterator[OpenAIModel]:
    async with OpenAIModel("gpt-test", base_url=fake.url, api_key="sk-test", timeout_s=5) as m:
        yield m


def request(
    messages: Sequence[dict[str, Any]] | None = None, tools: Sequence[dict[str, Any]] = ()
) -> ModelRequest:
    return ModelRequest(
        "run-1", 0, 1, messages or [{"role": "user", "content": "What is 2+3?"}], tools
    )


# --- the request -----------------------------------------------------------------------------


async def test_request_with_tools_sends_them_and_parallel_tool_calls_false(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script(completion("5"))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    await model.complete(request(messages, [ADD_SPEC]))
    (got,) = fake.requests
    assert got.path == "/v1/chat/completions"
    assert got.headers["authorization"] == "Bearer sk-test"
    assert got.body["model"] == "gpt-test"
    assert got.body["messages"] == messages
    assert got.body["tools"] == [ADD_SPEC]
    assert got.body["parallel_tool_calls"] is False
    assert got.body["tool_choice"] == "auto"
    assert "temperature" not in got.body
    assert "max_tokens" not in got.body
    assert got.body.get("stream") in (None, False)


async def test_request_without_tools_leaves_tools_parallel_and_tool_choice_out(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script(completion("hi"))
    await model.complete(request())
    body = fake.requests[0].body
    assert "tools" not in body
    assert "parallel_tool_calls" not in body
    assert "tool_choice" not in body


async def test_tool_choice_none_sends_the_tools_and_forbids_calling_them(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(completion("best guess"))
    async with OpenAIModel("gpt-test", base_url=fake.url, api_key="k", tool_choice="required") as m:
        await m.complete(dataclasses.replace(request(tools=[ADD_SPEC]), tool_choice="none"))
    body = fake.requests[0].body
    assert body["tools"] == [ADD_SPEC] and body["tool_choice"] == "none"


async def test_options_are_sent_and_extra_body_is_merged(fake: FakeOpenAIServer) -> None:
    fake.script(completion("hi"))
    async with OpenAIModel(
        "gpt-test",
        base_url=fake.url,
        api_key="k",
        temperature=0.2,
        max_tokens=64,
        extra_body={"top_k": 5},
        tool_choice="required",
    ) as m:
        await m.complete(request(tools=[ADD_SPEC]))
    body = fake.requests[0].body
    assert (body["temperature"], body["max_tokens"], body["top_k"]) == (0.2, 64, 5)
    assert body["tool_choice"] == "required"


ADD_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
}


async def test_the_conversation_is_sent_as_given_and_not_mutated(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief.", "name": "rules"},
        {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
        {"role": "assistant", "content": "Adding.", "tool_calls": [ADD_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    before = copy.deepcopy(messages)
    fake.script(completion("5"))
    await model.complete(request(messages, [ADD_SPEC]))
    assert fake.requests[0].body["messages"] == before
    assert messages == before


async def test_a_message_without_text_is_sent_with_empty_string_content(
    fake: FakeOpenAIServer,
) -> None:
    # OpenAI's own shape for a reply that only calls tools is content null; llama-cpp-python
    # 0.3.x refuses null (HTTP 500) and older servers refuse an absent content: "" is what
    # every server accepts, for history messages too.
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": None, "tool_calls": [ADD_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": None},
        {"role": "assistant", "tool_calls": [{**ADD_CALL, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
    ]
    before = copy.deepcopy(messages)
    with FakeOpenAIServer(strict=True) as strict:
        strict.script(completion("5"))
        async with OpenAIModel("gpt-test", base_url=strict.url) as model:
            reply = await model.complete(request(messages, [ADD_SPEC]))
    assert reply.text == "5"
    (got,) = strict.requests
    assert got.body["messages"] == [
        {"role": "user", "content": "add 2 and 3"},
        {"role": "assistant", "content": "", "tool_calls": [ADD_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
        {"role": "assistant", "tool_calls": [{**ADD_CALL, "id": "call_2"}], "content": ""},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
    ]
    assert messages == before  # the caller's dicts are not touched


# --- the reply -------------------------------------------------------------------------------


async def test_tool_call_reply_keeps_the_arguments_string_exactly(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    args = '{"a": 2,   "b":3 }'
    fake.script(
        completion(
            tool_calls=[tool_call("add", args, id="call_abc")],
            id="chatcmpl-9",
            cached_tokens=64,
            reasoning_tokens=9,
            model="gpt-test-2025-04-14",
        )
    )
    reply = await model.complete(request(tools=[ADD_SPEC]))
    assert reply.tool_calls == (ToolCall("add", args, "call_abc"),)
    assert reply.text == ""
    assert reply.call_id == "chatcmpl-9"
    # prompt_tokens_details.cached_tokens and completion_tokens_details.reasoning_tokens are
    # parts of the prompt and completion tokens, as Usage counts them.
    assert reply.usage == Usage(82, 17, cached_tokens=64, reasoning_tokens=9)
    assert reply.model == "gpt-test-2025-04-14"  # the model that answered, as reported
    assert reply.reasoning is None


async def test_malformed_arguments_are_passed_on_verbatim(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script(completion(tool_calls=[tool_call("add", '{"a": 2, "b"')]))
    reply = await model.complete(request(tools=[ADD_SPEC]))
    assert reply.tool_calls[0].arguments == '{"a": 2, "b"'


async def test_text_reply_without_usage_has_usage_none(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script(completion("The answer is 5.", usage=None, id="chatcmpl-2"))
    reply = await model.complete(request())
    assert (reply.text, reply.tool_calls, reply.usage) == ("The answer is 5.", (), None)
    assert reply.call_id == "chatcmpl-2"


async def test_a_response_without_an_id_has_call_id_none(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script(completion("hi", id=None))
    assert (await model.complete(request())).call_id is None


@pytest.mark.parametrize(
    ("field", "value"),
    [("reasoning_content", "2 plus 3 is 5"), ("reasoning", "thinking: 5")],
)
async def test_reasoning_is_read_from_the_servers_extra_field(
    model: OpenAIModel, fake: FakeOpenAIServer, field: str, value: str
) -> None:
    extra: dict[str, Any] = {field: value}
    fake.script(completion("5", **extra))
    reply = await model.complete(request())
    assert (reply.text, reply.reasoning) == ("5", value)


# --- errors ----------------------------------------------------------------------------------

ERROR_CASES: list[tuple[str, Reply, str, bool, float | None]] = [
    ("502 generic", error(502, "Bad gateway", type="server_error"), "server", True, None),
    (
        "404 model",
        error(404, "The model `nope` does not exist", code="model_not_found"),
        "not_found",
        False,
        None,
    ),
    (
        "400 llama.cpp context size",
        error(
            400,
            "the request exceeds the available context size, try increasing it",
            type="exceed_context_size_error",
        ),
        "context_length",
        False,
        None,
    ),
]


@pytest.mark.parametrize(
    ("reply", "kind", "retryable", "retry_after"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
async def test_failures_become_model_call_errors_with_a_kind(
    model: OpenAIModel,
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
    assert fake.url in err.message and "gpt-test" in err.message
    assert "\n" not in err.message
    if kind != "bad_response":  # those come from a bare JSONDecodeError or our own check
        assert isinstance(err.__cause__, openai.OpenAIError)
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("chunk", "kind", "retryable"),
    [
        (error_chunk("The server had an error", type="server_error"), "server", True),
        (
            error_chunk("Rate limit reached", type="requests", code="rate_limit_exceeded"),
            "rate_limit",
            True,
        ),
        (
            error_chunk(
                "maximum context length is 8192 tokens",
                type="invalid_request_error",
                code="context_length_exceeded",
            ),
            "context_length",
            False,
        ),
        (error_chunk("bad value", type="invalid_request_error"), "bad_request", False),
        # vLLM: the error's code is the HTTP status it would have answered with
        (error_chunk("engine died", type="InternalServerError", code=500), "server", True),
        (error_chunk("too many requests", type="RateLimitError", code=429), "rate_limit", True),
        (error_chunk("bad", type="BadRequestError", code=400), "bad_request", False),
        (error_chunk("who knows", type="mystery"), "error", False),
    ],
    ids=[
        "server_error",
        "rate_limit",
        "context_length",
        "bad_request",
        "vllm 500",
        "vllm 429",
        "vllm 400",
        "unknown",
    ],
)
async def test_an_error_chunk_inside_a_stream_is_kind_as_the_same_error_sent_whole(
    fake: FakeOpenAIServer, chunk: bytes, kind: str, retryable: bool
) -> None:
    fake.script(then(completion_stream("The answer is 5."), 3, chunk))
    async with OpenAIModel("gpt-test", base_url=fake.url, stream=True) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == (kind, retryable)
    assert type(info.value.__cause__) is openai.APIError  # as the SDK's stream parser raises it


async def test_a_stream_sends_include_usage_and_reads_the_last_chunks_usage(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(completion_stream("hi", usage=(10, 2), cached_tokens=4, reasoning_tokens=1))
    async with OpenAIModel("gpt-test", base_url=fake.url, stream=True) as m:
        reply = await m.complete(request())
    body = fake.requests[0].body
    assert (body["stream"], body["stream_options"]) == (True, {"include_usage": True})
    assert reply.usage == Usage(10, 2, cached_tokens=4, reasoning_tokens=1)


async def test_a_server_that_streams_no_usage_gives_usage_none(fake: FakeOpenAIServer) -> None:
    fake.script(completion_stream("hi", usage=None))  # a server that ignores include_usage
    async with OpenAIModel("gpt-test", base_url=fake.url, stream=True) as m:
        reply = await m.complete(request())
    assert (reply.text, reply.usage) == ("hi", None)


class _StubClient:
    """Stands in for an AsyncOpenAI passed as client=: raises ``exc`` from create()."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.base_url = "http://stub/v1"
        self.closed = False
        self.chat = self
        self.completions = self

    def with_options(self, **options: Any) -> _StubClient:
        assert options == {"max_retries": 0}
        return self

    async def create(self, **body: Any) -> Any:
        raise self.exc

    async def close(self) -> None:
        self.closed = True


async def test_exceptions_that_are_not_the_sdks_propagate_unchanged() -> None:
    boom = RuntimeError("a bug in a transport hook")
    model = OpenAIModel("gpt-test", client=_StubClient(boom))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError) as info:
        await model.complete(request())
    assert info.value is boom
    assert _translate(ValueError("x"), openai, "here") is None


def _public_sdk_errors() -> dict[str, type[Exception]]:
    # issubclass(type(obj), type), not inspect.isclass: the SDK's lazy proxies load whole
    # modules (and grow vars(openai)) when asked for their __class__.
    return {
        name: obj
        for name, obj in list(vars(openai).items())
        if issubclass(type(obj), type) and issubclass(obj, openai.OpenAIError)
    }


def test_every_exception_class_the_sdk_exports_has_an_explicit_kind() -> None:
    exported = {name for name in _public_sdk_errors() if not name.startswith("_")}
    assert "RateLimitError" in exported  # the scan itself works
    missing = sorted(exported - set(_ERROR_KINDS))
    assert not missing, f"decide a kind for these openai exceptions: {missing}"


def test_every_sdk_exception_class_translates_even_with_missing_attributes() -> None:
    for name, cls in _public_sdk_errors().items():
        exc = cls.__new__(cls)  # no request/response/body: the translation must not care
        Exception.__init__(exc, f"boom from {name}")
        out = _translate(exc, openai, "http://x/v1 (model 'm')")
        assert isinstance(out, ModelCallError), name
        expected = _ERROR_KINDS.get(name)
        if expected is not None:
            assert (out.kind, out.retryable) == expected, name
        else:  # private classes resolve through their bases
            assert out.kind in {kind for kind, _ in _ERROR_KINDS.values()}, name


# --- construction, environment, lifetime -----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"model": ""}, {"timeout_s": 0}, {"max_tokens": 0}, {"temperature": -1.0}],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"model": "gpt-test", "api_key": "k", **kwargs}
    with pytest.raises(ConfigError):
        OpenAIModel(args.pop("model"), **args)


# --- end to end through Loop -----------------------------------------------------------------


async def test_loop_runs_a_tool_call_then_an_answer(fake: FakeOpenAIServer) -> None:
    fake.script(
        completion(tool_calls=[tool_call("add", '{"a": 2, "b": 3}', id="call_1")], id="cmpl-a"),
        completion("2 + 3 = 5", id="cmpl-b", usage=(120, 8)),
    )
    async with OpenAIModel("gpt-test", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert result.stop_reason is StopReason.agent_finished
    assert result.final_answer == "2 + 3 = 5"
    assert [s.llm_call_id for s in result.steps] == ["cmpl-a", "cmpl-b"]
    assert result.steps[0].observation == "5"
    assert result.usage == Usage(82 + 120, 17 + 8, cached_tokens=0, reasoning_tokens=0)
    first, second = (r.body for r in fake.requests)
    assert first["parallel_tool_calls"] is False
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    assert second["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


async def test_a_tool_round_trip_passes_a_server_as_strict_as_llama_cpp_python() -> None:
    with FakeOpenAIServer(strict=True) as fake:
        fake.script(
            completion(
                tool_calls=[tool_call("add", '{"a": 2, "b": 3}', id="call_1")],
                reasoning_content="2 plus 3, use the tool",
                id="cmpl-a",
            ),
            completion("2 + 3 = 5", id="cmpl-b"),
        )
        async with OpenAIModel("gpt-test", base_url=fake.url) as model:
            result = await Loop(model, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert (result.stop_reason, result.stop_detail) == (StopReason.agent_finished, None)
    assert result.final_answer == "2 + 3 = 5"
    assert result.steps[0].reasoning_chars == len("2 plus 3, use the tool")
    first, second = (r.body for r in fake.requests)
    assert strict_violation(first) is strict_violation(second) is None
    # The reasoning is recorded in the step, never sent back: a server may refuse the field.
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        ({"role": "assistant", "content": None, "tool_calls": [ADD_CALL]}, True),
        ({"role": "assistant", "content": "", "tool_calls": [ADD_CALL]}, False),
        ({"role": "assistant", "tool_calls": [ADD_CALL]}, False),
        ({"role": "assistant", "content": "", "reasoning_content": "hm"}, False),  # ignored
        ({"role": "tool", "content": "5"}, True),  # no tool_call_id
        ({"role": "tool", "tool_call_id": "call_1", "content": None}, False),
        ({"role": "user", "content": [{"type": "text", "text": "hi"}]}, False),
        ({"role": "user", "content": [{"type": "audio"}]}, True),
        ({"role": "developer", "content": "be brief"}, True),
    ],
)
async def test_the_strict_server_refuses_what_llama_cpp_python_refuses_with_http_500(
    message: dict[str, Any], refused: bool
) -> None:
    with FakeOpenAIServer(strict=True) as fake:
        fake.script(completion("ok"))
        async with OpenAIModel("gpt-test", base_url=fake.url) as model:
            client: Any = model.client
            call = client.chat.completions.create(model="gpt-test", messages=[message])
            if refused:
                with pytest.raises(openai.InternalServerError, match=r"messages\.0"):
                    await call
            else:
                assert (await call).choices[0].message.content == "ok"
        assert fake.remaining == (1 if refused else 0)  # a refused request uses no reply


async def test_loop_retries_a_rate_limit_after_the_servers_retry_after(
    fake: FakeOpenAIServer,
) -> None:
    fake.script(rate_limited("2"), completion("done", id="cmpl-ok"))
    clock = FakeClock()
    async with OpenAIModel("gpt-test", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=clock).run("go")
    assert result.stop_reason is StopReason.agent_finished
    assert [s.llm_call_id for s in result.steps] == ["cmpl-ok"]
    assert clock.sleeps == [2.0]  # the default backoff (~0.5 s) raised to Retry-After
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
    async with OpenAIModel("gpt-test", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("go")
    assert result.stop_reason is StopReason.llm_error  # never context_overflow
    assert result.stop_detail is not None
    assert f"kind={kind}, retryable=False, attempts=1" in result.stop_detail
    assert [s.llm_call_id for s in result.steps] == [None]
    assert len(fake.requests) == 1
