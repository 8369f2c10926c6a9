"""The tool registry: one object that holds the specs the model sees, validates arguments and
dispatches calls (tools.md, "The registry: one source of truth").

::

    registry = ToolRegistry()

    @registry.tool
    def read_file(path: str) -> str:
        '''Read a UTF-8 text file from the workspace.'''

    @registry.tool(replay="idempotent")
    async def put_record(key: str, value: dict, ctx: ToolContext) -> str:
        '''Upsert a record; ctx.op_id is a stable idempotency key across crash and resume.'''

The JSON schema of a tool is generated from its signature and docstring with pydantic, and the
same pydantic model validates the arguments the model sends, so what the model is told and what
is accepted cannot drift apart.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypeVar, overload

import pydantic

from polyloop.types import ConfigError, Outcome, ReplayPolicy, ToolContext, ToolSpec, check_number

from ._signature import Param, read_function
from ._threads import in_thread

__all__ = ["ExternalCall", "InvalidArguments", "ReconcileHook", "Tool", "ToolRegistry"]

F = TypeVar("F", bound=Callable[..., Any])

ReconcileHook: TypeAlias = Callable[
    [str, Mapping[str, Any]], Outcome | Awaitable[Outcome | None] | None
]
"""``hook(op_id, arguments) -> Outcome | None`` (sync or async): did the action with this
``op_id`` happen? An ``Outcome`` means it did (that outcome is used), None means it did not (it
is executed again), raising ``OutcomeUnknown`` means it cannot be told. ``arguments`` are the
validated values the tool itself would receive, by parameter name (``ToolContext`` excluded)."""

ReplayName: TypeAlias = Literal["never", "idempotent", "reconcile"]

ExternalCall: TypeAlias = Callable[[Mapping[str, Any], ToolContext], Awaitable[Any]]
"""``call(arguments, ctx)`` of a tool registered with :meth:`ToolRegistry.register_external`:
awaited with the validated arguments (as the model sent them) and the run's ``ToolContext``."""


class InvalidArguments(ValueError):
    """Raised by an external tool's validator: the arguments break its schema.

    ``problems`` are one line each, in words a model can act on (``'count': 'three' is not of
    type 'integer'``); ``ToolEnvironment`` lists them in the ``not_executed`` observation, as
    it does pydantic's validation errors for a Python tool."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems) or ("the arguments do not match the tool's schema",)
        super().__init__("; ".join(self.problems))


log = logging.getLogger("polyloop")
_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True, eq=False)
class Tool:
    """A registered tool. Made by :meth:`ToolRegistry.register` (or the ``tool`` decorator);
    read-only afterwards.

    Attributes:
        name: the name the model calls it by (``^[a-zA-Z0-9_-]{1,64}$``).
        description: the docstring's summary (its first paragraph).
        function: the original function, sync or async.
        spec: the OpenAI tool spec ``{"type": "function", "function": {...}}``. Do not mutate.
        arguments_model: the pydantic model that validates the arguments (``extra="forbid"``);
            None for an external tool (:meth:`ToolRegistry.register_external`), whose own
            validator checks them against its JSON schema.
        replay: what resume may do if this tool's outcome was lost in a crash.
        reconcile_hook: the ``reconcile`` policy's hook; None for the other policies.
        completion_marker: returning normally from this tool completes the run.
        is_async: the function is a coroutine function (else it runs in a worker thread).
        context_parameter: the name of the injected ``ToolContext`` parameter, if any.
        source_file: the file that defines the function (for ``Failure.top_frame``).
        origin: where an external tool comes from (e.g. ``mcp:python -m mcp_server_time``);
            None for a Python tool.
        timeout_s: seconds one call may take (``@tool(timeout_s=...)``); None: no limit.
        approval: ``@tool(approval=...)``: False (default), True (every call needs a person's
            approval), or ``approval(arguments) -> bool`` (the validated arguments by
            parameter name: approval only for the calls it returns True for).
    """

    name: str
    description: str
    function: Callable[..., Any] = field(repr=False)
    spec: ToolSpec = field(repr=False)
    arguments_model: type[pydantic.BaseModel] | None = field(repr=False)
    replay: ReplayPolicy = ReplayPolicy.never
    reconcile_hook: ReconcileHook | None = field(default=None, repr=False)
    completion_marker: bool = False
    is_async: bool = False
    context_parameter: str | None = None
    source_file: str | None = field(default=None, repr=False)
    origin: str | None = None
    timeout_s: float | None = None
    approval: bool | Callable[[dict[str, Any]], bool] = field(default=False, repr=False)
    _validate: Callable[[Mapping[str, Any]], dict[str, Any]] | None = field(
        default=None, repr=False
    )
    _external: ExternalCall | None = field(default=None, repr=False)
    _params: tuple[Param, ...] = field(default=(), repr=False)
    _call_order: tuple[tuple[str, bool], ...] = field(default=(), repr=False)

    def needs_approval(self, values: dict[str, Any]) -> bool:
        """Whether the call with these validated arguments waits for a person's decision
        (``approval``). A callable that raises is taken as True: when unsure, ask."""
        approval = self.approval
        if approval is True or approval is False:
            return approval
        try:
            return approval(dict(values)) is True
        except Exception:
            log.warning(
                "tool %r: its approval callable raised; the call needs approval",
                self.name,
                exc_info=True,
            )
            return True

    def parse_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the model's arguments; return the validated values by parameter name.

        A parameter annotated with a pydantic model gets an instance of it, an enum a member.
        Defaults are filled in. The ``ToolContext`` parameter is not among them.

        For an external tool, its validator's result (the arguments as sent, once they match
        its schema).

        Raises:
            pydantic.ValidationError: an argument is missing, unknown, or of the wrong type.
            InvalidArguments: an external tool's validator refused them.
        """
        if self._validate is not None:
            return self._validate(arguments)
        assert self.arguments_model is not None
        model = self.arguments_model.model_validate(dict(arguments))
        return {p.name: getattr(model, p.field) for p in self._params}

    async def call(self, values: Mapping[str, Any], ctx: ToolContext) -> Any:
        """Call the function with validated ``values`` (from :meth:`parse_arguments`) and
        ``ctx`` injected; return what it returned.

        A sync function runs in a worker thread (``asyncio.to_thread``) so it never blocks the
        event loop; if the awaiting task is cancelled the thread cannot be stopped and runs to
        its end, its result discarded. An async function is awaited; an external tool's call is
        awaited with ``(values, ctx)``. Exceptions propagate.
        """
        if self._external is not None:
            return await self._external(values, ctx)
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, positional in self._call_order:
            value = ctx if name == self.context_parameter else values[name]
            if positional:
                args.append(value)
            else:
                kwargs[name] = value
        if self.is_async:
            return await self.function(*args, **kwargs)
        return await in_thread(self.function, *args, **kwargs)


class ToolRegistry:
    """The one list of tools: their specs, their validation, their dispatch.

    ``ToolEnvironment(registry)`` serves it to the kernel; the kernel never sees a second list.
    Tools are kept in registration order, which is the order of :meth:`specs` and
    :meth:`names`. Registration errors raise :class:`~polyloop.types.ConfigError` at once,
    naming the tool and the parameter.
    """

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._specs: tuple[ToolSpec, ...] | None = None
        self._wording: set[str] = set()

    def add_wording_version(self, version: str) -> None:
        """Record that tools on this registry write model-visible text from a wording set of
        this version (the built-in workspace tools do); ``Loop`` stores it with each run."""
        self._wording.add(version)

    @property
    def wording_versions(self) -> frozenset[str]:
        """Versions of the wording sets the registered tools write model-visible text from."""
        return frozenset(self._wording)

    @overload
    def tool(self, func: F, /) -> F: ...

    @overload
    def tool(
        self,
        func: None = None,
        /,
        *,
        name: str | None = None,
        replay: ReplayName | ReplayPolicy = "never",
        reconcile: ReconcileHook | None = None,
        completion_marker: bool = False,
        timeout_s: float | None = None,
        approval: bool | Callable[[dict[str, Any]], bool] = False,
    ) -> Callable[[F], F]: ...

    def tool(
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        replay: ReplayName | ReplayPolicy = "never",
        reconcile: ReconcileHook | None = None,
        completion_marker: bool = False,
        timeout_s: float | None = None,
        approval: bool | Callable[[dict[str, Any]], bool] = False,
    ) -> Any:
        """Register a function as a tool; usable bare (``@registry.tool``) or called
        (``@registry.tool(replay="idempotent")``). Returns the function unchanged.

        Args:
            name: the name the model calls it by; defaults to the function's ``__name__``.
            replay: ``"never"`` (default), ``"idempotent"`` or ``"reconcile"``
                (see :class:`~polyloop.types.ReplayPolicy`). It applies on resume, and also
                when the tool raises ``OutcomeUnknown`` in a live run (it cannot tell whether
                its action happened): ``never`` ends the run ``resume_state_unknown``,
                ``idempotent`` executes it again with the same ``op_id``, ``reconcile`` asks
                the hook.
            reconcile: the hook of the ``reconcile`` policy (required with it, refused
                without it).
            completion_marker: the run completes when this tool returns normally.
            timeout_s: seconds one call may take; then it is stopped and its step is an
                executed failure ("timed out after N s; side effects may have happened": it
                started, so it counts as an action). An async tool is cancelled; a sync tool's
                thread cannot be stopped and runs on, its result discarded. None: no limit.
            approval: True: every call waits for a person's decision (the run parks, durably:
                ``ApprovalRequired``; ``Loop.approve`` / ``Loop.deny`` decide from any
                process); or ``approval(arguments) -> bool``, called with the validated
                arguments by parameter name, for approval of some calls only (if it raises,
                the call needs approval). False (default): none.

        Raises:
            ConfigError: see :meth:`register`.
        """

        def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
            self.register(
                f,
                name=name,
                replay=replay,
                reconcile=reconcile,
                completion_marker=completion_marker,
                timeout_s=timeout_s,
                approval=approval,
            )
            return f

        if func is not None:
            return decorate(func)
        return decorate

    def register(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        replay: ReplayName | ReplayPolicy = "never",
        reconcile: ReconcileHook | None = None,
        completion_marker: bool = False,
        timeout_s: float | None = None,
        approval: bool | Callable[[dict[str, Any]], bool] = False,
    ) -> Tool:
        """Register ``func`` (the non-decorator form of :meth:`tool`); return its :class:`Tool`.

        The schema comes from the signature: each parameter becomes a property, typed by its
        annotation (unannotated means any JSON value), required unless it has a default. The
        description is the docstring's first paragraph; a Google-style ``Args:`` section gives
        the parameters' descriptions. A parameter annotated ``ToolContext`` (or
        ``ToolContext | None``) is injected at call time and is not in the schema.

        Raises:
            ConfigError: the name is taken or not ``^[a-zA-Z0-9_-]{1,64}$``; the function has
                no docstring; it takes ``*args`` or ``**kwargs``; a parameter's type has no JSON
                schema or its annotation cannot be resolved; the ``Args:`` section documents a
                parameter that does not exist; ``replay`` is unknown; ``replay="reconcile"``
                comes without a hook, or a hook without it; ``timeout_s`` is neither None nor
                a finite number > 0; ``approval`` is neither a bool nor callable. Nothing is
                registered then.
        """
        if not callable(func) or inspect.isclass(func):
            raise ConfigError(f"a tool must be a function or a callable object, got {func!r}")
        tool_name = name if name is not None else getattr(func, "__name__", "")
        where = f"tool {tool_name!r}"
        _check_name(where, tool_name, "; pass name=... to choose a valid one")
        if tool_name in self._tools:
            raise ConfigError(
                f"{where} is already registered; tool names must be unique, "
                "pass name=... to register this one under another name"
            )
        policy = _replay_policy(where, replay, reconcile)
        check_number(
            f"{where}: timeout_s", timeout_s, above=True, none="no limit", unit=" of seconds"
        )
        _check_approval(where, approval)
        signature = read_function(where, tool_name, func)
        return self._add(
            Tool(
                name=tool_name,
                description=signature.description,
                function=func,
                spec=_spec(tool_name, signature.description, signature.schema),
                arguments_model=signature.model,
                replay=policy,
                reconcile_hook=reconcile,
                completion_marker=bool(completion_marker),
                is_async=signature.is_async,
                context_parameter=signature.context_parameter,
                source_file=signature.source_file,
                timeout_s=None if timeout_s is None else float(timeout_s),
                approval=approval,
                _params=signature.params,
                _call_order=signature.call_order,
            )
        )

    def register_external(
        self,
        name: str,
        *,
        description: str,
        parameters: Mapping[str, Any],
        validate: Callable[[Mapping[str, Any]], dict[str, Any]],
        call: ExternalCall,
        replay: ReplayName | ReplayPolicy = "never",
        reconcile: ReconcileHook | None = None,
        completion_marker: bool = False,
        origin: str | None = None,
        approval: bool | Callable[[dict[str, Any]], bool] = False,
    ) -> Tool:
        """Register a tool that is not a Python function: its JSON schema is given as it is
        (an MCP server's ``inputSchema``, say), ``validate`` checks arguments against it and
        ``call`` performs it. Validation, dispatch, replay and the synthetic observations are
        those of every other tool: ``validate`` raising is ``not_executed`` with its problems
        listed (raise :class:`InvalidArguments`), ``call`` raising is an executed failure, and
        an ``Outcome`` it returns is passed through.

        Args:
            name: the name the model calls it by.
            description: what the model reads about it.
            parameters: the JSON schema of its arguments object (copied; not checked here).
            validate: ``validate(arguments) -> values``; raises :class:`InvalidArguments`.
            call: ``await call(values, ctx)``; returns what the tool returned.
            replay, reconcile, completion_marker, approval: as for :meth:`register`.
            origin: where the tool comes from, shown in errors and listings.

        Raises:
            ConfigError: the name is taken or invalid (the message names ``origin``), the
                schema is not a JSON object, or the replay policy is wrong (see
                :meth:`register`). Nothing is registered then.
        """
        where = f"tool {name!r}" + (f" (from {origin})" if origin else "")
        _check_name(where, name, "")
        if name in self._tools:
            raise ConfigError(f"{where}: a tool of that name is already registered")
        if not isinstance(parameters, Mapping):
            raise ConfigError(f"{where}: its parameters schema must be a JSON object")
        policy = _replay_policy(where, replay, reconcile)
        _check_approval(where, approval)
        return self._add(
            Tool(
                name=name,
                description=description,
                function=call,
                spec=_spec(name, description, _json_copy(parameters)),
                arguments_model=None,
                replay=policy,
                reconcile_hook=reconcile,
                completion_marker=bool(completion_marker),
                is_async=True,
                origin=origin,
                approval=approval,
                _validate=validate,
                _external=call,
            )
        )

    def _add(self, tool: Tool) -> Tool:
        self._tools[tool.name] = tool
        self._specs = None  # specs() builds them again
        return tool

    def specs(self) -> tuple[ToolSpec, ...]:
        """The tool specs, in registration order (cached until a tool is added). Deterministic:
        the same registrations give equal specs. Do not mutate them."""
        if self._specs is None:
            self._specs = tuple(t.spec for t in self._tools.values())
        return self._specs

    def get(self, name: str) -> Tool | None:
        """The tool registered under ``name``, or None."""
        return self._tools.get(name)

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)!r})"


def _check_name(where: str, name: object, fix: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError(
            f"{where}: a tool name must match ^[a-zA-Z0-9_-]{{1,64}}$ (letters, digits, "
            f"'_' and '-', at most 64){fix}"
        )


def _spec(name: str, description: str, parameters: dict[str, Any]) -> ToolSpec:
    """The OpenAI tool spec the model sees."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _json_copy(value: Any) -> Any:
    """A deep copy of a JSON-like value (mappings become dicts, sequences lists)."""
    if isinstance(value, Mapping):
        return {str(k): _json_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_copy(v) for v in value]
    return value


def _check_approval(where: str, approval: object) -> None:
    if not isinstance(approval, bool) and not callable(approval):
        raise ConfigError(
            f"{where}: approval must be True, False or approval(arguments) -> bool, "
            f"got {approval!r}"
        )


def _replay_policy(where: str, replay: object, hook: ReconcileHook | None) -> ReplayPolicy:
    if isinstance(replay, ReplayPolicy):
        policy = replay
    elif isinstance(replay, str) and replay in ReplayPolicy.__members__:
        policy = ReplayPolicy(replay)
    else:
        raise ConfigError(
            f"{where}: unknown replay policy {replay!r}; use 'never', 'idempotent' or 'reconcile'"
        )
    if policy is ReplayPolicy.reconcile and hook is None:
        raise ConfigError(f"{where}: replay='reconcile' needs a reconcile=hook")
    if hook is not None and policy is not ReplayPolicy.reconcile:
        raise ConfigError(
            f"{where}: a reconcile hook is only used with replay='reconcile' "
            f"(got replay={policy.value!r})"
        )
    if hook is not None and not callable(hook):
        raise ConfigError(f"{where}: reconcile must be callable, got {hook!r}")
    return policy
