"""The tools a server offers, as PolyLoop lists them (with the replay policy their annotations
give), and how they join a ``ToolRegistry``: under which names, with which policies, checked
all together before any is registered."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types

from polyloop.types import ConfigError, ReplayPolicy, ToolContext

from .._deadline import own_deadline
from ..registry import ReconcileHook, Tool, ToolRegistry
from ._results import arguments_validator

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_NAME_RULE = "^[a-zA-Z0-9_-]{1,64}$"

Call = Callable[[str, Mapping[str, Any], ToolContext], Any]
"""``call(server_name, arguments, ctx) -> Outcome`` (awaitable): what a registered tool runs."""


@dataclass(frozen=True, slots=True)
class MCPTool:
    """A tool a server offers, as listed, with the replay policy PolyLoop derives for it.

    Attributes:
        name: the server's name for it.
        description: its description ("" if none).
        input_schema: its JSON schema, as given.
        annotations: its annotations as sent (``readOnlyHint``, ``idempotentHint``,
            ``destructiveHint``, ``openWorldHint``, ``title``); empty if none.
        replay: :func:`replay_from_annotations` of them.
    """

    name: str
    description: str
    input_schema: Mapping[str, Any] = field(repr=False)
    annotations: Mapping[str, Any]
    replay: ReplayPolicy


def replay_from_annotations(annotations: Mapping[str, Any] | None) -> ReplayPolicy:
    """``idempotent`` when the server says the tool is read-only (``readOnlyHint: true``) or
    idempotent (``idempotentHint: true``: repeating it has no additional effect, destructive or
    not); ``never`` otherwise, including when it says nothing. Annotations are the server's
    hints: override them per tool where you know better (``MCPServer.register(replay=...)``).
    """
    a = annotations or {}
    if a.get("readOnlyHint") is True or a.get("idempotentHint") is True:
        return ReplayPolicy.idempotent
    return ReplayPolicy.never


def approval_from_annotations(annotations: Mapping[str, Any] | None) -> bool:
    """Whether a tool's calls should wait for a person's approval by its annotations: True
    unless the server says the tool is read-only (``readOnlyHint: true``), including when it
    says nothing (``polyloop run --ask-mcp destructive``). A hint, as for the replay policy."""
    return (annotations or {}).get("readOnlyHint") is not True


def listed_tool(t: mcp_types.Tool) -> MCPTool:
    """The ``MCPTool`` of one tool of a ``tools/list`` answer."""
    hints = t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else {}
    policy = replay_from_annotations(hints)
    return MCPTool(t.name, t.description or "", t.input_schema, hints, policy)


def register_listed(
    registry: ToolRegistry,
    offered: Mapping[str, MCPTool],
    *,
    server: str,
    origin: str,
    call: Call,
    prefix: str,
    include: Sequence[str] | None,
    replay: Mapping[str, str | ReplayPolicy] | None,
    reconcile: Mapping[str, ReconcileHook] | None,
    completion_markers: Sequence[str],
    on_skipped: Callable[[str, str], object] | None,
    approval: Collection[str] = (),
) -> tuple[Tool, ...]:
    """Register the ``offered`` tools on ``registry`` as ``MCPServer.register`` says (all or
    nothing); ``server`` names the server in errors, ``origin`` is each tool's origin."""
    if isinstance(approval, str):
        raise ConfigError(f"{server}: approval takes tool names, [{approval!r}], not a string")
    names = list(offered) if include is None else list(include)
    overrides = dict(replay or {})
    hooks = dict(reconcile or {})
    for what, keys in (
        ("include", names),
        ("replay", overrides),
        ("reconcile", hooks),
        ("completion_markers", completion_markers),
        ("approval", approval),
    ):
        unknown = sorted(set(keys) - set(offered))
        if unknown:
            raise ConfigError(
                f"{server}: {what} names {unknown}, which it does not offer "
                f"(it offers {sorted(offered)})"
            )
    taken = [prefix + n for n in names if prefix + n in registry]
    if taken:
        raise ConfigError(
            f"{server}: tools named {taken} are already registered; pass prefix=... to "
            "register this server's tools under other names"
        )
    bad = [n for n in names if not _NAME.fullmatch(prefix + n)]
    if bad:
        if on_skipped is None:
            raise ConfigError(
                f"{server}: the tool names {[prefix + n for n in bad]} are not {_NAME_RULE} "
                "(what model APIs accept); leave them out with include=[...], or pass "
                "on_skipped=... to register the others"
            )
        for n in bad:
            on_skipped(n, f"its name {prefix + n!r} is not {_NAME_RULE} (what model APIs accept)")
        names = [n for n in names if n not in bad]
    registered = []
    for n in names:
        t = offered[n]
        policy: str | ReplayPolicy = overrides.get(n, t.replay)
        if n in hooks:
            policy = ReplayPolicy.reconcile
        registered.append(
            registry.register_external(
                prefix + n,
                description=t.description or n,
                parameters=t.input_schema,
                validate=arguments_validator(t.input_schema, where=f"{origin}: tool {n!r}"),
                call=own_deadline(functools.partial(call, n)),  # ends at ctx.timeout_s
                replay=policy,  # type: ignore[arg-type]  # checked by the registry
                reconcile=hooks.get(n),
                completion_marker=n in completion_markers,
                origin=origin,
                approval=n in approval,
            )
        )
    return tuple(registered)
