"""ToolEnvironment: the Environment seam over a registry."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
from typing import Any

import pydantic
import pytest

from polyloop.seams import Environment
from polyloop.tools import ToolEnvironment, ToolRegistry
from polyloop.types import (
    Action,
    ActionStatus,
    EnvironmentFailure,
    Failure,
    Outcome,
    OutcomeUnknown,
    ReplayPolicy,
    Templates,
    ToolContext,
)

CTX = ToolContext("run-1", 4, "op-9")


class Mode(enum.Enum):
    fast = "fast"
    slow = "slow"


class Point(pydantic.BaseModel):
    x: int
    y: int


class Shape(pydantic.BaseModel):
    name: str
    points: list[Point]


def _line_of(text: str) -> int:
    """The 1-based line of this file that holds ``text`` (skipping the line that asks)."""
    with open(__file__, encoding="utf-8") as f:
        hits = [n for n, line in enumerate(f, 1) if text in line and "_line_of(" not in line]
    assert len(hits) == 1, hits
    return hits[0]


def act(name: str | None, arguments: dict[str, Any] | None = None) -> Action:
    return Action(text=f"{name}(...)", tool_name=name, arguments=arguments)


@pytest.fixture
def registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def count(n: int, mode: Mode = Mode.fast, shape: Shape | None = None) -> str:
        """Count to n."""
        return " ".join(str(i) for i in range(1, n + 1))

    @registry.tool(replay="idempotent")
    def flag(on: bool, names: list[str]) -> str:
        """Set a flag."""
        return f"{on} {names}"

    return registry


@pytest.fixture
def env(registry: ToolRegistry) -> ToolEnvironment:
    return ToolEnvironment(registry)


def test_tool_environment_implements_the_seam(env: ToolEnvironment) -> None:
    assert isinstance(env, Environment)


def test_tool_specs_are_the_registrys_specs_and_follow_later_registrations(
    registry: ToolRegistry, env: ToolEnvironment
) -> None:
    assert env.tool_specs() is registry.specs()
    assert env.registry is registry

    @registry.tool
    def later() -> str:
        """Added after the environment was made."""
        return ""

    assert [s["function"]["name"] for s in env.tool_specs()] == ["count", "flag", "later"]


async def test_unknown_tool_is_not_executed_and_lists_the_available_names(
    env: ToolEnvironment,
) -> None:
    outcome = await env.execute(act("cuont", {"n": 1}), CTX)
    assert outcome == Outcome(
        ActionStatus.not_executed,
        "Error: there is no tool named 'cuont'. Available tools: count, flag. "
        "Call one of them by its exact name.",
        synthetic=True,
    )


async def test_action_without_tool_name_is_not_executed(env: ToolEnvironment) -> None:
    outcome = await env.execute(Action(text="print(1)"), CTX)
    assert outcome.status is ActionStatus.not_executed
    assert outcome.synthetic
    assert "Available tools: count, flag." in outcome.observation


async def test_unknown_tool_in_an_empty_registry_says_none() -> None:
    outcome = await ToolEnvironment(ToolRegistry()).execute(act("x"), CTX)
    assert "Available tools: (none)." in outcome.observation


async def test_invalid_arguments_are_described_in_words_a_model_can_act_on(
    env: ToolEnvironment,
) -> None:
    outcome = await env.execute(
        act(
            "count",
            {
                "n": "three",
                "mode": "medium",
                "shape": {"points": [{"x": 1, "y": "up"}]},
                "verbose": True,
            },
        ),
        CTX,
    )
    assert outcome.status is ActionStatus.not_executed
    assert outcome.synthetic
    assert outcome.failure is None
    assert outcome.observation == (
        "Error: the arguments for 'count' are invalid:\n"
        "- 'n': expected an integer, got \"three\"\n"
        "- 'mode': expected 'fast' or 'slow', got \"medium\"\n"
        "- 'shape.name': required field missing\n"
        "- 'shape.points[0].y': expected an integer, got \"up\"\n"
        "- 'verbose': unknown argument\n"
        "Call 'count' again with corrected arguments."
    )


async def test_missing_argument_and_wrong_container_types(env: ToolEnvironment) -> None:
    outcome = await env.execute(act("flag", {"names": "alice"}), CTX)
    lines = outcome.observation.splitlines()[1:-1]
    assert lines == [
        "- 'on': required argument missing",
        "- 'names': expected an array, got \"alice\"",
    ]
    outcome = await env.execute(act("flag", {"on": "perhaps", "names": []}), CTX)
    assert "- 'on': expected a boolean (true or false), got \"perhaps\"" in outcome.observation


async def test_invalid_arguments_use_the_template(registry: ToolRegistry) -> None:
    templates = dataclasses.replace(Templates(), invalid_arguments="{name}|{errors}")
    outcome = await ToolEnvironment(registry, templates=templates).execute(act("count", {}), CTX)
    assert outcome.observation == "count|- 'n': required argument missing"


async def test_constraint_errors_fall_back_to_pydantics_message() -> None:
    registry = ToolRegistry()

    @registry.tool
    def sized(n: pydantic.PositiveInt) -> str:
        """Needs a positive n."""
        return ""

    outcome = await ToolEnvironment(registry).execute(act("sized", {"n": -2}), CTX)
    assert "- 'n': input should be greater than 0, got -2" in outcome.observation


async def test_tool_receives_validated_values() -> None:
    registry = ToolRegistry()
    received: dict[str, Any] = {}

    @registry.tool
    def draw(shape: Shape, mode: Mode, n: int = 2) -> str:
        """Draw a shape."""
        received.update(shape=shape, mode=mode, n=n)
        return "drawn"

    outcome = await ToolEnvironment(registry).execute(
        act("draw", {"shape": {"name": "tri", "points": [{"x": 1, "y": "2"}]}, "mode": "slow"}),
        CTX,
    )
    assert outcome == Outcome(ActionStatus.executed, "drawn")
    assert received["shape"] == Shape(name="tri", points=[Point(x=1, y=2)])
    assert isinstance(received["shape"].points[0], Point)
    assert received["mode"] is Mode.slow
    assert received["n"] == 2


async def test_exception_in_tool_is_executed_with_failure_fields() -> None:
    registry = ToolRegistry()

    @registry.tool
    def explode(what: str) -> str:
        """Always fails."""
        raise ValueError(f"cannot explode {what}")

    raise_line = _line_of('raise ValueError(f"cannot explode {what}")')
    outcome = await ToolEnvironment(registry).execute(act("explode", {"what": "rock"}), CTX)
    assert outcome == Outcome(
        ActionStatus.executed,
        "Error: 'explode' raised ValueError: cannot explode rock",
        synthetic=True,
        failure=Failure(
            check=None,
            error_type="ValueError",
            top_frame=f"test_tool_environment.py:{raise_line}",
            message="cannot explode rock",
        ),
    )


async def test_top_frame_is_the_tools_own_line_not_the_library_that_raised() -> None:
    registry = ToolRegistry()

    @registry.tool
    async def parse(text: str) -> str:
        """Parse JSON."""
        return str(json.loads(text))  # parse

    call_line = _line_of("return str(json.loads(text))  # parse")
    outcome = await ToolEnvironment(registry).execute(act("parse", {"text": "{nope"}), CTX)
    assert outcome.failure is not None
    assert outcome.failure.error_type == "JSONDecodeError"
    assert outcome.failure.top_frame == f"test_tool_environment.py:{call_line}"


async def test_top_frame_falls_back_to_the_innermost_frame() -> None:
    class Parser:
        """Parse JSON (a callable object: no __code__ of its own)."""

        def __call__(self, text: str) -> str:
            return str(json.loads(text))

    registry = ToolRegistry()
    tool = registry.register(Parser(), name="parse")
    # Pretend the tool's source is elsewhere: no frame matches, the innermost one is used.
    registry._tools["parse"] = dataclasses.replace(tool, source_file="/nowhere/else.py")
    outcome = await ToolEnvironment(registry).execute(act("parse", {"text": "{"}), CTX)
    assert outcome.failure is not None
    assert outcome.failure.top_frame is not None
    assert outcome.failure.top_frame.startswith("decoder.py:")


async def test_environment_failure_is_env_error() -> None:
    registry = ToolRegistry()

    @registry.tool
    async def sandbox() -> str:
        """The sandbox."""
        raise EnvironmentFailure("sandbox is gone")

    outcome = await ToolEnvironment(registry).execute(act("sandbox"), CTX)
    assert outcome.status is ActionStatus.env_error
    assert outcome.observation == "EnvironmentFailure: sandbox is gone"
    assert outcome.synthetic
    assert outcome.failure is not None
    assert outcome.failure.error_type == "EnvironmentFailure"
    assert outcome.failure.message == "sandbox is gone"
    assert not outcome.marker


async def test_marker_only_when_a_completion_marker_tool_returns_normally() -> None:
    registry = ToolRegistry()

    @registry.tool(completion_marker=True)
    def submit(answer: str) -> str:
        """Submit."""
        if answer == "bad":
            raise RuntimeError("rejected")
        return f"submitted {answer}"

    @registry.tool
    def plain() -> str:
        """Not a marker."""
        return "ok"

    @registry.tool(completion_marker=True)
    def submit_outcome() -> Outcome:
        """Marker returning an Outcome."""
        return Outcome(ActionStatus.executed, "done", truncated_chars=3)

    env = ToolEnvironment(registry)
    ok = await env.execute(act("submit", {"answer": "42"}), CTX)
    assert (ok.status, ok.observation, ok.marker, ok.synthetic) == (
        ActionStatus.executed,
        "submitted 42",
        True,
        False,
    )
    raised = await env.execute(act("submit", {"answer": "bad"}), CTX)
    assert raised.status is ActionStatus.executed
    assert raised.marker is False
    assert raised.failure is not None
    invalid = await env.execute(act("submit", {}), CTX)
    assert invalid.status is ActionStatus.not_executed
    assert invalid.marker is False
    assert (await env.execute(act("plain"), CTX)).marker is False
    passed = await env.execute(act("submit_outcome"), CTX)
    assert passed == Outcome(ActionStatus.executed, "done", marker=True, truncated_chars=3)


class Report(pydantic.BaseModel):
    name: str
    score: float


@dataclasses.dataclass
class Pair:
    left: int
    right: str


class Opaque:
    def __str__(self) -> str:
        return "<opaque thing>"


@pytest.mark.parametrize(
    ("value", "observation"),
    [
        ("plain text", "plain text"),
        (None, ""),
        (3, "3"),
        (True, "true"),
        ({"b": 1, "a": "é"}, '{"a":"é","b":1}'),
        ([1, "two"], '[1,"two"]'),
        (Report(name="x", score=0.5), '{"name":"x","score":0.5}'),
        ([Report(name="x", score=1)], '[{"name":"x","score":1.0}]'),
        (Pair(1, "r"), '{"left":1,"right":"r"}'),
        (Opaque(), "<opaque thing>"),
    ],
)
async def test_return_values_become_text(value: Any, observation: str) -> None:
    registry = ToolRegistry()

    @registry.tool
    def give() -> Any:
        """Return the value."""
        return value

    outcome = await ToolEnvironment(registry).execute(act("give"), CTX)
    assert outcome == Outcome(ActionStatus.executed, observation)


async def test_returned_outcome_is_passed_through() -> None:
    registry = ToolRegistry()
    returned = Outcome(ActionStatus.executed, "goal reached", completed=True, truncated_chars=10)

    @registry.tool
    async def finish() -> Outcome:
        """Finish."""
        return returned

    assert await ToolEnvironment(registry).execute(act("finish"), CTX) is returned


async def test_cancellation_propagates_and_is_not_a_tool_error() -> None:
    registry = ToolRegistry()
    started = asyncio.Event()

    @registry.tool
    async def slow() -> str:
        """Wait forever."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    task = asyncio.create_task(ToolEnvironment(registry).execute(act("slow"), CTX))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancelled_error_the_tool_raised_itself_is_a_failure_like_any_other() -> None:
    """Nobody cancelled the call: the tool awaited something another party cancelled. The
    step is an executed one with a failure (the run goes on), not a cancellation."""
    registry = ToolRegistry()

    @registry.tool
    async def cancels() -> str:
        """Await a future somebody else cancels."""
        fut = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.cancel)
        await fut
        return "never"

    outcome = await ToolEnvironment(registry).execute(act("cancels"), CTX)
    assert outcome.status is ActionStatus.executed and outcome.synthetic
    assert outcome.failure is not None and outcome.failure.error_type == "CancelledError"
    assert "CancelledError" in outcome.observation


def test_replay_policy(registry: ToolRegistry, env: ToolEnvironment) -> None:
    @registry.tool
    def risky() -> str:
        """Never replayed."""
        return ""

    assert env.replay_policy(act("risky")) is ReplayPolicy.never
    assert env.replay_policy(act("flag", {"on": True, "names": []})) is ReplayPolicy.idempotent
    assert env.replay_policy(act("count", {"n": 1})) is ReplayPolicy.never
    # Unknown tool or invalid arguments: doing it again only says not_executed again.
    assert env.replay_policy(act("nope")) is ReplayPolicy.idempotent
    assert env.replay_policy(act("count", {"n": "x"})) is ReplayPolicy.idempotent
    assert env.replay_policy(Action(text="code")) is ReplayPolicy.idempotent


async def test_reconcile_calls_the_hook_with_op_id_and_validated_values() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    found = Outcome(ActionStatus.executed, "already stored")

    def sync_hook(op_id: str, arguments: Any) -> Outcome | None:
        calls.append((op_id, dict(arguments)))
        return found if arguments["key"] == "present" else None

    async def async_hook(op_id: str, arguments: Any) -> Outcome | None:
        calls.append((op_id, dict(arguments)))
        return None

    registry = ToolRegistry()

    @registry.tool(replay="reconcile", reconcile=sync_hook)
    def put(key: str, mode: Mode = Mode.fast, ctx: ToolContext | None = None) -> str:
        """Store."""
        return key

    @registry.tool(replay="reconcile", reconcile=async_hook)
    async def put_async(key: str) -> str:
        """Store."""
        return key

    env = ToolEnvironment(registry)
    assert env.replay_policy(act("put", {"key": "k"})) is ReplayPolicy.reconcile
    assert await env.reconcile(act("put", {"key": "present"}), CTX) is found
    assert await env.reconcile(act("put", {"key": "absent", "mode": "slow"}), CTX) is None
    assert await env.reconcile(act("put_async", {"key": "k"}), CTX) is None
    assert calls == [
        ("op-9", {"key": "present", "mode": Mode.fast}),
        ("op-9", {"key": "absent", "mode": Mode.slow}),
        ("op-9", {"key": "k"}),
    ]


async def test_reconcile_hook_may_say_it_cannot_tell() -> None:
    def unsure(op_id: str, arguments: Any) -> Outcome | None:
        raise OutcomeUnknown(f"no record of {op_id}")

    registry = ToolRegistry()

    @registry.tool(replay="reconcile", reconcile=unsure)
    def put(key: str) -> str:
        """Store."""
        return key

    with pytest.raises(OutcomeUnknown, match="no record of op-9"):
        await ToolEnvironment(registry).reconcile(act("put", {"key": "k"}), CTX)


async def test_reconcile_without_reconcile_policy_is_unknown(env: ToolEnvironment) -> None:
    with pytest.raises(OutcomeUnknown, match="'flag' has replay policy 'idempotent'"):
        await env.reconcile(act("flag", {"on": True, "names": []}), CTX)


async def test_reconcile_of_an_action_that_cannot_run_is_none(env: ToolEnvironment) -> None:
    assert await env.reconcile(act("nope"), CTX) is None
    assert await env.reconcile(act("count", {"n": "x"}), CTX) is None


async def test_reconcile_hook_returning_junk_is_a_type_error() -> None:
    def junk(op_id: str, arguments: Any) -> Any:
        return "yes"

    registry = ToolRegistry()

    @registry.tool(replay="reconcile", reconcile=junk)
    def put(key: str) -> str:
        """Store."""
        return key

    with pytest.raises(TypeError, match="must return an Outcome or None, got str"):
        await ToolEnvironment(registry).reconcile(act("put", {"key": "k"}), CTX)


def test_environment_needs_a_registry() -> None:
    with pytest.raises(TypeError, match="needs a ToolRegistry"):
        ToolEnvironment([])  # type: ignore[arg-type]
