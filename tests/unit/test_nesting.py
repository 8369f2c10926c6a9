"""Nesting measured and JSON written without recursion (``polyloop.types._nesting``), and
``clean_json`` at any depth."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from polyloop.types import (
    MAX_NESTING,
    NestedTooDeeply,
    canonical_json,
    clean_json,
    json_text,
    nested_deeper,
    text_nested_deeper,
)


def chain(levels: int, leaf: Any = None) -> Any:
    """``levels`` containers, alternating dicts and lists, around ``leaf``."""
    value = leaf
    for n in range(levels):
        value = {"k": value} if n % 2 else [value]
    return value


def test_nesting_counts_containers_and_stops_past_the_limit() -> None:
    assert not nested_deeper(3, 0) and not nested_deeper("[[[", 0)
    assert nested_deeper({}, 0) and not nested_deeper({}, 1)
    assert not nested_deeper(chain(MAX_NESTING)) and nested_deeper(chain(MAX_NESTING + 1))
    assert nested_deeper(chain(100_000)) and not nested_deeper(chain(100_000), 100_000)
    loop: list[Any] = []
    loop.append(loop)
    assert nested_deeper(loop)  # a value that contains itself is deeper than any limit


def test_text_nesting_counts_brackets_outside_strings() -> None:
    deep = json_text(chain(MAX_NESTING + 1))
    assert text_nested_deeper(deep) and not text_nested_deeper(json_text(chain(MAX_NESTING)))
    inside = json.dumps({"a": "[" * 500, "b": '\\"{' * 500, "c": "{" * 500 + "\\"})
    assert not text_nested_deeper(inside)
    assert text_nested_deeper('"\\\\"' + "[" * 101)  # the string closed: brackets count
    assert text_nested_deeper("[" * 101) and not text_nested_deeper("[]" * 1000)


def test_nested_too_deeply_is_a_value_error_naming_the_limit() -> None:
    exc = NestedTooDeeply(7)
    assert isinstance(exc, ValueError) and exc.limit == 7
    assert str(exc) == "nested too deeply (more than 7 levels)"


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 5 or r < 0.3:
        return rng.choice([1, -2.5, 1e300, "a,", ",", 'x"y\\', None, True, "ü\ud800", ""])
    if r < 0.65:
        keys = ["b", "a", "ä", "\\", '"', "10", "9"]
        return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    items = [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return items if r < 0.85 else tuple(items)


def test_json_text_is_canonical_json_byte_for_byte() -> None:
    rng = random.Random(28)
    for _ in range(2000):
        value = _random_value(rng)
        assert json_text(value) == canonical_json(value), value
    keys: dict[Any, Any] = {10: 1, 9: 2, 2.5: 3}
    assert json_text(keys) == canonical_json(keys) == '{"2.5":3,"9":2,"10":1}'


def test_json_text_writes_any_depth_and_refuses_what_canonical_json_refuses() -> None:
    text = json_text(chain(50_000, "x"))
    assert text.startswith('{"k":[{"k":') and text.count("[") == 25_000
    loop: list[Any] = [1]
    loop.append([loop])
    with pytest.raises(ValueError, match="Circular reference"):
        json_text(loop)
    with pytest.raises(TypeError):
        json_text(chain(500, object()))
    assert json_text(chain(3, object()), default=lambda v: "obj") == '[{"k":["obj"]}]'


def test_clean_json_cleans_at_any_depth_and_keeps_valid_values_as_they_are() -> None:
    valid = chain(50_000, "fine")
    assert clean_json(valid) == (valid, 0) and clean_json(valid)[0] is valid
    cleaned, n = clean_json(chain(50_000, "bad \ud800"))
    assert n == 1
    assert json_text(cleaned) == json_text(chain(50_000, "bad \ufffd"))
    value = {"\udcffkey": ("a", ["\ud800", 2])}
    assert clean_json(value) == ({"\ufffdkey": ("a", ["\ufffd", 2])}, 2)
