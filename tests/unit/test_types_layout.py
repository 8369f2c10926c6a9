"""The value types' modules stay small enough to read, and the journal records' JSON form
refuses what is no record in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

import polyloop
from polyloop.types import record_to_dict

SRC = Path(polyloop.__file__).parent


@pytest.mark.parametrize(
    "path",
    [*sorted((SRC / "types").glob("*.py")), SRC / "kernel" / "steps.py"],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_each_module_of_the_value_types_and_the_step_builders_is_under_600_lines(
    path: Path,
) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= 600, f"{path.relative_to(SRC)} has {lines} lines: split it by idea"


class NoRecord:
    """Has a record's ``kind`` but is of no record kind."""

    kind = "step"


def test_record_to_dict_refuses_an_object_of_no_record_kind() -> None:
    with pytest.raises(TypeError, match=r"^not a journal record: .*NoRecord"):
        record_to_dict(NoRecord())  # type: ignore[arg-type]


def test_record_to_dict_of_an_object_without_a_kind_raises_as_it_always_has() -> None:
    with pytest.raises(AttributeError, match="'object' object has no attribute 'kind'"):
        record_to_dict(object())  # type: ignore[arg-type]
