"""Inspect AI tools (``@tool`` functions: ``bash()``, ``python()``, ``think()``, your own)
as PolyLoop tools of a :class:`~polyloop.ToolRegistry`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inspect_ai.model import ContentText
from inspect_ai.tool import Tool, ToolDef

from ...tools import ToolRegistry
from ...tools.registry import InvalidArguments, ReplayName
from ...types import ConfigError, ToolContext

__all__ = ["add_inspect_tools"]


def add_inspect_tools(
    registry: ToolRegistry,
    tools: Sequence[Tool | ToolDef],
    *,
    replay: ReplayName = "never",
) -> ToolRegistry:
    """Register Inspect tools in ``registry`` (and return it), each as an external tool: its
    name, description and JSON schema are Inspect's (``ToolDef``), the arguments are checked
    against that schema (Draft 7, as Inspect checks them) and converted to the function's
    parameter types as Inspect does, and its result is the observation: a str as it is,
    ``Content`` parts by their text (images and other media are dropped: PolyLoop's
    observations are text), anything else ``str()``. A tool that raises (Inspect's
    ``ToolError`` included) is an executed failure whose observation is the error.

    Wrapped this way: tools that are plain async functions, sandbox tools included
    (``bash()``, ``python()``, ``text_editor()``: they run in the sample's sandbox, since the
    run is driven inside the sample). Not wrapped: a ``ToolSource`` (its tools change per
    call), agents given as tools (``handoff()``, ``as_tool()``: they need Inspect's agent
    state), and Inspect's tool approval policies and viewers (use PolyLoop's ``approval=``).

    Args:
        replay: the replay policy of every tool added (``"never"`` by default: a call whose
            outcome a crash left unknown ends the run ``resume_state_unknown`` on resume;
            ``"idempotent"`` runs it again).

    Raises:
        ConfigError: a tool's name is taken or invalid, or it is not an Inspect tool.
    """
    for tool in tools:
        try:
            tdef = tool if isinstance(tool, ToolDef) else ToolDef(tool)
        except Exception as exc:
            raise ConfigError(
                f"{tool!r} is not an Inspect tool ({exc}); pass the tool object that an "
                "@tool function returns, e.g. bash() rather than bash"
            ) from exc
        parameters = tdef.parameters.model_dump(exclude_none=True)
        registry.register_external(
            tdef.name,
            description=tdef.description,
            parameters=parameters,
            validate=_validator(tdef),
            call=_caller(tdef),
            replay=replay,
            origin="Inspect",
        )
    return registry


def _validator(tdef: ToolDef) -> Any:
    from inspect_ai.model._call_tools import validate_tool_input

    def validate(arguments: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(arguments)
        problems = validate_tool_input(values, tdef.parameters)
        if problems:
            raise InvalidArguments(problems.splitlines()[1:] or [problems])
        return values

    return validate


def _caller(tdef: ToolDef) -> Any:
    from inspect_ai.model._call_tools import tool_params

    async def call(values: Mapping[str, Any], ctx: ToolContext) -> str:
        result = await tdef.tool(**tool_params(dict(values), tdef.tool))
        return _as_text(result)

    return call


def _as_text(result: object) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, ContentText):
        return result.text
    if isinstance(result, list):
        return "\n".join(r.text for r in result if isinstance(r, ContentText))
    return str(result)
