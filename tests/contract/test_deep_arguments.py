"""Tool arguments nested deeper than ``MAX_NESTING`` (a model's, through every adapter and from
a custom model) are an invalid decision, never a ``RecursionError`` out of ``Loop.run``: the
step is journaled with ``parse_ok=False`` and the feedback of ``templates.arguments_too_deep``,
the run ends with an ordinary stop reason (or goes on when the model then behaves), and a run
that crashed on such a reply resumes cleanly."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop import ConfigError, Limits, Loop, ModelReply, StopReason, ToolCall, ToolRegistry
from polyloop.interpreters import JsonTextInterpreter, NativeToolCallInterpreter
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import DEFAULT_TEMPLATES, MAX_NESTING, ModelRequest
from tests.conftest import Crash
from tests.fakes.providers import ADD_SPEC, IDS, PROVIDERS, Provider, adder, chosen

DEPTHS = [MAX_NESTING + 1, 970, 990, 5000]
"""Just past the limit, where today's C encoder or decoder gives out, and far past it."""

FEEDBACK = DEFAULT_TEMPLATES.arguments_too_deep.format(name="add", limit=MAX_NESTING)


def deep_dict(levels: int) -> dict[str, Any]:
    """``{"a": {"a": ... {}}}``: ``levels`` objects, built without recursion."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def deep_text(levels: int) -> str:
    """The JSON text of :func:`deep_dict`."""
    return '{"a":' * (levels - 1) + "{}" + "}" * (levels - 1)


def deep_call(arguments: Any, id: str = "call_deep") -> ModelReply:
    return ModelReply(tool_calls=(ToolCall("add", arguments, id),))


def good_call() -> ModelReply:
    return ModelReply(tool_calls=(ToolCall("add", {"a": 1, "b": 2}, "call_ok"),))


def assert_refused(step: Any) -> None:
    assert step.parse_ok is False
    assert step.action_status is None and step.tool_name is None
    assert step.parse_error == FEEDBACK
    assert "nested too deeply (more than 100 levels)" in step.parse_error


@pytest.mark.parametrize("form", ["mapping", "json_text"])
@pytest.mark.parametrize("levels", DEPTHS)
async def test_a_custom_models_deep_arguments_end_the_run_parse_failed_repeatedly(
    form: str, levels: int, tmp_path: Path
) -> None:
    arguments = deep_dict(levels) if form == "mapping" else deep_text(levels)
    model = ScriptedModel([deep_call(arguments)] * 3)
    async with SQLiteJournal(tmp_path / "j.db") as journal:
        r = await Loop(model, tools=adder(), journal=journal, clock=FakeClock()).run(
            "add", run_id="r", limits=Limits(max_consecutive_invalid=3)
        )
        stored = list(await journal.steps("r"))
    assert r.stop_reason == StopReason.parse_failed_repeatedly
    assert len(r.steps) == 3 and stored == list(r.steps)
    for step in r.steps:
        assert_refused(step)
        # The reply is recorded as received: the arguments' JSON text, verbatim.
        calls = json.loads(step.raw_response.partition("\n")[2])
        assert calls[0]["arguments"] == deep_text(levels)
    # The model was told why, next to its call, and it sees its call as it made it.
    sent = model.requests[1].messages
    assert sent[-1]["content"] == FEEDBACK
    assert sent[-2]["tool_calls"][0]["function"]["arguments"] == deep_text(levels)


async def test_the_run_goes_on_when_the_model_then_calls_with_flat_arguments() -> None:
    model = ScriptedModel([deep_call(deep_dict(990)), good_call(), "3"])
    r = await Loop(model, tools=adder(), clock=FakeClock()).run("add")
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "3"
    refused, added, _ = r.steps
    assert_refused(refused)
    assert added.parse_ok and added.observation == "3"


async def test_arguments_at_the_limit_are_accepted() -> None:
    model = ScriptedModel([deep_call(deep_dict(MAX_NESTING)), "done"])
    r = await Loop(model, tools=adder(), clock=FakeClock()).run("add")
    assert r.stop_reason == StopReason.agent_finished
    assert r.steps[0].parse_ok is True  # valid: the tool itself refuses the arguments


@pytest.mark.parametrize("levels", [MAX_NESTING + 1, 970, 5000])
async def test_deep_json_in_a_text_reply_is_refused_by_the_json_text_interpreter(
    levels: int,
) -> None:
    text = '{"tool": "add", "arguments": ' + deep_text(levels - 1) + "}"
    interpreter = JsonTextInterpreter()
    model = ScriptedModel([text] * 3)
    r = await Loop(model, tools=adder(), interpreter=interpreter, clock=FakeClock()).run("add")
    assert r.stop_reason == StopReason.parse_failed_repeatedly
    expected = DEFAULT_TEMPLATES.json_malformed.format(
        error=f"nested too deeply (more than {MAX_NESTING} levels)",
        expected=interpreter.instructions,
    )
    assert [s.parse_error for s in r.steps] == [expected] * 3


class CrashingInterpreter(NativeToolCallInterpreter):
    """Raises as today's interpreter did on a 970-deep reply (its C encoder gave out)."""

    def interpret(self, reply: ModelReply, tool_specs: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")


@pytest.mark.parametrize("at", ["model_call", "interpreting"])
async def test_a_run_that_crashed_on_deep_arguments_resumes_cleanly(
    at: str, tmp_path: Path
) -> None:
    """A SQLite journal as a crash on such a reply left it: the model intent alone (the reply
    crashed where it was read), or with its model result (it crashed in the interpreter)."""
    path = tmp_path / "j.db"
    replies = {0: deep_call(deep_text(970) if at == "interpreting" else deep_dict(990))}

    def answer(request: ModelRequest) -> ModelReply:
        if at == "model_call" and request.attempt == 1 and request.step_idx == 0:
            raise Crash
        return replies.get(request.step_idx, ModelReply(text="done"))

    model = FunctionModel(answer)
    async with SQLiteJournal(path) as journal:
        first = Loop(model, tools=adder(), journal=journal, clock=FakeClock())
        if at == "interpreting":
            first = Loop(
                model, tools=adder(), journal=journal, clock=FakeClock(),
                interpreter=CrashingInterpreter(),
            )  # fmt: skip
        with pytest.raises(Crash if at == "model_call" else RecursionError):
            await first.run("add", run_id="r")
    async with SQLiteJournal(path) as journal:
        r = await Loop(model, tools=adder(), journal=journal, clock=FakeClock()).resume("r")
        stored = list(await journal.steps("r"))
    assert r.stop_reason == StopReason.agent_finished and r.final_answer == "done"
    assert stored == list(r.steps)
    assert_refused(r.steps[0])


# -- through every adapter and its fake server ------------------------------------------------


@contextlib.contextmanager
def deep_recursion() -> Iterator[None]:
    """Room for the test's own ``json.dumps`` of a scripted body (not PolyLoop's code)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.fixture(params=PROVIDERS, ids=IDS)
def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Provider:
    return chosen(request.param, monkeypatch)


def sdk_decodes(provider: Provider, stream: bool) -> bool:
    """The provider's SDK decodes the tool call's arguments as part of the response body (its
    own recursive JSON decoder, before the adapter sees anything): Anthropic's whole message,
    Gemini's response; OpenAI sends arguments as a string, Anthropic streams them as text."""
    return provider.id.startswith("gemini") or (provider.id == "anthropic" and not stream)


@pytest.mark.parametrize("levels", [150, 990])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_deep_arguments_from_every_adapter_are_an_invalid_decision(
    provider: Provider, stream: bool, levels: int, tmp_path: Path
) -> None:
    """150 levels: every SDK decodes them, the adapter hands them on, they are refused. 990
    levels as a string (OpenAI's, and Anthropic's streamed input): refused alike; in a body the
    SDK itself cannot decode: that call fails (``llm_error``), as any undecodable reply."""
    with provider.server() as fake:
        with deep_recursion():
            deep = provider.call("add", deep_dict(levels), "call_deep", stream=stream)
        fake.script(deep, provider.call("add", {"a": 1, "b": 2}, "call_ok", stream=stream))
        fake.script(provider.answer("3", stream=stream))
        model = provider.model(fake.url, stream=stream)
        async with SQLiteJournal(tmp_path / "j.db") as journal:
            r = await Loop(model, tools=adder(), journal=journal, clock=FakeClock()).run(
                "add", run_id="r"
            )
            stored = list(await journal.steps("r"))
    assert stored == list(r.steps)
    if levels > 900 and sdk_decodes(provider, stream):
        assert r.stop_reason == StopReason.llm_error and len(r.steps) == 1  # the failed call
        assert "RecursionError" in (r.stop_detail or "")
        return
    assert r.stop_reason == StopReason.agent_finished, r.stop_detail
    refused, added, _ = r.steps
    assert_refused(refused)
    assert added.parse_ok and added.observation == "3"


async def test_every_adapter_sends_a_history_holding_deep_arguments(provider: Provider) -> None:
    """A refused call stays in the history as the text received (another model may have made
    it: a FallbackModel's first). Adapters that must send arguments as an object send ``{}``
    for it, as for arguments that are not JSON, instead of decoding it recursively."""
    messages = [
        {"role": "user", "content": "add"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_deep",
                    "type": "function",
                    "function": {"name": "add", "arguments": deep_text(5000)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_deep", "content": FEEDBACK},
    ]
    with provider.server() as fake:
        fake.script(provider.answer("3"))
        model = provider.model(fake.url)
        reply = await model.complete(ModelRequest("r", 1, 1, messages, [ADD_SPEC]))
    assert reply.text == "3"


# -- a tool's result nested deeply -----------------------------------------------------------


def digger() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool
    def dig(levels: int) -> Any:
        """A value nested ``levels`` deep."""
        return deep_dict(levels)

    @tools.tool
    def loop_back() -> Any:
        """A list that contains itself, nested in a deep value."""
        inner: list[Any] = []
        inner.append(inner)
        value = deep_dict(990)
        value["loop"] = inner
        return value

    return tools


@pytest.mark.parametrize("levels", [150, 990, 5000])
async def test_a_tool_result_nested_deeply_is_its_json_text(levels: int, tmp_path: Path) -> None:
    model = ScriptedModel(
        [ModelReply(tool_calls=(ToolCall("dig", {"levels": levels}, "c"),)), "done"]
    )
    async with SQLiteJournal(tmp_path / "j.db") as journal:
        r = await Loop(model, tools=digger(), journal=journal, clock=FakeClock()).run(
            "dig", run_id="r"
        )
        stored = list(await journal.steps("r"))
    assert r.stop_reason == StopReason.agent_finished and stored == list(r.steps)
    assert r.steps[0].observation == deep_text(levels)  # canonical JSON, as for a shallow one


async def test_a_deep_tool_result_that_contains_itself_is_shown_shortened() -> None:
    model = ScriptedModel([ModelReply(tool_calls=(ToolCall("loop_back", {}, "c"),)), "done"])
    r = await Loop(model, tools=digger(), clock=FakeClock()).run("dig")
    assert r.stop_reason == StopReason.agent_finished
    observation = r.steps[0].observation or ""
    assert observation.startswith("{'a': {'a': ") and len(observation) < 200


# -- the caller's own values -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["metadata", "history"])
async def test_the_callers_own_values_nested_too_deeply_are_a_config_error(
    where: str, tmp_path: Path
) -> None:
    """PolyLoop never alters the caller's own input: nested past ``MAX_NESTING`` levels (which
    the journal's JSON could not write and read back safely) it is refused, nothing written."""
    deep = deep_dict(990)
    kwargs: dict[str, Any] = (
        {"metadata": deep}
        if where == "metadata"
        else {"history": [{"role": "user", "content": [{"type": "text", "text": "x", "x": deep}]}]}
    )
    async with SQLiteJournal(tmp_path / "j.db") as journal:
        with pytest.raises(ConfigError, match=f"{where} nests more than 100 levels"):
            await Loop(ScriptedModel(["done"]), journal=journal).run("g", run_id="r", **kwargs)
        assert await journal.list_runs() == []
    r = await Loop(ScriptedModel(["done"])).run("g", metadata=deep_dict(MAX_NESTING))
    assert r.stop_reason == StopReason.agent_finished


class _Opaque:
    """A value JSON cannot hold."""


def _cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


@pytest.mark.parametrize(
    "arguments",
    [{"a": {1, 2}}, {"a": _Opaque()}, _cyclic(), {"a": [deep_dict(990), {3}]}],
    ids=["set", "object", "cyclic", "deep-and-a-set"],
)
async def test_a_custom_models_arguments_json_cannot_hold_fail_the_attempt_not_the_process(
    arguments: dict[str, Any], tmp_path: Path
) -> None:
    # Only a custom model can send them (an adapter's arguments come from JSON): the reply
    # breaks ModelReply's contract, so the attempt fails (not retryable) and the run ends
    # llm_error with its model-failure step, instead of a TypeError out of Loop.run that
    # leaves the run running with only its model intent.
    model = ScriptedModel([deep_call(arguments), good_call()])
    async with SQLiteJournal(tmp_path / "j.db") as journal:
        r = await Loop(model, tools=adder(), journal=journal, clock=FakeClock()).run(
            "add", run_id="r"
        )
        stored = list(await journal.steps("r"))
        rebuilt = await Loop(model, tools=adder(), journal=journal).resume("r")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail is not None
    assert r.stop_detail.startswith("MalformedValue: the arguments of the call to 'add'")
    assert "cannot be written as JSON" in r.stop_detail
    assert len(r.steps) == 1 and r.steps[0].llm_call_id is None and stored == list(r.steps)
    assert rebuilt.stop_reason == StopReason.llm_error and rebuilt.steps == r.steps


async def test_deep_arguments_in_any_mapping_are_an_invalid_decision() -> None:
    # A ToolCall's arguments may be any mapping, not only a dict: measured the same.
    from types import MappingProxyType

    model = ScriptedModel([deep_call(MappingProxyType({"a": deep_dict(990)})), good_call()])
    r = await Loop(model, tools=adder(), clock=FakeClock()).run("add")
    assert r.steps[0].parse_ok is False
    assert r.steps[0].parse_error is not None
    assert "nested too deeply (more than 100 levels)" in r.steps[0].parse_error
    assert r.steps[1].action_status is not None
