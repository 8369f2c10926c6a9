"""GeminiModel, driven through the real google-genai SDK against a scripted server on 127.0.0.1."""

from __future__ import annotations

import base64
import copy
import dataclasses
import os
import re
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
    Usage,
)
from polyloop.models.gemini import _ERROR_KINDS, GeminiModel, _translate
from polyloop.testing import FakeClock
from tests.fakes.gemini_server import (
    FakeGeminiServer,
    Reply,
    api_key_invalid,
    blocked,
    context_too_long,
    dropped,
    error,
    function_call,
    generated,
    hang,
    rate_limited,
    text,
)
from tests.fakes.providers import adder, free_port

genai = pytest.importorskip("google.genai")

INSTALL_HINT = "the Gemini adapter needs the google-genai package: pip install 'polyloop[gemini]'"
KEY = "gm-test-key-0123"
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
GENERATE = "/models/gemini-test:generateContent"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in list(os.environ):
        if var.startswith(("GOOGLE_", "GEMINI_")):
            monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeGeminiServer]:
    with FakeGeminiServer() as server:
        yield server


@pytest.fixture
async def model(fake: FakeGeminiServer) -> AsyncIterator[GeminiModel]:
    async with GeminiModel("gemini-test", base_url=fake.url, api_key=KEY, timeout_s=5) as m:
        yield m


def request(
    messages: Sequence[dict[str, Any]] | None = None, tools: Sequence[dict[str, Any]] = ()
) -> ModelRequest:
    return ModelRequest(
        "run-1", 0, 1, messages or [{"role": "user", "content": "What is 2+3?"}], tools
    )


def camel(value: Any) -> Any:
    """``value`` with every key in lowerCamelCase: Google's JSON parser takes proto field
    names either way, and the SDK sends some nested fields (its own choice) in snake_case."""
    if isinstance(value, dict):
        return {
            re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): camel(v) for k, v in value.items()
        }
    if isinstance(value, list):
        return [camel(v) for v in value]
    return value


def body_of(fake: FakeGeminiServer, n: int = 0) -> dict[str, Any]:
    got = fake.requests[n]
    assert got.path.endswith(GENERATE)
    result: dict[str, Any] = camel(got.body)
    return result


ADD_DECLARATION = {
    "name": "add",
    "description": "Add two numbers.",
    "parametersJsonSchema": ADD_SPEC["function"]["parameters"],  # type: ignore[index]
}


# --- the request -----------------------------------------------------------------------------


async def test_request_has_the_system_instruction_tools_tool_config_and_thinking(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    fake.script(generated(text("5")))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    await model.complete(request(messages, [ADD_SPEC]))
    got = fake.requests[0]
    assert got.headers["x-goog-api-key"] == KEY
    body = body_of(fake)
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    assert body["contents"] == [{"role": "user", "parts": [{"text": "2+3?"}]}]
    assert body["tools"] == [{"functionDeclarations": [ADD_DECLARATION]}]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}
    assert body["generationConfig"] == {"thinkingConfig": {"includeThoughts": True}}


async def test_request_without_tools_or_system_leaves_them_out(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    fake.script(generated(text("hi")))
    await model.complete(request())
    body = body_of(fake)
    assert not {"tools", "toolConfig", "systemInstruction"} & set(body)


async def test_tool_choice_none_sends_the_tools_and_forbids_calling_them(
    fake: FakeGeminiServer,
) -> None:
    fake.script(generated(text("best guess")), generated(text("again")))
    async with GeminiModel(
        "gemini-test", base_url=fake.url, api_key=KEY, function_calling_mode="ANY"
    ) as m:
        await m.complete(dataclasses.replace(request(tools=[ADD_SPEC]), tool_choice="none"))
        await m.complete(request(tools=[ADD_SPEC]))  # the adapter's own mode again after it
    body = body_of(fake)
    assert body["tools"] == [{"functionDeclarations": [ADD_DECLARATION]}]
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "NONE"}}
    assert body_of(fake, 1)["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


async def test_options_are_sent(fake: FakeGeminiServer) -> None:
    fake.script(generated(text("hi")))
    async with GeminiModel(
        "gemini-test",
        base_url=fake.url,
        api_key=KEY,
        temperature=0.2,
        max_tokens=64,
        include_thoughts=False,
        function_calling_mode="ANY",
    ) as m:
        await m.complete(request(tools=[ADD_SPEC]))
    body = body_of(fake)
    assert body["generationConfig"] == {"temperature": 0.2, "maxOutputTokens": 64}
    assert body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}


async def test_the_conversation_becomes_gemini_contents_and_is_not_mutated(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "add 2 and 3, "}, {"text": "twice"}]},
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [
                {
                    "id": "fc-from-gemini",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                },
                {
                    "id": "gemini_0123",
                    "type": "function",
                    "function": {"name": "add", "arguments": "not json"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "fc-from-gemini", "content": "5"},
        {"role": "tool", "tool_call_id": "gemini_0123", "content": "bad arguments"},
        {"role": "user", "content": "and now?"},
    ]
    before = copy.deepcopy(messages)
    fake.script(generated(text("5")))
    await model.complete(request(messages, [ADD_SPEC]))
    body = body_of(fake)
    skip = base64.b64encode(b"skip_thought_signature_validator").decode()
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "add 2 and 3, twice"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Adding."},
                {
                    "functionCall": {
                        "id": "fc-from-gemini",
                        "name": "add",
                        "args": {"a": 2, "b": 3},
                    },
                    "thoughtSignature": skip,
                },
                {"functionCall": {"name": "add", "args": {}}, "thoughtSignature": skip},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "fc-from-gemini",
                        "name": "add",
                        "response": {"result": "5"},
                    }
                },
                {"functionResponse": {"name": "add", "response": {"result": "bad arguments"}}},
                {"text": "and now?"},
            ],
        },
    ]
    assert messages == before


@pytest.mark.parametrize(
    "failure",
    [error(503, "The model is overloaded.", "UNAVAILABLE"), rate_limited("0s"), dropped()],
    ids=["503", "429", "dropped"],
)
async def test_the_sdk_does_not_retry_on_its_own(
    model: GeminiModel, fake: FakeGeminiServer, failure: Reply
) -> None:
    fake.script(failure, generated(text("never reached")))
    with pytest.raises(ModelCallError):
        await model.complete(request())
    assert len(fake.requests) == 1  # neither a status retry nor a transport retry
    assert fake.remaining == 1


# --- the reply -------------------------------------------------------------------------------


async def test_a_function_call_reply_with_thoughts_and_usage(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    fake.script(
        generated(
            text("The user wants a sum.", thought=True),
            function_call("add", {"a": 2, "b": 3}, id="fc-1"),
            response_id="resp-9",
        )
    )
    reply = await model.complete(request(tools=[ADD_SPEC]))
    (call,) = reply.tool_calls
    assert (call.name, dict(call.arguments), call.id) == ("add", {"a": 2, "b": 3}, "fc-1")
    assert (reply.text, reply.reasoning) == ("", "The user wants a sum.")
    assert reply.call_id == "resp-9"
    # Thoughts are counted beside the candidates by Gemini and billed as output: output is
    # both, reasoning the thoughts; the cached content is a part of the prompt.
    assert reply.usage == Usage(82, 17 + 5, cached_tokens=40, reasoning_tokens=5)
    assert reply.model == "gemini-test-001"  # modelVersion


async def test_a_function_call_without_an_id_gets_one_of_ours(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    fake.script(generated(function_call("add", {"a": 1, "b": 1})))
    (call,) = (await model.complete(request(tools=[ADD_SPEC]))).tool_calls
    assert call.id is not None and re.fullmatch(r"gemini_[0-9a-f]{32}", call.id)


async def test_a_text_reply_without_usage_or_response_id(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    fake.script(generated(text("The answer "), text("is 5."), usage={}, response_id=None))
    reply = await model.complete(request())
    assert (reply.text, reply.reasoning, reply.tool_calls) == ("The answer is 5.", None, ())
    assert (reply.usage, reply.call_id) == (None, None)


async def test_the_thought_signature_of_a_call_is_sent_back_with_it(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    fake.script(
        generated(function_call("add", {"a": 2, "b": 3}, signature=b"\x01opaque-signature")),
        generated(text("5")),
    )
    (call,) = (await model.complete(request(tools=[ADD_SPEC]))).tool_calls
    assert call.id is not None
    history = [
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "5"},
    ]
    await model.complete(request(history, [ADD_SPEC]))
    model_turn = body_of(fake, 1)["contents"][1]
    assert model_turn == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "add", "args": {"a": 2, "b": 3}},
                "thoughtSignature": base64.b64encode(b"\x01opaque-signature").decode(),
            }
        ],
    }


# --- errors ----------------------------------------------------------------------------------

ERROR_CASES: list[tuple[str, Reply, str, bool, float | None]] = [
    ("429 RetryInfo", rate_limited("20s"), "rate_limit", True, 20.0),
    ("429 fractional RetryInfo", rate_limited("1.5s"), "rate_limit", True, 1.5),
    ("429 Retry-After wins", rate_limited("20s", retry_after="3"), "rate_limit", True, 3.0),
    ("429 no delay", rate_limited(None), "rate_limit", True, None),
    ("504", error(504, "Deadline exceeded.", "DEADLINE_EXCEEDED"), "server", True, None),
    ("400 API_KEY_INVALID", api_key_invalid(), "auth", False, None),
    (
        "400 precondition",
        error(400, "User location is not supported for the API use.", "FAILED_PRECONDITION"),
        "bad_request",
        False,
        None,
    ),
    ("203 not 200", error(203, "Non-authoritative", "UNKNOWN"), "error", False, None),
    (
        "not an object",
        Reply(body=b'"just a string"'),
        "bad_response",
        True,
        None,
    ),
    (
        "malformed function call",
        generated(finish_reason="MALFORMED_FUNCTION_CALL"),
        "bad_response",
        True,
        None,
    ),
    ("prompt blocked", blocked("SAFETY"), "content_filter", False, None),
]


@pytest.mark.parametrize(
    ("reply", "kind", "retryable", "retry_after"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
async def test_failures_become_model_call_errors_with_a_kind(
    model: GeminiModel,
    fake: FakeGeminiServer,
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
    assert fake.url in err.message and "gemini-test" in err.message
    assert "\n" not in err.message
    assert len(fake.requests) == 1


@pytest.mark.parametrize(
    ("reply", "cls"),
    [
        (error(203, "Non-authoritative", "UNKNOWN"), "APIError"),
        (error(400, "Bad", "INVALID_ARGUMENT"), "ClientError"),
        (error(500, "Internal", "INTERNAL"), "ServerError"),
    ],
)
async def test_the_sdks_http_errors_are_the_cause(
    model: GeminiModel, fake: FakeGeminiServer, reply: Reply, cls: str
) -> None:
    fake.script(reply)
    with pytest.raises(ModelCallError) as info:
        await model.complete(request())
    assert type(info.value.__cause__) is getattr(genai.errors, cls)


@pytest.fixture(params=["httpx", "aiohttp"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The HTTP client google-genai runs on: httpx (its fork httpx2, as installed with it),
    and aiohttp, which it prefers when that is installed (skipped where it is not)."""
    if request.param == "aiohttp":
        pytest.importorskip("aiohttp")
    else:
        monkeypatch.setattr(genai._api_client, "has_aiohttp", False)
    return str(request.param)


def top_module(cls: type) -> str:
    return cls.__module__.partition(".")[0]


async def test_a_call_that_takes_too_long_is_a_retryable_timeout(
    fake: FakeGeminiServer, transport: str
) -> None:
    fake.script(hang())
    async with GeminiModel("gemini-test", base_url=fake.url, api_key=KEY, timeout_s=0.2) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == ("timeout", True)
    cause = type(info.value.__cause__)  # the transport's own exception, passed through
    if transport == "httpx":
        assert top_module(cause) in ("httpx", "httpx2")
        assert "TimeoutException" in [c.__name__ for c in cause.__mro__]
    else:  # aiohttp's total timeout is the built-in TimeoutError
        assert issubclass(cause, TimeoutError)


async def test_an_unreachable_server_is_a_retryable_connection_error(transport: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with GeminiModel("gemini-test", base_url=url, api_key=KEY) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    expected = ("aiohttp",) if transport == "aiohttp" else ("httpx", "httpx2")
    assert top_module(type(info.value.__cause__)) in expected
    assert "ConnectError" in info.value.message or "ClientConnectorError" in info.value.message


async def test_a_response_cut_off_mid_body_is_a_retryable_connection_error(
    fake: FakeGeminiServer, transport: str
) -> None:
    fake.script(dropped())
    async with GeminiModel("gemini-test", base_url=fake.url, api_key=KEY) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == ("connection", True)
    expected = ("aiohttp",) if transport == "aiohttp" else ("httpx", "httpx2")
    assert top_module(type(info.value.__cause__)) in expected


def test_exceptions_that_are_neither_the_sdks_nor_its_transports_are_not_translated() -> None:
    assert _translate(RuntimeError("a bug"), genai.errors, "here") is None
    assert _translate(ValueError("x"), genai.errors, "here") is None


def _public_sdk_errors() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(genai.errors).items()
        if isinstance(obj, type)
        and issubclass(obj, Exception)
        and not issubclass(obj, Warning)
        and obj.__module__ == genai.errors.__name__
    }


def test_every_exception_class_the_sdk_exports_has_an_explicit_kind() -> None:
    exported = {name for name in _public_sdk_errors() if not name.startswith("_")}
    assert {"APIError", "ClientError", "ServerError"} <= exported  # the scan itself works
    missing = sorted(exported - set(_ERROR_KINDS))
    assert not missing, f"decide a kind for these google.genai.errors classes: {missing}"


@pytest.mark.parametrize("name", sorted(_public_sdk_errors()))
def test_every_sdk_exception_class_translates_even_with_missing_attributes(name: str) -> None:
    cls = _public_sdk_errors()[name]
    exc = cls.__new__(cls)  # no code/response/details: the translation must not care
    Exception.__init__(exc, f"boom from {name}")
    out = _translate(exc, genai.errors, "http://x (model 'm')")  # type: ignore[arg-type]
    assert isinstance(out, ModelCallError)
    assert (out.kind, out.retryable) == _ERROR_KINDS[name]
    assert "boom from" in out.message


# --- construction, environment, lifetime -----------------------------------------------------


@pytest.mark.parametrize(
    ("env", "sent"),
    [
        ({"GEMINI_API_KEY": "gm-gemini-env"}, "gm-gemini-env"),
        ({"GOOGLE_API_KEY": "gm-google-env"}, "gm-google-env"),
        ({"GOOGLE_API_KEY": "gm-google-env", "GEMINI_API_KEY": "gm-gemini-env"}, "gm-google-env"),
    ],
)
async def test_the_key_comes_from_the_environment_as_the_sdk_reads_it(
    fake: FakeGeminiServer, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], sent: str
) -> None:
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    fake.script(generated(text("hi")))
    async with GeminiModel("gemini-test", base_url=fake.url) as m:
        monkeypatch.setenv("GOOGLE_API_KEY", "gm-changed-later")
        await m.complete(request())
    assert fake.requests[0].headers["x-goog-api-key"] == sent


async def test_the_argument_wins_over_the_environment(
    fake: FakeGeminiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", "gm-env")
    fake.script(generated(text("hi")))
    async with GeminiModel("gemini-test", base_url=fake.url, api_key="gm-arg") as m:
        await m.complete(request())
    assert fake.requests[0].headers["x-goog-api-key"] == "gm-arg"


def test_no_key_is_a_config_error_naming_the_variables() -> None:
    with pytest.raises(ConfigError, match="GEMINI_API_KEY") as info:
        GeminiModel("gemini-test")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"model": ""}, {"timeout_s": 0}, {"max_tokens": 0}, {"temperature": -1.0}],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"model": "gemini-test", "api_key": KEY, **kwargs}
    with pytest.raises(ConfigError):
        GeminiModel(args.pop("model"), **args)


async def test_aclose_is_idempotent(fake: FakeGeminiServer) -> None:
    m = GeminiModel("gemini-test", base_url=fake.url, api_key=KEY)
    await m.aclose()
    await m.aclose()


@pytest.mark.parametrize("absent", ["google.genai", "google"])
def test_constructing_without_the_sdk_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, absent: str
) -> None:
    monkeypatch.delitem(sys.modules, "google.genai", raising=False)
    monkeypatch.setitem(sys.modules, absent, None)
    with pytest.raises(ImportError) as info:
        GeminiModel("gemini-test", api_key=KEY)
    assert str(info.value) == INSTALL_HINT


# --- end to end through Loop -----------------------------------------------------------------


async def test_loop_runs_a_function_call_then_an_answer(fake: FakeGeminiServer) -> None:
    fake.script(
        generated(
            text("Use the tool.", thought=True),
            function_call("add", {"a": 2, "b": 3}, signature=b"sig-a"),
            response_id="resp-a",
        ),
        generated(
            text("2 + 3 = 5"),
            response_id="resp-b",
            usage={"promptTokenCount": 120, "candidatesTokenCount": 8},
        ),
    )
    async with GeminiModel("gemini-test", base_url=fake.url, api_key=KEY) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert (result.stop_reason, result.stop_detail) == (StopReason.agent_finished, None)
    assert result.final_answer == "2 + 3 = 5"
    assert [s.llm_call_id for s in result.steps] == ["resp-a", "resp-b"]
    assert result.steps[0].observation == "5"
    assert result.steps[0].reasoning_chars == len("Use the tool.")
    assert result.usage == Usage(82 + 120, 17 + 5 + 8, cached_tokens=40, reasoning_tokens=5)
    first, second = body_of(fake, 0), body_of(fake, 1)
    assert [d["name"] for d in first["tools"][0]["functionDeclarations"]] == ["add"]
    assert second["contents"][-2:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"name": "add", "args": {"a": 2, "b": 3}},
                    "thoughtSignature": base64.b64encode(b"sig-a").decode(),
                }
            ],
        },
        {
            "role": "user",
            "parts": [{"functionResponse": {"name": "add", "response": {"result": "5"}}}],
        },
    ]


async def test_loop_retries_a_rate_limit_after_the_servers_retry_delay(
    fake: FakeGeminiServer,
) -> None:
    fake.script(rate_limited("2s"), generated(text("done"), response_id="resp-ok"))
    clock = FakeClock()
    async with GeminiModel("gemini-test", base_url=fake.url, api_key=KEY) as model:
        result = await Loop(model, tools=adder(), clock=clock).run("go")
    assert result.stop_reason is StopReason.agent_finished
    assert [s.llm_call_id for s in result.steps] == ["resp-ok"]
    assert clock.sleeps == [2.0]  # the default backoff (~0.5 s) raised to retryDelay
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("reply", "kind"),
    [(api_key_invalid(), "auth"), (context_too_long(), "context_length")],
    ids=["auth", "context_length"],
)
async def test_loop_ends_llm_error_on_a_non_retryable_failure(
    fake: FakeGeminiServer, reply: Reply, kind: str
) -> None:
    fake.script(reply)
    async with GeminiModel("gemini-test", base_url=fake.url, api_key=KEY) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("go")
    assert result.stop_reason is StopReason.llm_error
    assert result.stop_detail is not None
    assert f"kind={kind}, retryable=False, attempts=1" in result.stop_detail
    assert len(fake.requests) == 1


# --- the command line ------------------------------------------------------------------------


def test_the_cli_runs_gemini_models(fake: FakeGeminiServer, tmp_path: Path) -> None:
    pytest.importorskip("typer")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "note.txt").write_text("42\n")
    fake.script(
        generated(function_call("read_file", {"path": "note.txt"}, id="fc-read")),
        generated(text("The note says 42.")),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "GEMINI_"))}
    env["GEMINI_API_KEY"] = KEY
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    argv = [sys.executable, "-m", "polyloop.cli", "run", "read the note"]
    argv += ["--model", "gemini:gemini-test", "--base-url", fake.url]
    argv += ["--workspace", str(workspace), "--journal", str(tmp_path / "j.db")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopped: agent_finished" in done.stdout
    assert [r.headers["x-goog-api-key"] for r in fake.requests] == [KEY, KEY]
    response = body_of(fake, 1)["contents"][-1]["parts"][0]["functionResponse"]
    assert (response["id"], response["name"], response["response"]) == (
        "fc-read",
        "read_file",
        {"result": "42\n"},
    )

    del env["GEMINI_API_KEY"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "GEMINI_API_KEY" in done.stderr and len(done.stderr.strip().splitlines()) == 1


async def test_empty_user_text_sends_no_empty_text_part(
    model: GeminiModel, fake: FakeGeminiServer
) -> None:
    # Gemini refuses a request with an empty text part ("empty text parameter").
    fake.script(generated(text("ok")))
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "2+3?"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        {"role": "user", "content": [{"type": "text", "text": ""}]},
    ]
    await model.complete(request(messages, [ADD_SPEC]))
    contents = body_of(fake)["contents"]
    assert contents[0] == {"role": "user", "parts": [{"text": "2+3?"}]}
    assert [p for c in contents for p in c["parts"] if "text" in p] == [{"text": "2+3?"}]
    assert contents[-1]["role"] == "user"
    assert contents[-1]["parts"][0]["functionResponse"]["response"] == {"result": ""}
