"""Text that is not valid Unicode (surrogate code points) becomes U+FFFD, counted; valid text
is handed back as the very same object."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyloop.types import REPLACEMENT, clean_json, clean_text, first_invalid

FROM_JSON = json.loads('"a\\ud800b"')  # a JSON escape of a lone surrogate
FROM_FILE_NAME = os.fsdecode(b"report_\xff.txt")  # surrogateescape: '\udcff'


def test_valid_text_is_returned_as_the_same_object() -> None:
    for text in ("", "plain ascii", "héllo wörld", "日本語", "😀 \ufffd \uffff"):
        cleaned, n = clean_text(text)
        assert cleaned is text and n == 0


@pytest.mark.parametrize(
    ("text", "expected", "n"),
    [
        (FROM_JSON, "a\ufffdb", 1),
        (FROM_FILE_NAME, "report_\ufffd.txt", 1),
        ("\udfff", "\ufffd", 1),
        ("é\ud800\udc00😀", "é\ufffd\ufffd😀", 2),  # a pair held as two code points: two
        ("\udbff" * 3, "\ufffd" * 3, 3),
    ],
)
def test_each_surrogate_becomes_one_replacement_character(text: str, expected: str, n: int) -> None:
    assert clean_text(text) == (expected, n)
    expected.encode("utf-8")  # what a journal does with it


@given(st.text())
def test_cleaned_text_always_encodes_and_keeps_its_length(text: str) -> None:
    cleaned, n = clean_text(text)
    cleaned.encode("utf-8")
    assert len(cleaned) == len(text)
    assert n == sum(a != b for a, b in zip(text, cleaned, strict=True))
    assert n == sum(0xD800 <= ord(c) <= 0xDFFF for c in text)


def test_every_key_and_string_of_a_json_value_is_cleaned() -> None:
    value = {"a\ud800": ["x\udfff", {"k": ("t\udc80", 1, None, 2.5, True)}], "ok": "fine"}
    cleaned, n = clean_json(value)
    assert n == 3
    assert cleaned == {"a\ufffd": ["x\ufffd", {"k": ("t\ufffd", 1, None, 2.5, True)}], "ok": "fine"}
    assert type(cleaned["a\ufffd"][1]["k"]) is tuple
    assert value["a\ud800"][0] == "x\udfff"  # the input is not changed


@pytest.mark.parametrize(
    "value",
    [
        {"path": "src/app.py", "lines": [1, 40]},
        MappingProxyType({"é": "ü"}),
        OrderedDict(a=[("b", 2)]),
        ["x", ("y", {"z": None})],
        7,
        None,
    ],
)
def test_a_valid_json_value_is_returned_as_the_same_object(value: Any) -> None:
    cleaned, n = clean_json(value)
    assert cleaned is value and n == 0


def test_a_mapping_that_is_not_a_dict_comes_back_as_a_dict_when_changed() -> None:
    cleaned, n = clean_json(MappingProxyType({"p": "\udcff"}))
    assert cleaned == {"p": "\ufffd"} and type(cleaned) is dict and n == 1


def test_first_invalid_names_where_the_bad_text_is() -> None:
    history = [{"role": "user", "content": "ok"}, {"role": "user", "content": "ab\udcffc"}]
    assert first_invalid(history, "history") == (
        "history[1]['content'] (code point U+DCFF at index 2)"
    )
    assert first_invalid({"bad\ud800": 1}, "metadata") == (
        "a key of metadata (code point U+D800 at index 3)"
    )
    assert first_invalid("\udfff", "goal") == "goal (code point U+DFFF at index 0)"
    assert first_invalid({"k": ["fine", 1, {"é": "ü"}]}, "metadata") is None


def test_the_replacement_character_is_u_fffd() -> None:
    assert REPLACEMENT == "\ufffd"
