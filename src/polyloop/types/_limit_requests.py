"""Requests to retune a run's budgets from anywhere: ``Loop.set_limits``, ``polyloop limits``.

Each request is one row of the journal's ``requests`` table (``kind = 'limits'``): the budgets
it changes with their old and new values, who asked, why and when, and once its run's owner
has applied it, when and with what outcome. Unlike an end request (one per run, in the
``runs`` row), a run may have any number of these: they are its history of retunes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ._errors import ConfigError
from ._limits import Limits

__all__ = ["RETUNABLE", "LimitsRequest"]

RETUNABLE = ("max_steps", "max_actions", "max_tokens", "max_cost", "max_seconds")
"""The budgets ``Loop.set_limits`` may change (the ``Limits`` field names)."""

Value = int | float | None


def _number(value: Value) -> str:
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True, slots=True)
class LimitsRequest:
    """One request to change budgets of a run, as its ``requests`` row holds it.

    ``changes`` maps each budget named (a :data:`RETUNABLE` name) to its (old, new) value:
    old is what the run's stored limits held when the request was made, new what it asks
    for (None: unbounded). ``by`` is who asked (``requested_by``), ``reason`` why, ``at`` the
    requester's clock (epoch seconds, ``requested_at``). ``seq`` numbers the run's requests
    from 1 (0 before the journal stored it). ``applied_at`` (epoch seconds) and ``outcome``
    (``applied``, or ``not applied: <why>``) stay None while the request is pending.
    """

    run_id: str
    changes: Mapping[str, tuple[Value, Value]]
    by: str
    reason: str
    at: float
    seq: int = 0
    applied_at: float | None = None
    outcome: str | None = None

    @classmethod
    def make(
        cls, run_id: str, current: Limits, new: Mapping[str, Any], by: str, reason: str, at: float
    ) -> LimitsRequest:
        """The request to set ``new`` on a run whose limits are ``current``. Raises
        ``ConfigError`` (nothing is written) for an unknown name, no name at all, a reason
        that is empty, or a value ``Limits`` refuses (``max_steps`` <= 0 or None, a negative,
        zero, NaN or infinite number, a bool)."""
        unknown = sorted(set(new) - set(RETUNABLE))
        if unknown:
            raise ConfigError(
                f"cannot set limits {unknown} of run {run_id!r}: the budgets that can change "
                f"are {', '.join(RETUNABLE)}"
            )
        if not new:
            raise ConfigError(
                f"set_limits on run {run_id!r} names no budget: give one of {', '.join(RETUNABLE)}"
            )
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"set_limits on run {run_id!r} needs a reason (say why)")
        for name, value in new.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(
                    f"cannot set {name} of run {run_id!r} to {value}: give a finite number > 0"
                )
        try:
            replace(current, **new)  # Limits checks each value, once, where they enter
        except ConfigError as exc:
            raise ConfigError(f"cannot set the limits of run {run_id!r}: {exc}") from None
        changes = {name: (getattr(current, name), new[name]) for name in RETUNABLE if name in new}
        return cls(run_id, changes, by, reason, at)

    def applied_to(self, limits: Limits) -> Limits:
        """``limits`` with this request's new values. Raises ``ConfigError`` if they no longer
        hold (they were checked when the request was made)."""
        new: dict[str, Any] = {name: value for name, (_, value) in self.changes.items()}
        return replace(limits, **new)

    def values_json(self) -> str:
        """The ``requests.values_json`` column: ``{"max_steps": {"old": 30, "new": 5}}``,
        canonical JSON."""
        body = {name: {"old": old, "new": new} for name, (old, new) in self.changes.items()}
        return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @staticmethod
    def changes_of(values_json: str) -> dict[str, tuple[Value, Value]]:
        """The ``changes`` a ``values_json`` column holds."""
        body = json.loads(values_json)
        return {name: (v.get("old"), v.get("new")) for name, v in body.items()}

    def describe(self) -> str:
        """``max_steps 30 -> 5, max_tokens none -> 9000 by alice ("why")``."""
        shown = ", ".join(
            f"{name} {_number(old)} -> {_number(new)}" for name, (old, new) in self.changes.items()
        )
        return f"{shown} by {self.by} ({self.reason!r})"
