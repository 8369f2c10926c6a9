"""AnthropicModel, driven through the real anthropic SDK against a scripted server on 127.0.0.1."""

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
from polyloop.models.anthropic import (
    _ERROR_KINDS,
    AnthropicModel,
    _translate,
)
from polyloop.testing import FakeClock
from tests.fakes._server import then
from tests.fakes.anthropic_server import (
    FakeAnthropicServer,
    Reply,
    dropped_connection,
    error,
    error_event,
    message,
    message_stream,
    rate_limited,
    redacted_thinking,
    text,
    thinking,
    tool_use,
)
from tests.fakes.providers import adder

anthropic = pytest.importorskip("anthropic")

INSTALL_HINT = (
    "the Anthropic adapter needs the anthropic package: pip install 'polyloop[anthropic]'"
)
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
ADD_TOOL = {
    "name": "add",
    "description": "Add two numbers.",
    "input_schema": ADD_SPEC["function"]["parameters"],  # type: ignore[index]
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_PROFILE",
        "ANTHROPIC_CONFIG_DIR",
        "ANTHROPIC_CUSTOM_HEADERS",
        "ANTHROPIC_IDENTITY_TOKEN",
        "ANTHROPIC_IDENTITY_TOKEN_FILE",
        "ANTHROPIC_FEDERATION_RULE_ID",
        "ANTHROPIC_ORGANIZATION_ID",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer() as server:
        yield server


@pytest.fixture
async def model(fake: FakeAnthropicServer) -> AsyncIterator[AnthropicModel]:
    async with AnthropicModel(
        "claude-test", base_url=fake.url, api_key="sk-ant-test", timeout_s=5
    ) as m:
        yield m


def request(
    messages: Sequence[dict[str, Any]] | None = None, tools: Sequence[dict[str, Any]] = ()
) -> ModelRequest:
    return ModelRequest(
        "run-1", 0, 1, messages or [{"role": "user", "content": "What is 2+3?"}], tools
    )


# --- the request -----------------------------------------------------------------------------


async def test_request_with_tools_has_the_messages_api_shape(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    fake.script(message(text("5")))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    await model.complete(request(messages, [ADD_SPEC]))
    (got,) = fake.requests
    assert got.path == "/v1/messages"
    assert got.headers["authorization"] == "Bearer sk-ant-test"
    assert got.headers["anthropic-version"]
    assert got.body["model"] == "claude-test"
    assert got.body["max_tokens"] == 4096
    assert got.body["system"] == "Be brief."
    assert got.body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "2+3?"}]}]
    assert got.body["tools"] == [ADD_TOOL]
    assert got.body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert "thinking" not in got.body
    assert got.body.get("stream") in (None, False)


async def test_request_without_tools_leaves_tools_and_tool_choice_out(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    fake.script(message(text("hi")))
    await model.complete(request())
    body = fake.requests[0].body
    assert "tools" not in body and "tool_choice" not in body and "system" not in body


async def test_tool_choice_none_sends_the_tools_and_forbids_calling_them(
    fake: FakeAnthropicServer,
) -> None:
    # The wrap-up call: the definitions stay (the Messages API refuses tool_use blocks in a
    # conversation without them), the choice is "none" whatever the adapter's own.
    fake.script(message(text("best guess")))
    async with AnthropicModel(
        "claude-test", base_url=fake.url, api_key="k", tool_choice="required"
    ) as m:
        await m.complete(dataclasses.replace(request(tools=[ADD_SPEC]), tool_choice="none"))
    body = fake.requests[0].body
    assert body["tools"] == [ADD_TOOL] and body["tool_choice"] == {"type": "none"}


async def test_options_are_sent_and_extra_body_is_merged(fake: FakeAnthropicServer) -> None:
    fake.script(message(text("hi")))
    async with AnthropicModel(
        "claude-test",
        base_url=fake.url,
        api_key="k",
        max_tokens=2048,
        thinking_budget=1024,
        tool_choice="required",
        extra_body={"temperature": 0.2, "top_k": 5},
    ) as m:
        await m.complete(request(tools=[ADD_SPEC]))
    body = fake.requests[0].body
    assert (body["temperature"], body["max_tokens"], body["top_k"]) == (0.2, 2048, 5)
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}


ADD_CALL = {
    "id": "toolu_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
}


async def test_the_openai_format_conversation_is_converted_and_not_mutated(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
        {"role": "user", "content": "add 2 and 3, then 1 and 1"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [ADD_CALL]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
        {"role": "user", "content": "note: the second next"},
        {"role": "assistant", "content": "", "tool_calls": [{**ADD_CALL, "id": "toolu_2"}]},
        {"role": "tool", "tool_call_id": "toolu_2", "content": ""},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    **ADD_CALL,
                    "id": "toolu_3",
                    "function": {"name": "add", "arguments": '{"a": 2, "b"'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_3", "content": "arguments are not JSON"},
    ]
    before = copy.deepcopy(messages)
    fake.script(message(text("2")))
    await model.complete(request(messages, [ADD_SPEC]))
    body = fake.requests[0].body
    assert body["system"] == "Be brief.\n\nUse tools."
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "add 2 and 3, then 1 and 1"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"},
                {"type": "text", "text": "note: the second next"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {"a": 2, "b": 3}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": ""},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_3", "name": "add", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_3",
                    "content": "arguments are not JSON",
                }
            ],
        },
    ]
    assert messages == before


@pytest.mark.parametrize(
    "bad",
    [
        {"role": "critic", "content": "hm"},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]},
    ],
)
async def test_a_message_that_cannot_be_converted_is_a_bad_request_not_sent(
    model: AnthropicModel, fake: FakeAnthropicServer, bad: dict[str, Any]
) -> None:
    with pytest.raises(ModelCallError) as info:
        await model.complete(request([{"role": "user", "content": "hi"}, bad]))
    assert (info.value.kind, info.value.retryable) == ("bad_request", False)
    assert "\n" not in info.value.message
    assert fake.requests == []


# --- the reply -------------------------------------------------------------------------------


async def test_a_tool_use_reply_becomes_a_tool_call_with_its_id_and_input(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    fake.script(
        message(
            text("I'll add them."),
            tool_use("add", {"a": 2, "b": 3}, id="toolu_abc"),
            id="msg_9",
            usage={
                "input_tokens": 20,
                "cache_read_input_tokens": 50,
                "cache_creation_input_tokens": 12,
                "output_tokens": 17,
            },
            model="claude-test-20250929",
        )
    )
    reply = await model.complete(request(tools=[ADD_SPEC]))
    assert reply.tool_calls == (ToolCall("add", {"a": 2, "b": 3}, "toolu_abc"),)
    assert reply.text == "I'll add them."
    assert reply.call_id == "msg_9"
    # Cached input counts as input; the cache reads are the cached part of it. No thinking
    # tokens reported: reasoning_tokens None.
    assert reply.usage == Usage(20 + 50 + 12, 17, cached_tokens=50, reasoning_tokens=None)
    assert reply.model == "claude-test-20250929"
    assert reply.reasoning is None


async def test_thinking_blocks_become_the_reasoning(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    fake.script(message(thinking("2 plus 3"), redacted_thinking(), thinking("is 5"), text("5")))
    reply = await model.complete(request())
    assert (reply.text, reply.reasoning) == ("5", "2 plus 3\n\nis 5")


async def test_several_text_blocks_are_joined_and_a_reply_without_id_has_call_id_none(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    fake.script(message(text("The answer "), text("is 5."), id=None, stop_reason="max_tokens"))
    reply = await model.complete(request())
    assert (reply.text, reply.call_id, reply.tool_calls) == ("The answer is 5.", None, ())


# --- errors: one case per exception class the SDK exports -------------------------------------

# name -> (how the server provokes it, kind, retryable, retry_after)
HTTP_CASES: dict[str, tuple[Reply, str, bool, float | None]] = {
    "BadRequestError": (error(400, "messages: roles must alternate"), "bad_request", False, None),
    "AuthenticationError": (error(401, "invalid x-api-key"), "auth", False, None),
    "PaymentRequiredError": (
        error(402, "Your credit balance is too low"),
        "permission",
        False,
        None,
    ),
    "PermissionDeniedError": (
        error(403, "Your API key does not have permission"),
        "permission",
        False,
        None,
    ),
    "NotFoundError": (error(404, "model: claude-nope"), "not_found", False, None),
    "RequestTimeoutError": (error(408, "Request timed out"), "timeout", True, None),
    "ConflictError": (error(409, "Conflict"), "conflict", True, None),
    "PreconditionFailedError": (error(412, "Precondition failed"), "bad_request", False, None),
    "ContentTooLargeError": (
        error(413, "Request exceeds the maximum size"),
        "bad_request",
        False,
        None,
    ),
    "UnprocessableEntityError": (error(422, "Unprocessable"), "bad_request", False, None),
    "RateLimitError": (rate_limited("2"), "rate_limit", True, 2.0),
    "RequestHeaderFieldsTooLargeError": (
        error(431, "Headers too large"),
        "bad_request",
        False,
        None,
    ),
    "ClientClosedRequestError": (error(499, "Client closed request"), "connection", True, None),
    "InternalServerError": (error(500, "Internal server error"), "server", True, None),
    "HTTPNotImplementedError": (error(501, "Not implemented"), "error", False, None),
    "ServiceUnavailableError": (
        error(503, "Service unavailable", headers=(("retry-after", "7"),)),
        "server",
        True,
        7.0,
    ),
    "GatewayTimeoutError": (error(504, "Gateway timeout"), "server", True, None),
    "OverloadedError": (error(529, "Overloaded"), "server", True, None),
    "APIStatusError": (error(418, "I'm a teapot"), "error", False, None),
    "APIConnectionError": (dropped_connection(), "connection", True, None),
}
# Classes the SDK picks by status and error.details.error_code.
CODED: dict[str, tuple[int, str, str, bool]] = {
    "LinkedOrganizationBillingUnavailableError": (
        402,
        "linked_organization_billing_unavailable",
        "permission",
        False,
    ),
    "LinkedOrganizationSpendLimitReachedError": (
        402,
        "linked_organization_spend_limit_reached",
        "permission",
        False,
    ),
    "SandboxEgressRestrictedError": (403, "sandbox_egress_restricted", "permission", False),
    "RequestBodyTooLargeAfterDecodingError": (
        413,
        "request_body_too_large_after_decoding",
        "bad_request",
        False,
    ),
    "RampLimitExceededError": (429, "ramp_limit_exceeded", "rate_limit", True),
    "ContractSpendLimitReachedError": (429, "contract_spend_limit_reached", "permission", False),
    "EnforcedSpendLimitReachedError": (429, "enforced_spend_limit_reached", "permission", False),
    "CMEKContextUnavailableError": (503, "cmek_context_unavailable", "server", True),
    "CMEKKeyUnreachableError": (503, "cmek_key_unreachable", "server", True),
    "StorageNotReadyError": (503, "storage_not_ready", "server", True),
    "CMEKKeyDisabledError": (400, "cmek_key_disabled", "permission", False),
    "CMEKKeyNetworkBlockedError": (400, "cmek_key_network_blocked", "permission", False),
    "ClaudeCodeKeyCreatorNotMemberError": (
        400,
        "claude_code_key_creator_not_member",
        "permission",
        False,
    ),
    "ClaudeCodeVersionTooOldError": (400, "claude_code_version_too_old", "bad_request", False),
    "OrganizationOnHoldError": (400, "organization_on_hold", "permission", False),
    "OrganizationTypeNotSupportedError": (
        400,
        "organization_type_not_supported",
        "permission",
        False,
    ),
    "ParentOrganizationRequiredError": (400, "parent_organization_required", "permission", False),
    "RequestBodyEncodingInvalidError": (400, "request_body_encoding_invalid", "bad_request", False),
    "RequestBodyEncodingUnsupportedError": (
        400,
        "request_body_encoding_unsupported",
        "bad_request",
        False,
    ),
    "WorkspaceHumanReviewDisabledError": (
        400,
        "workspace_human_review_disabled",
        "permission",
        False,
    ),
}
for _name, (_status, _code, _kind, _retryable) in CODED.items():
    HTTP_CASES[_name] = (
        error(_status, f"refused: {_code}", error_code=_code),
        _kind,
        _retryable,
        None,
    )
# Names the SDK exports for another class (deprecated aliases): the class's own case covers it.
ALIASES = {
    "RequestTooLargeError": "ContentTooLargeError",
    "DeadlineExceededError": "GatewayTimeoutError",
}
# Raised outside an HTTP exchange with /v1/messages: each is tested by the test named here.
ELSEWHERE = {
    "APITimeoutError": "test_a_call_that_takes_too_long_is_a_retryable_timeout",
    "APIResponseValidationError": "test_a_strict_client_s_validation_error_is_a_bad_response",
    "AnthropicError": "test_errors_raised_outside_a_response_translate_to_their_kind",
    "APIError": "test_errors_raised_outside_a_response_translate_to_their_kind",
    "APIWebhookValidationError": "test_errors_raised_outside_a_response_translate_to_their_kind",
    "RetryableError": "test_errors_raised_outside_a_response_translate_to_their_kind",
    "CredentialsError": "test_errors_raised_outside_a_response_translate_to_their_kind",
    "IdentityTokenFileError": "test_errors_raised_outside_a_response_translate_to_their_kind",
    "WorkloadIdentityError": "test_errors_raised_outside_a_response_translate_to_their_kind",
}


def _public_sdk_errors() -> dict[str, type[Exception]]:
    return {
        name: obj
        for name, obj in list(vars(anthropic).items())
        if not name.startswith("_")
        and issubclass(type(obj), type)
        and issubclass(obj, anthropic.AnthropicError)
    }


def test_every_exception_class_the_sdk_exports_has_a_kind_and_a_test() -> None:
    exported = set(_public_sdk_errors())
    assert "OverloadedError" in exported  # the scan itself works
    missing = sorted(exported - set(_ERROR_KINDS))
    assert not missing, f"decide a kind for these anthropic exceptions: {missing}"
    untested = sorted(exported - set(HTTP_CASES) - set(ALIASES) - set(ELSEWHERE))
    assert not untested, f"add a test case for these anthropic exceptions: {untested}"
    for alias, name in ALIASES.items():
        assert getattr(anthropic, alias) is getattr(anthropic, name)
        assert _ERROR_KINDS[alias] == _ERROR_KINDS[name]


@pytest.mark.parametrize(
    ("name", "reply", "kind", "retryable", "retry_after"),
    [(name, *case) for name, case in HTTP_CASES.items()],
    ids=list(HTTP_CASES),
)
async def test_each_sdk_exception_becomes_a_model_call_error_with_its_kind(
    model: AnthropicModel,
    fake: FakeAnthropicServer,
    name: str,
    reply: Reply,
    kind: str,
    retryable: bool,
    retry_after: float | None,
) -> None:
    fake.script(reply)
    with pytest.raises(ModelCallError) as info:
        await model.complete(request())
    err = info.value
    assert type(err.__cause__) is getattr(anthropic, name)  # the SDK raised that very class
    assert (err.kind, err.retryable, err.retry_after) == (kind, retryable, retry_after)
    assert fake.url in err.message and "claude-test" in err.message
    assert "\n" not in err.message
    assert len(fake.requests) == 1


BAD_RESPONSES: list[tuple[str, Reply]] = [
    (
        "tool input not an object",
        Reply(
            body=b'{"id": "m", "type": "message", "content": '
            b'[{"type": "tool_use", "id": "t", "name": "add", "input": "2, 3"}]}'
        ),
    ),
]


@pytest.mark.parametrize("reply", [c[1] for c in BAD_RESPONSES], ids=[c[0] for c in BAD_RESPONSES])
async def test_a_200_that_is_not_a_message_is_a_retryable_bad_response(
    model: AnthropicModel, fake: FakeAnthropicServer, reply: Reply
) -> None:
    fake.script(reply)
    with pytest.raises(ModelCallError) as info:
        await model.complete(request())
    assert (info.value.kind, info.value.retryable) == ("bad_response", True)
    assert "\n" not in info.value.message


@pytest.mark.parametrize(
    "wording",
    [
        "prompt is too long: 215000 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 197202 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again",
    ],
)
async def test_a_prompt_too_long_for_the_model_is_context_length(
    model: AnthropicModel, fake: FakeAnthropicServer, wording: str
) -> None:
    fake.script(error(400, wording))
    with pytest.raises(ModelCallError) as info:
        await model.complete(request())
    assert (info.value.kind, info.value.retryable) == ("context_length", False)
    assert isinstance(info.value.__cause__, anthropic.BadRequestError)


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (529, "server", True),  # overloaded_error
        (500, "server", True),  # api_error
        (429, "rate_limit", True),
        (504, "timeout", True),  # timeout_error
        (400, "bad_request", False),
        (413, "bad_request", False),  # request_too_large
        (401, "auth", False),
        (403, "permission", False),
        (402, "permission", False),  # billing_error
        (404, "not_found", False),
    ],
)
async def test_an_error_event_inside_a_stream_is_kind_by_its_error_type(
    fake: FakeAnthropicServer, status: int, kind: str, retryable: bool
) -> None:
    # The stream's response is a 200: the SDK raises the event as an APIStatusError with
    # status 200, so only the event's error type says what it is.
    streamed = message_stream(text("The answer is 5."))
    fake.script(then(streamed, 3, error_event(status, "something went wrong")))
    async with AnthropicModel("claude-test", base_url=fake.url, stream=True) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == (kind, retryable)
    assert isinstance(info.value.__cause__, anthropic.APIStatusError)


async def test_a_prompt_too_long_error_event_is_context_length(fake: FakeAnthropicServer) -> None:
    event = error_event(400, "prompt is too long: 215000 tokens > 200000 maximum")
    fake.script(then(message_stream(text("x")), 1, event))
    async with AnthropicModel("claude-test", base_url=fake.url, stream=True) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == ("context_length", False)


async def test_thinking_tokens_are_the_reasoning_part_of_the_output(
    model: AnthropicModel, fake: FakeAnthropicServer
) -> None:
    usage = {"output_tokens": 300, "output_tokens_details": {"thinking_tokens": 250}}
    fake.script(message(thinking("hm"), text("5"), usage=usage))
    reply = await model.complete(request())
    assert reply.usage == Usage(82, 300, cached_tokens=0, reasoning_tokens=250)


async def test_a_strict_client_s_validation_error_is_a_bad_response(
    fake: FakeAnthropicServer,
) -> None:
    client = anthropic.AsyncAnthropic(
        api_key="k", base_url=fake.url, _strict_response_validation=True
    )
    fake.script(Reply(body=b'{"id": "msg_x", "type": "message", "content": "not blocks"}'))
    async with AnthropicModel("claude-test", client=client) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    await client.close()
    assert (info.value.kind, info.value.retryable) == ("bad_response", True)
    assert type(info.value.__cause__) is anthropic.APIResponseValidationError


def test_errors_raised_outside_a_response_translate_to_their_kind() -> None:
    import httpx2

    req = httpx2.Request("POST", "http://x/v1/messages")
    cases: dict[str, tuple[Exception, str, bool]] = {
        "AnthropicError": (anthropic.AnthropicError("boom"), "error", False),
        "APIError": (anthropic.APIError("boom", req, body=None), "error", False),
        "APIWebhookValidationError": (
            anthropic.APIWebhookValidationError("boom", req, body=None),
            "error",
            False,
        ),
        "RetryableError": (anthropic.RetryableError("boom"), "error", True),
        "CredentialsError": (anthropic.CredentialsError("boom"), "auth", False),
        "IdentityTokenFileError": (anthropic.IdentityTokenFileError("boom"), "auth", False),
        "WorkloadIdentityError": (
            anthropic.WorkloadIdentityError("boom", status_code=400, request_id="req_1"),
            "auth",
            False,
        ),
    }
    assert set(cases) == {n for n, t in ELSEWHERE.items() if t.endswith("to_their_kind")}
    for name, (exc, kind, retryable) in cases.items():
        assert type(exc) is getattr(anthropic, name)
        out = _translate(exc, anthropic, "http://x (model 'm')")
        assert isinstance(out, ModelCallError), name
        assert (out.kind, out.retryable, out.retry_after) == (kind, retryable, None), name
        assert out.message.startswith(f"{name} from http://x (model 'm'): boom"), out.message


class _StubClient:
    """Stands in for an AsyncAnthropic passed as client=: raises ``exc`` from create()."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.base_url = "http://stub"
        self.messages = self

    def with_options(self, **options: Any) -> _StubClient:
        assert options == {"max_retries": 0}
        return self

    async def create(self, **body: Any) -> Any:
        raise self.exc


async def test_exceptions_that_are_not_the_sdks_propagate_unchanged() -> None:
    # The SDK wraps whatever its transport raises in APIConnectionError, so only a client
    # that is not the SDK's can raise something else.
    boom = RuntimeError("a bug in a client wrapper")
    model = AnthropicModel("claude-test", client=_StubClient(boom))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError) as info:
        await model.complete(request())
    assert info.value is boom
    assert _translate(ValueError("x"), anthropic, "here") is None


# --- construction, environment, lifetime -----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": ""},
        {"timeout_s": 0},
        {"max_tokens": 0},
        {"thinking_budget": 4096},  # not below max_tokens
        {"tool_choice": "sometimes"},
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"model": "claude-test", "api_key": "k", **kwargs}
    with pytest.raises(ConfigError):
        AnthropicModel(args.pop("model"), **args)


# --- end to end through Loop -----------------------------------------------------------------


async def test_loop_runs_a_tool_round_trip(fake: FakeAnthropicServer) -> None:
    fake.script(
        message(tool_use("add", {"a": 2, "b": 3}, id="toolu_01"), id="msg_a"),
        message(text("2 + 3 = 5"), id="msg_b", usage={"input_tokens": 120, "output_tokens": 8}),
    )
    async with AnthropicModel("claude-test", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert result.stop_reason is StopReason.agent_finished
    assert result.final_answer == "2 + 3 = 5"
    assert [s.llm_call_id for s in result.steps] == ["msg_a", "msg_b"]
    assert result.steps[0].observation == "5"
    assert result.usage == Usage(82 + 120, 17 + 8, cached_tokens=0)
    first, second = (r.body for r in fake.requests)
    assert [t["name"] for t in first["tools"]] == ["add"]
    assert set(first["tools"][0]) == {"name", "description", "input_schema"}
    assert first["tool_choice"]["disable_parallel_tool_use"] is True
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "5"}],
        },
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_with_thinking_the_signed_blocks_go_back_with_their_tool_use(
    fake: FakeAnthropicServer, stream: bool
) -> None:
    # Streamed, the signature arrives as the thinking block's last delta.
    build = message_stream if stream else message
    fake.script(
        build(
            thinking("2 plus 3, use the tool", signature="sig-1"),
            redacted_thinking("opaque"),
            tool_use("add", {"a": 2, "b": 3}, id="toolu_01"),
        ),
        build(thinking("done"), text("5")),
    )
    async with AnthropicModel(
        "claude-test", base_url=fake.url, max_tokens=4096, thinking_budget=2048, stream=stream
    ) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("What is 2+3?")
    assert result.stop_reason is StopReason.agent_finished
    assert result.steps[0].reasoning_chars == len("2 plus 3, use the tool")
    second = fake.requests[1].body
    assert second["messages"][-2]["content"] == [
        {"type": "thinking", "thinking": "2 plus 3, use the tool", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 2, "b": 3}},
    ]


async def test_loop_retries_a_rate_limit_after_the_servers_retry_after(
    fake: FakeAnthropicServer,
) -> None:
    fake.script(rate_limited("2"), message(text("done"), id="msg_ok"))
    clock = FakeClock()
    async with AnthropicModel("claude-test", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=clock).run("go")
    assert result.stop_reason is StopReason.agent_finished
    assert [s.llm_call_id for s in result.steps] == ["msg_ok"]
    assert clock.sleeps == [2.0]  # the default backoff (~0.5 s) raised to retry-after
    assert len(fake.requests) == 2


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (error(401, "invalid x-api-key"), "auth"),
        (error(400, "prompt is too long: 215000 tokens > 200000 maximum"), "context_length"),
    ],
    ids=["auth", "context_length"],
)
async def test_loop_ends_llm_error_on_a_non_retryable_failure(
    fake: FakeAnthropicServer, reply: Reply, kind: str
) -> None:
    fake.script(reply)
    async with AnthropicModel("claude-test", base_url=fake.url) as model:
        result = await Loop(model, tools=adder(), clock=FakeClock()).run("go")
    assert result.stop_reason is StopReason.llm_error  # never context_overflow
    assert result.stop_detail is not None
    assert f"kind={kind}, retryable=False, attempts=1" in result.stop_detail
    assert [s.llm_call_id for s in result.steps] == [None]
    assert len(fake.requests) == 1


# --- the polyloop command --------------------------------------------------------------------


def _polyloop(cwd: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "ANTHROPIC_", "POLYLOOP_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "polyloop.cli", *args],
        cwd=cwd,
        env={**clean, "PYTHONUNBUFFERED": "1", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_runs_an_anthropic_model(fake: FakeAnthropicServer, tmp_path: Path) -> None:
    pytest.importorskip("typer")
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "notes.txt").write_text("the code is 7\n", encoding="utf-8")
    fake.script(
        message(tool_use("read_file", {"path": "notes.txt"}, id="toolu_r1"), id="msg_1"),
        message(text("The code is 7."), id="msg_2"),
    )
    model = ("--model", "anthropic:claude-test", "--base-url", fake.url)
    where = ("--workspace", "ws", "--journal", "j.db", "--tools", "files")
    done = _polyloop(tmp_path, "run", "read notes", *model, *where, ANTHROPIC_API_KEY="sk-ant-e")
    assert done.returncode == 0, done
    assert "agent_finished" in done.stdout, done
    first, second = fake.requests
    assert first.headers["authorization"] == "Bearer sk-ant-e"
    assert first.body["model"] == "claude-test"
    assert second.body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_r1", "content": "the code is 7\n"}
        ],
    }


def test_the_command_without_an_anthropic_key_says_so_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("typer")
    (tmp_path / "ws").mkdir()
    done = _polyloop(tmp_path, "run", "g", "--model", "anthropic:claude-test", "--workspace", "ws")
    assert done.returncode == 1, done
    (line,) = done.stderr.strip().splitlines()
    assert "ANTHROPIC_API_KEY" in line and "Traceback" not in done.stderr
    assert not (tmp_path / "polyloop.db").exists()


async def test_thinking_blocks_survive_many_runs_interleaved_on_one_model(
    fake: FakeAnthropicServer,
) -> None:
    # A batch of runs sharing one model: every run's first reply comes before any run's next
    # request. Each next request still carries its own run's signed thinking.
    runs = 100
    fake.script(
        *(
            message(
                thinking(f"run {n} thinks", signature=f"sig-{n}"),
                tool_use("add", {"a": n, "b": 1}, id=f"toolu_{n}"),
            )
            for n in range(runs)
        ),
        *(message(text("done")) for _ in range(runs)),
    )
    goal = {"role": "user", "content": "add"}
    async with AnthropicModel(
        "claude-test", base_url=fake.url, api_key="sk-ant-test", thinking_budget=2048
    ) as model:
        replies = [
            await model.complete(ModelRequest(f"run-{n}", 0, 1, [goal], [ADD_SPEC]))
            for n in range(runs)
        ]
        for n, reply in enumerate(replies):
            call = reply.tool_calls[0]
            history = [
                goal,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": "add", "arguments": call.arguments_text},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": call.id, "content": str(n + 1)},
            ]
            await model.complete(ModelRequest(f"run-{n}", 1, 1, history, [ADD_SPEC]))
    for n in range(runs):
        sent = fake.requests[runs + n].body["messages"][1]["content"]
        assert sent[0] == {
            "type": "thinking",
            "thinking": f"run {n} thinks",
            "signature": f"sig-{n}",
        }


async def test_streamed_deltas_add_up_to_the_reply_across_blocks(fake: FakeAnthropicServer) -> None:
    # Thinking blocks are joined with a blank line, text blocks as they are: the deltas carry
    # the same separators, so that what was shown is what is journaled.
    content = (thinking("First, read."), thinking("Then, answer."), text("Paris "), text("it is."))
    fake.script(message(*content), message_stream(*content))
    shown: list[tuple[str, str]] = []
    on_delta = lambda kind, piece: shown.append((kind, piece))  # noqa: E731
    req = ModelRequest("r", 0, 1, [{"role": "user", "content": "?"}], (), on_delta)
    async with AnthropicModel("claude-test", base_url=fake.url) as whole:
        expected = await whole.complete(req)
    async with AnthropicModel("claude-test", base_url=fake.url, stream=True) as m:
        reply = await m.complete(req)
    assert reply == expected
    assert reply.reasoning == "First, read.\n\nThen, answer."
    assert "".join(t for k, t in shown if k == "text") == reply.text == "Paris it is."
    assert "".join(t for k, t in shown if k == "reasoning") == reply.reasoning


async def test_streamed_tool_input_that_is_not_json_is_a_bad_response(
    fake: FakeAnthropicServer,
) -> None:
    streamed = message_stream(tool_use("add", {"a": 2}))
    broken = [e.replace(b'"partial_json":"{', b'"partial_json":"[{') for e in streamed.events]
    fake.script(
        Reply(streamed.status, headers=streamed.headers, mode="stream", events=tuple(broken))
    )
    async with AnthropicModel("claude-test", base_url=fake.url, stream=True) as m:
        with pytest.raises(ModelCallError) as info:
            await m.complete(request())
    assert (info.value.kind, info.value.retryable) == ("bad_response", True)
