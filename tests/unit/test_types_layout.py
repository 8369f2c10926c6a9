"""The journal records' JSON form has a key per field of every kind, and refuses what is no
record in one line."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import get_args

import pytest

import polyloop
from polyloop.types import Record, record_to_dict
from polyloop.types._records_form import _FORMS

SRC = Path(polyloop.__file__).parent


class NoRecord:
    """Has a record's ``kind`` but is of no record kind."""

    kind = "step"


def test_record_to_dict_refuses_an_object_of_no_record_kind() -> None:
    with pytest.raises(TypeError, match=r"^not a journal record: .*NoRecord"):
        record_to_dict(NoRecord())  # type: ignore[arg-type]


def test_record_to_dict_of_an_object_without_a_kind_raises_as_it_always_has() -> None:
    with pytest.raises(AttributeError, match="'object' object has no attribute 'kind'"):
        record_to_dict(object())  # type: ignore[arg-type]


def test_every_record_kind_has_a_json_key_per_field_in_field_order() -> None:
    # record_from_dict builds each kind from its keys positionally
    assert set(_FORMS) == set(get_args(Record))
    for kind, keys in _FORMS.items():
        assert [k.name for k in keys] == [f.name for f in fields(kind)], kind.__name__
