"""``ToolEnvironment``: the Environment seam over a :class:`ToolRegistry` (tools.md).

The specs the model sees, the "does this tool exist" check and the dispatch table are all the
one registry object handed in; nothing here keeps a second list.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import os
import reprlib
import traceback
from collections.abc import Mapping
from typing import Any

import pydantic

from polyloop.types import (
    DEFAULT_TEMPLATES,
    Action,
    ActionStatus,
    EnvironmentFailure,
    Escalate,
    Failure,
    Outcome,
    OutcomeUnknown,
    ReplayPolicy,
    Templates,
    ToolContext,
    ToolSpec,
    canonical_json,
    json_text,
    nested_deeper,
)

from ._deadline import keeps_own_deadline, within
from ._threads import in_thread
from .registry import InvalidArguments, Tool, ToolRegistry

__all__ = ["ToolEnvironment"]

_ANY: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Any)
_MAX_ERRORS = 20
_MAX_INPUT_CHARS = 80
# Validated arguments kept from ``replay_policy`` for the ``execute`` that follows it (the
# kernel asks for the policy, writes the intent, then executes the same Action object). Bounded:
# an action whose execution never comes (a crash, a cancellation) must not pin memory.
_MAX_REMEMBERED = 1024

# pydantic error type -> what was expected, in words a model can act on.
_EXPECTED: dict[str, str] = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer (no fractional part)",
    "float_type": "a number",
    "float_parsing": "a number",
    "decimal_type": "a number",
    "decimal_parsing": "a number",
    "bool_type": "a boolean (true or false)",
    "bool_parsing": "a boolean (true or false)",
    "string_type": "a string",
    "string_unicode": "a string",
    "bytes_type": "a string",
    "list_type": "an array",
    "tuple_type": "an array",
    "set_type": "an array",
    "frozen_set_type": "an array",
    "dict_type": "an object",
    "mapping_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
    "none_required": "null",
    "date_type": "a date (YYYY-MM-DD)",
    "date_parsing": "a date (YYYY-MM-DD)",
    "date_from_datetime_parsing": "a date (YYYY-MM-DD)",
    "datetime_type": "a date-time (ISO 8601)",
    "datetime_parsing": "a date-time (ISO 8601)",
    "datetime_from_date_parsing": "a date-time (ISO 8601)",
    "time_type": "a time (HH:MM[:SS])",
    "time_parsing": "a time (HH:MM[:SS])",
    "uuid_type": "a UUID",
    "uuid_parsing": "a UUID",
}


class ToolEnvironment:
    """The Environment seam over one :class:`ToolRegistry`.

    * ``tool_specs()`` is the registry's specs (tools registered later appear too).
    * ``execute`` never raises for a tool's own failure: an unknown tool or invalid arguments is
      ``not_executed`` with a synthetic observation saying what was wrong; an ordinary
      exception from the tool is ``executed`` (its side effects may have happened) with the
      error as a synthetic observation and an ``Outcome.failure``; ``EnvironmentFailure`` is
      ``env_error``; ``Escalate`` propagates (the kernel records the step as ``executed`` and
      ends the run ``escalated``); so does ``OutcomeUnknown`` (a sync tool's too): the tool
      cannot tell whether its action happened (a payment whose HTTP call timed out after the
      request was sent), and the kernel applies the tool's replay policy as a resume does.
      ``asyncio.CancelledError`` propagates when the call is cancelled (as other
      ``BaseException`` does): the action may then have happened or not, which
      ``replay_policy`` tells resume how to treat. A ``CancelledError`` the tool raises while
      its call is not being cancelled (it awaited something another party cancelled) is an
      ordinary exception of the tool.

    Args:
        registry: the tools; the same object the caller registers on.
        templates: the wording of the synthetic observations.
    """

    def __init__(self, registry: ToolRegistry, *, templates: Templates = DEFAULT_TEMPLATES) -> None:
        if not isinstance(registry, ToolRegistry):
            raise TypeError(f"ToolEnvironment needs a ToolRegistry, got {type(registry).__name__}")
        self._registry = registry
        self._templates = templates
        self._validated: dict[int, tuple[Action, Tool, dict[str, Any]]] = {}

    @property
    def registry(self) -> ToolRegistry:
        """The registry this environment serves (read-only)."""
        return self._registry

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The registry's tool specs, in registration order."""
        return self._registry.specs()

    async def execute(self, action: Action, ctx: ToolContext) -> Outcome:
        """Validate and run the action's tool; report what happened.

        Returns:
            ``not_executed`` (synthetic) for an unknown tool or invalid arguments; ``executed``
            with the tool's return value as text (str as-is, None as "", a pydantic model or
            any other value as canonical JSON, ``str()`` if it is not JSON-serialisable; a
            dict, list or tuple nested more than ``MAX_NESTING`` levels as its canonical JSON
            written without recursion, its values JSON cannot hold as their ``str()``, or if
            it contains itself as a shortened ``repr``; an
            ``Outcome`` returned by the tool is passed through), ``marker=True`` when a
            completion-marker tool returned normally; ``executed`` with a synthetic error
            observation and ``failure`` when the tool raised (``CancelledError`` too, when the
            call itself was not cancelled: the tool awaited something another party
            cancelled), or when it ran past its ``timeout_s`` or the run's time budget
            (``ToolContext.timeout_s``, when smaller; recorded as that timeout: stopped, its
            side effects may have happened); ``env_error`` when it raised ``EnvironmentFailure``.

        Raises:
            asyncio.CancelledError: the call was cancelled (a sync tool's thread runs on).
            Escalate: the tool hands the run to a person.
            OutcomeUnknown: the tool cannot tell whether its action happened.
        """
        tool = self._tool(action)
        if tool is None:
            return self._unknown_tool(action)
        values = self._recall(action, tool)
        if values is None:
            try:
                values = tool.parse_arguments(action.arguments or {})
            except Exception as exc:
                return self._invalid_arguments(tool, exc)
        limit: asyncio.Timeout | None = None
        seconds = tool.timeout_s
        if ctx.timeout_s is not None and not keeps_own_deadline(tool.function):
            seconds = within(seconds, ctx.timeout_s)  # the run's time budget
        try:
            if seconds is None:
                result = await tool.call(values, ctx)
            else:
                async with asyncio.timeout(seconds) as limit:
                    result = await tool.call(values, ctx)
        except TimeoutError as exc:
            if limit is None or not limit.expired() or seconds is None:
                return self._raised(tool, exc)  # the tool's own TimeoutError
            return self._timed_out(tool, seconds)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the call was cancelled
            # Nobody cancelled the call: the tool raised it itself (it awaited something that
            # another party cancelled). Like any other exception the tool raised.
            return self._raised(tool, exc)
        except (Escalate, OutcomeUnknown):
            # A hand-over, or "it cannot tell whether it happened": not a failure of the
            # tool. The kernel ends the run, or applies the tool's replay policy.
            raise
        except EnvironmentFailure as exc:
            return Outcome(
                ActionStatus.env_error,
                f"EnvironmentFailure: {exc}",
                synthetic=True,
                failure=_failure(exc, tool, error_type="EnvironmentFailure"),
            )
        except Exception as exc:
            return self._raised(tool, exc)
        if isinstance(result, Outcome):
            return _marked(tool, result)
        return Outcome(
            ActionStatus.executed, _observation_of(result), marker=tool.completion_marker
        )

    def _timed_out(self, tool: Tool, seconds: float) -> Outcome:
        text = self._templates.tool_timeout.format(name=tool.name, seconds=seconds)
        failure = Failure(None, "TimeoutError", None, f"timed out after {seconds:g} s")
        return Outcome(ActionStatus.executed, text, synthetic=True, failure=failure)

    def _raised(self, tool: Tool, exc: BaseException) -> Outcome:
        failure = _failure(exc, tool, error_type=type(exc).__name__)
        text = self._templates.tool_error.format(
            name=tool.name, error_type=failure.error_type, message=failure.message
        )
        return Outcome(ActionStatus.executed, text, synthetic=True, failure=failure)

    def replay_policy(self, action: Action) -> ReplayPolicy:
        """The tool's declared policy; ``idempotent`` for an unknown tool or invalid
        arguments (doing it again only says ``not_executed`` again)."""
        tool = self._tool(action)
        if tool is None:
            return ReplayPolicy.idempotent
        try:
            values = tool.parse_arguments(action.arguments or {})
        except Exception:
            return ReplayPolicy.idempotent
        if len(self._validated) >= _MAX_REMEMBERED:
            self._validated.clear()
        self._validated[id(action)] = (action, tool, values)
        return tool.replay

    def needs_approval(self, action: Action) -> bool:
        """Whether the action waits for a person's decision (its tool's ``approval=``; the
        :class:`~polyloop.seams.NeedsApproval` seam). False for an unknown tool or invalid
        arguments: such an action is never executed, so there is nothing to approve. The
        kernel asks right after :meth:`replay_policy`, whose validated arguments it reuses."""
        tool = self._tool(action)
        if tool is None or tool.approval is False:
            return False
        entry = self._validated.get(id(action))
        if entry is not None and entry[0] is action and entry[1] is tool:
            values = entry[2]
        else:
            try:
                values = tool.parse_arguments(action.arguments or {})
            except Exception:
                return False
        return tool.needs_approval(values)

    async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None:
        """Ask the tool's reconcile hook whether the action with ``ctx.op_id`` happened.

        The hook gets ``(ctx.op_id, validated values by parameter name)``; a sync hook runs in a
        worker thread.

        Returns:
            The hook's ``Outcome`` (it happened) or None (it did not). None also for an unknown
            tool or invalid arguments: such an action is never executed.

        Raises:
            OutcomeUnknown: the hook cannot tell, or the tool has no reconcile policy.
            TypeError: the hook returned something other than an ``Outcome`` or None.
        """
        tool = self._tool(action)
        if tool is None:
            return None
        try:
            values = tool.parse_arguments(action.arguments or {})
        except Exception:
            return None
        hook = tool.reconcile_hook
        if tool.replay is not ReplayPolicy.reconcile or hook is None:
            raise OutcomeUnknown(
                f"tool {tool.name!r} has replay policy {tool.replay.value!r}, not 'reconcile': "
                f"cannot tell whether op_id={ctx.op_id} happened"
            )
        if inspect.iscoroutinefunction(hook):
            result = await hook(ctx.op_id, values)
        else:
            result = await in_thread(hook, ctx.op_id, values)
        if result is None:
            return None
        if not isinstance(result, Outcome):
            raise TypeError(
                f"the reconcile hook of tool {tool.name!r} must return an Outcome or None, "
                f"got {type(result).__name__}"
            )
        return _marked(tool, result)  # as if the call had returned it

    def __repr__(self) -> str:
        return f"ToolEnvironment({self._registry!r})"

    # --- helpers ------------------------------------------------------------------------------

    def _recall(self, action: Action, tool: Tool) -> dict[str, Any] | None:
        """The values ``replay_policy`` validated for this very Action object and tool (once),
        so ``execute`` does not validate them a second time; None if there are none."""
        entry = self._validated.pop(id(action), None)
        if entry is None or entry[0] is not action or entry[1] is not tool:
            return None
        return entry[2]

    def _tool(self, action: Action) -> Tool | None:
        if action.tool_name is None:
            return None
        return self._registry.get(action.tool_name)

    def _unknown_tool(self, action: Action) -> Outcome:
        names = self._registry.names()
        text = self._templates.unknown_tool.format(
            name=action.tool_name, available=", ".join(names) if names else "(none)"
        )
        return Outcome(ActionStatus.not_executed, text, synthetic=True)

    def _invalid_arguments(self, tool: Tool, exc: Exception) -> Outcome:
        if isinstance(exc, pydantic.ValidationError):
            lines = [_describe(err) for err in exc.errors(include_url=False)]
        elif isinstance(exc, InvalidArguments):  # an external tool's own schema refused them
            lines = list(exc.problems)
        else:  # a user validator raised something pydantic did not wrap
            lines = [f"{type(exc).__name__}: {exc}"]
        if len(lines) > _MAX_ERRORS:
            lines = [*lines[:_MAX_ERRORS], f"... and {len(lines) - _MAX_ERRORS} more problems"]
        text = self._templates.invalid_arguments.format(
            name=tool.name, errors="\n".join(f"- {line}" for line in lines)
        )
        return Outcome(ActionStatus.not_executed, text, synthetic=True)


def _marked(tool: Tool, outcome: Outcome) -> Outcome:
    """``outcome`` with ``marker=True`` when a completion-marker tool executed."""
    if tool.completion_marker and outcome.status is ActionStatus.executed and not outcome.marker:
        return dataclasses.replace(outcome, marker=True)
    return outcome


def _observation_of(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list | tuple) and nested_deeper(value):
        return _deep_observation(value)
    if isinstance(value, pydantic.BaseModel):
        return canonical_json(value.model_dump(mode="json"))
    try:
        return canonical_json(_ANY.dump_python(value, mode="json"))
    except Exception:
        return str(value)


def _deep_observation(value: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> str:
    """A result nested more than ``MAX_NESTING`` levels (too deep for pydantic's serializer,
    the C encoder or ``repr``): its canonical JSON written without recursion, values JSON
    cannot hold as their ``str()``; one that contains itself as a shortened ``repr``."""
    try:
        return json_text(value, default=str)
    except ValueError:
        return reprlib.repr(value)


def _failure(exc: BaseException, tool: Tool, *, error_type: str) -> Failure:
    return Failure(
        check=None,
        error_type=error_type,
        top_frame=_top_frame(exc, tool.source_file),
        message=str(exc),
    )


def _top_frame(exc: BaseException, source_file: str | None) -> str | None:
    """``basename:line`` of the innermost traceback frame in the tool's own source file, else
    of the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    chosen = frames[-1]
    if source_file is not None:
        for frame in reversed(frames):
            if frame.filename == source_file:
                chosen = frame
                break
    return f"{os.path.basename(chosen.filename)}:{chosen.lineno}"


def _location(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text or "arguments"


def _shown(value: Any) -> str:
    try:
        text = canonical_json(value)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > _MAX_INPUT_CHARS:
        text = text[: _MAX_INPUT_CHARS - 1] + "…"
    return text


def _describe(err: Mapping[str, Any]) -> str:
    """One validation error as a line a model can act on, e.g.
    ``'count': expected an integer, got "three"``."""
    loc = err["loc"]
    where = repr(_location(loc))
    kind = err["type"]
    top = len(loc) <= 1
    if kind == "missing":
        return f"{where}: required {'argument' if top else 'field'} missing"
    if kind == "extra_forbidden":
        return f"{where}: unknown {'argument' if top else 'field'}"
    got = _shown(err.get("input"))
    if kind in ("enum", "literal_error"):
        expected = (err.get("ctx") or {}).get("expected", "")
        return f"{where}: expected {expected}, got {got}"
    if kind in _EXPECTED:
        return f"{where}: expected {_EXPECTED[kind]}, got {got}"
    message = err["msg"]
    if message[:1].isupper() and message[1:2].islower():
        message = message[0].lower() + message[1:]
    return f"{where}: {message}, got {got}"
