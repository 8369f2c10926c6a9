"""ToolRegistry.register_external: a tool from a JSON schema and its own validator goes through
the same validation, dispatch and observations as a Python tool."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from polyloop import ActionStatus, ConfigError, ToolContext, ToolRegistry
from polyloop.tools import InvalidArguments, ToolEnvironment
from polyloop.types import Action

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def validate(arguments: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(arguments.get("n"), int):
        raise InvalidArguments(["'n': expected an integer"])
    return dict(arguments)


def registry(calls: list[tuple[dict[str, Any], str]]) -> ToolRegistry:
    async def double(values: Mapping[str, Any], ctx: ToolContext) -> str:
        calls.append((dict(values), ctx.op_id))
        return str(values["n"] * 2)

    tools = ToolRegistry()
    tools.register_external(
        "double", description="Double n.", parameters=SCHEMA, validate=validate, call=double
    )
    return tools


async def test_an_external_tool_is_validated_then_called_with_the_context() -> None:
    calls: list[tuple[dict[str, Any], str]] = []
    env = ToolEnvironment(registry(calls))
    ok = await env.execute(
        Action("double", tool_name="double", arguments={"n": 4}), ToolContext("r", 0, "op")
    )
    assert (ok.status, ok.observation) == (ActionStatus.executed, "8")
    assert calls == [({"n": 4}, "op")]
    bad = await env.execute(
        Action("double", tool_name="double", arguments={"n": "x"}), ToolContext("r", 1, "o2")
    )
    assert bad.status == ActionStatus.not_executed and bad.synthetic
    assert "- 'n': expected an integer" in bad.observation
    assert len(calls) == 1  # refused arguments never reach the call


def test_its_spec_is_the_schema_as_given_and_its_name_must_be_free() -> None:
    tools = registry([])
    spec = tools.specs()[0]["function"]
    assert spec == {"name": "double", "description": "Double n.", "parameters": SCHEMA}
    assert spec["parameters"] is not SCHEMA  # a copy: the caller's dict may change
    with pytest.raises(ConfigError, match="already registered"):
        tools.register_external(
            "double",
            description="d",
            parameters=SCHEMA,
            validate=validate,
            call=print,  # type: ignore[arg-type]
        )
    with pytest.raises(ConfigError, match="must match"):
        tools.register_external(
            "a.b",
            description="d",
            parameters=SCHEMA,
            validate=validate,
            call=print,  # type: ignore[arg-type]
        )
