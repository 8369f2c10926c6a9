"""``fast_init`` gives a frozen, slotted dataclass an ``__init__`` that behaves exactly as the
one ``dataclasses`` generates: the same signature, values, defaults, factories, keyword-only
fields, ``__post_init__`` and errors; the class stays frozen."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from polyloop.types import ActionResult, ModelIntent, Outcome, StepRecord, Turn
from polyloop.types._fast import fast_init


def _pair() -> tuple[type[Any], type[Any]]:
    """The same class twice: with the dataclass __init__, and with fast_init's."""

    def make() -> type[Any]:
        @dataclass(frozen=True, slots=True)
        class Sample:
            a: int
            b: str = "b"
            c: list[int] = field(default_factory=list)
            d: int = field(default=4, init=False)
            e: list[str] = field(default_factory=lambda: ["e"], init=False)
            f: int = field(default=6, kw_only=True)
            g: str = field(kw_only=True, default="g")

            def __post_init__(self) -> None:
                if self.a < 0:
                    raise ValueError(f"a must be >= 0, got {self.a}")
                object.__setattr__(self, "b", self.b.upper())

        return Sample

    return make(), fast_init(make())


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1,), {}),
        ((1, "x"), {}),
        ((1, "x", [3]), {"f": 9}),
        ((), {"a": 2, "g": "h", "c": [1]}),
    ],
)
def test_same_values_as_the_dataclass_init(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    plain, fast = _pair()
    a, b = plain(*args, **kwargs), fast(*args, **kwargs)
    assert dataclasses.asdict(a) == dataclasses.asdict(b)
    assert repr(a).split("(", 1)[1] == repr(b).split("(", 1)[1]


def test_factories_make_a_new_value_each_time() -> None:
    _, fast = _pair()
    one, two = fast(1), fast(1)
    assert one.c == [] and one.c is not two.c
    assert one.e == ["e"] and one.e is not two.e


def test_same_signature_and_errors() -> None:
    plain, fast = _pair()
    assert inspect.signature(plain) == inspect.signature(fast)
    assert fast.__init__.__qualname__ == plain.__init__.__qualname__
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((), {}),
        ((1, "x", [], 5), {}),
        ((1,), {"d": 3}),
        ((1,), {"zz": 3}),
        ((1,), {"a": 1}),
    ]
    for args, kwargs in calls:
        with pytest.raises(TypeError) as want:
            plain(*args, **kwargs)
        with pytest.raises(TypeError) as got:
            fast(*args, **kwargs)
        assert str(got.value) == str(want.value)
    with pytest.raises(ValueError, match="a must be >= 0, got -1"):
        fast(-1)


def test_stays_frozen() -> None:
    _, fast = _pair()
    value = fast(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        value.a = 2
    assert not hasattr(value, "__dict__")


def test_refuses_what_it_does_not_implement() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    for cls in (Mutable, NoSlots, WithInitVar, int):
        with pytest.raises(TypeError, match="fast_init"):
            fast_init(cls)


@pytest.mark.parametrize("cls", [StepRecord, Outcome, ModelIntent, ActionResult, Turn])
def test_the_records_keep_the_dataclass_signature(cls: type[Any]) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in fields if f.init]
    for p, f in zip(params, [f for f in fields if f.init], strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default is f.default
        elif f.default_factory is dataclasses.MISSING:
            assert p.default is inspect.Parameter.empty
