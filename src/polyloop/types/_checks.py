"""What a number PolyLoop is given must be: the checks of settings (a ``ConfigError`` at
construction) and of the numbers a provider reports (refused, never trusted, never fatal);
and the error of a value type's field that breaks its contract (``MalformedValue``).

A setting is a finite int or float, never a bool, within its range; where "no limit" or
"never" means something, it is None, never ``inf``. A reported token count is an int from 0 to
:data:`MAX_REPORTED`; a reported cost a finite number in the same range.
"""

from __future__ import annotations

import math
import reprlib
import sys

from ._errors import ConfigError, MalformedValue

__all__ = [
    "MAX_PRICE_PER_MTOK",
    "MAX_REPORTED",
    "bad_value",
    "check_amount",
    "check_limit",
    "check_number",
    "trusted_cost",
]

MAX_REPORTED = 10**12
"""The largest token count (or cost in US dollars) one model call may report and be believed:
no call reads or writes a trillion tokens, and the run's totals stay exact integers that every
journal's columns hold."""

MAX_PRICE_PER_MTOK = 100_000
"""A ``Pricing`` field must be below this many US dollars per million tokens (the dearest
models cost hundreds): priced at less, a believable usage costs a finite amount below
:data:`MAX_REPORTED`, so a run's live totals and those a reader of its journal believes agree."""


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def _shown(value: object) -> str:
    """``value`` for a message: bounded however large or deep it is (``reprlib``)."""
    shown = _REPR.repr(value)
    return shown if len(shown) <= 80 else shown[:79] + "…"


def check_number(
    name: str,
    value: object,
    *,
    minimum: float = 0,
    above: bool = False,
    below: float | None = None,
    none: str | None = None,
    unit: str = "",
) -> None:
    """Raise ``ConfigError`` unless ``value`` is a finite int or float (not a bool, and an
    int a float can hold) that is
    >= ``minimum`` (> with ``above``) and, given ``below``, < ``below``. ``none``: what None
    means for this setting ("no limit", "never"), which allows it; ``inf`` is then refused
    with a hint to say None. ``unit`` is named in the message (" of seconds")."""
    if value is None and none is not None:
        return
    number = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and abs(value) <= sys.float_info.max  # False for NaN, inf and ints no float holds
    )
    if number:
        n: float = value  # type: ignore[assignment]
        if (n > minimum if above else n >= minimum) and (below is None or n < below):
            return
    span = f"{'>' if above else '>='} {minimum}" + ("" if below is None else f" and < {below}")
    if number:
        hint = "; use None for " + none if none is not None and not n > minimum else ""
        what = f"a number{unit} " if unit else ""
        raise ConfigError(f"{name} must be {what}{span}, got {_shown(value)}{hint}")
    kind = f"a number{unit} {span}" + ("" if none is None else " or None")
    hint = ""
    if isinstance(value, float):
        hint = " (not a finite number)"
        if none is not None and value == math.inf:
            hint += "; use None for " + none
    raise ConfigError(f"{name} must be {kind}, got {_shown(value)}{hint}")


def check_limit(name: str, value: object, *, optional: bool) -> None:
    """A count setting: an int > 0 (not a bool); None too when ``optional`` (no limit)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a positive int or None" if optional else "a positive int"
        raise ConfigError(f"{name} must be {kind}, got {value!r}")
    if value <= 0:
        raise ConfigError(
            f"{name} must be > 0, got {value}" + ("; use None for no limit" if optional else "")
        )


def check_amount(name: str, value: object) -> None:
    """A budget in a unit of measure (dollars, seconds): a finite number > 0, or None (no
    limit)."""
    check_number(name, value, above=True, none="no limit")


def trusted_cost(value: object) -> float | None:
    """A reported cost in US dollars when it can be believed (a finite int or float, not a
    bool, from 0 to :data:`MAX_REPORTED`), else None."""
    if (type(value) is float or type(value) is int) and 0 <= value <= MAX_REPORTED:  # NaN fails
        return float(value)
    return None


def bad_value(field: str, expected: str, value: object) -> MalformedValue:
    """The error of a field that breaks its type's contract (``Outcome.completed`` ...)."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:79] + "…"
    if value is not None:
        shown += f" ({type(value).__name__})"
    return MalformedValue(f"{field} must be {expected}, got {shown}")
