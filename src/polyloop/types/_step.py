"""The step record (kernel.md §7, schema version 1.0): one row of the trajectory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ._canonical import canonical_json
from ._enums import ActionStatus
from ._errors import JournalError
from ._fast import fast_init

__all__ = ["STEP_SCHEMA_VERSION", "StepRecord"]

STEP_SCHEMA_VERSION = "1.0"
_SUPPORTED_MAJOR = 1


def _fail(name: str, expected: str, value: object) -> TypeError:
    return TypeError(f"StepRecord.{name} must be {expected}, got {value!r}")


@fast_init
@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of a run's trajectory. Immutable; validated at construction.

    The field names are a public data format (the ``steps`` table has a column per field);
    they never change. What each kind of step holds (model failure, invalid decision, final
    answer, steered final answer, not executed, executed, env error) is the table in
    kernel.md §7; the contract tests assert every row of it. The fields after
    ``schema_version`` were added to schema 1.0 with their defaults, a compatible change: a
    record written without one reads as its default.

    Invariants checked here: counts are >= 0; ``llm_call_id`` is None or non-empty (never "");
    ``schema_version`` has major version 1.
    """

    step_idx: int
    """Position in the trajectory, from 0."""
    raw_response: str
    """Model output before parsing: the visible text, plus a newline and the canonical JSON of
    native tool calls as received. "" for a model-failure step."""
    response_chars: int
    """``len(visible text)``, counted by PolyLoop."""
    reasoning_chars: int
    """``len(reasoning or "")``, counted by PolyLoop."""
    action: str | None
    """How the action appears in the trajectory (the interpreter decides); None without one."""
    parse_ok: bool
    """The reply was read as an action or a final answer."""
    parse_error: str | None
    """The feedback sent to the model on an invalid decision."""
    observation: str | None
    """The environment's text in full (or PolyLoop's synthetic text)."""
    observation_synthetic: bool
    """PolyLoop wrote ``observation``, not the environment."""
    observation_truncated_chars: int
    """Characters of the observation the model did not see (PolyLoop's cut plus the tool's)."""
    prompt_chars: int
    """Size of the prompt for this step, in code points (kernel.md §7)."""
    llm_call_id: str | None
    """Join key to the model-call accounts; None only on a model-failure step."""
    step_wall_ms: float
    """The whole step: model (with retries and backoff), interpretation and execution."""
    tool_name: str | None = None
    """Tool actions only."""
    tool_args_json: str | None = None
    """Tool actions only: the arguments as canonical JSON."""
    action_status: ActionStatus | None = None
    """``executed`` / ``not_executed`` / ``env_error``; None when the step has no action."""
    completed: bool = False
    """The environment's completion signal for this step."""
    schema_version: str = STEP_SCHEMA_VERSION
    """Version of this record's format; a reader meeting an unknown major fails loudly."""
    replaced_chars: int = 0
    """Code points of text that entered PolyLoop in this step that were not valid Unicode
    (lone surrogates), each replaced with U+FFFD; 0 if none. Counted wherever the kernel
    received text: the model reply, the decision, the outcome, guard feedback and error
    messages; a bad code point that reaches two of them (a tool argument and the action text
    built from it) counts in each."""
    model: str | None = None
    """The ``name`` of the model whose reply this step holds: the one of a ``FallbackModel``'s
    models that answered, or the adapter's name (``"openai:gpt-4o-mini"``); None on a
    model-failure step and for a model without a name. The provider's own name for the model
    that answered is in the journal's ``model_calls.response_model``."""
    wrap_up: bool = False
    """The step of the one extra model call ``Loop(wrap_up=True)`` makes when a budget ends
    the run: tools withheld, the model asked for its best final answer (``WHERE wrap_up = 1``
    finds them; the run's stop reason stays the budget's)."""
    outcome_unknown: str | None = None
    """``"replayed"`` or ``"reconciled"`` on the step of an action whose live execution
    reported its outcome unknown (the tool raised ``OutcomeUnknown``): the path that gave the
    step its outcome (executed again with the same ``op_id``, or the environment's reconcile
    answer); None otherwise."""

    def __post_init__(self) -> None:
        # Straight-line checks (no loops over names, no getattr): every step passes here.
        if type(self.step_idx) is not int or self.step_idx < 0:
            raise _fail("step_idx", "an int >= 0", self.step_idx)
        if type(self.response_chars) is not int or self.response_chars < 0:
            raise _fail("response_chars", "an int >= 0", self.response_chars)
        if type(self.reasoning_chars) is not int or self.reasoning_chars < 0:
            raise _fail("reasoning_chars", "an int >= 0", self.reasoning_chars)
        n = self.observation_truncated_chars
        if type(n) is not int or n < 0:
            raise _fail("observation_truncated_chars", "an int >= 0", n)
        if type(self.prompt_chars) is not int or self.prompt_chars < 0:
            raise _fail("prompt_chars", "an int >= 0", self.prompt_chars)
        if type(self.replaced_chars) is not int or self.replaced_chars < 0:
            raise _fail("replaced_chars", "an int >= 0", self.replaced_chars)
        if not isinstance(self.raw_response, str):
            raise _fail("raw_response", "a str", self.raw_response)
        if self.action is not None and not isinstance(self.action, str):
            raise _fail("action", "a str or None", self.action)
        if self.parse_error is not None and not isinstance(self.parse_error, str):
            raise _fail("parse_error", "a str or None", self.parse_error)
        if self.observation is not None and not isinstance(self.observation, str):
            raise _fail("observation", "a str or None", self.observation)
        if self.tool_name is not None and not isinstance(self.tool_name, str):
            raise _fail("tool_name", "a str or None", self.tool_name)
        if self.tool_args_json is not None and not isinstance(self.tool_args_json, str):
            raise _fail("tool_args_json", "a str or None", self.tool_args_json)
        if self.model is not None and not isinstance(self.model, str):
            raise _fail("model", "a str or None", self.model)
        if self.outcome_unknown is not None and not isinstance(self.outcome_unknown, str):
            raise _fail("outcome_unknown", "a str or None", self.outcome_unknown)
        if type(self.parse_ok) is not bool:
            raise _fail("parse_ok", "a bool", self.parse_ok)
        if type(self.observation_synthetic) is not bool:
            raise _fail("observation_synthetic", "a bool", self.observation_synthetic)
        if type(self.completed) is not bool:
            raise _fail("completed", "a bool", self.completed)
        if type(self.wrap_up) is not bool:
            raise _fail("wrap_up", "a bool", self.wrap_up)
        call_id = self.llm_call_id
        if call_id is not None and (not isinstance(call_id, str) or not call_id):
            raise _fail("llm_call_id", 'None or a non-empty str (never "")', call_id)
        wall = self.step_wall_ms
        if type(wall) is not float and (
            isinstance(wall, bool) or not isinstance(wall, int | float)
        ):
            raise _fail("step_wall_ms", "a number", wall)
        if wall < 0:
            raise _fail("step_wall_ms", "a number >= 0", wall)
        status = self.action_status
        if status is not None and type(status) is not ActionStatus:
            try:
                object.__setattr__(self, "action_status", ActionStatus(status))
            except ValueError:
                raise _fail("action_status", "an ActionStatus or None", status) from None
        if self.schema_version is not STEP_SCHEMA_VERSION:
            _check_version(self.schema_version)

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (``action_status`` as its string)."""
        out = {name: getattr(self, name) for name in _FIELD_NAMES}
        if self.action_status is not None:
            out["action_status"] = self.action_status.value
        return out

    def to_json(self) -> str:
        """Stable JSON: sorted keys, no spaces, real unicode (the canonical form)."""
        return canonical_json(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepRecord:
        """Read a dict written by :meth:`to_dict` (or a ``steps`` row).

        Raises:
            JournalError: the record's ``schema_version`` has an unknown major version.
            TypeError: a field is missing or has the wrong type.
        """
        version = data.get("schema_version", STEP_SCHEMA_VERSION)
        _check_version(version)
        # A newer minor version may add fields with defaults: they are read past, not refused.
        return cls(**{k: v for k, v in data.items() if k in _FIELD_SET})

    @classmethod
    def from_json(cls, text: str) -> StepRecord:
        """Read :meth:`to_json` output. Raises like :meth:`from_dict`."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("a step record must be a JSON object")
        return cls.from_dict(data)


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(StepRecord))
_FIELD_SET = frozenset(_FIELD_NAMES)


def _check_version(version: object) -> None:
    if not isinstance(version, str):
        raise JournalError(f"step record schema_version must be a string, got {version!r}")
    major, _, _ = version.partition(".")
    if not major.isdigit() or int(major) != _SUPPORTED_MAJOR:
        raise JournalError(
            f"step record schema_version {version!r} is not readable by this PolyLoop, "
            f"which reads step record schema {STEP_SCHEMA_VERSION} (major {_SUPPORTED_MAJOR}); "
            "upgrade polyloop to read it"
        )
