"""The README's Python examples run as written, and its stop-reason table matches the enum."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polyloop import StopReason

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.mark.parametrize("n", range(len(python_blocks())))
def test_every_python_example_runs_and_its_assertions_hold(n: int) -> None:
    exec(compile(python_blocks()[n], f"README.md block {n}", "exec"), {})


def test_the_stop_reason_table_lists_every_value_in_enum_order() -> None:
    rows = re.findall(r"^\| `([a-z_]+)` \|", README, flags=re.M)
    values = [s.value for s in StopReason]
    assert [r for r in rows if r in values] == values


def test_the_quickstart_has_exactly_two_commands_and_ci_runs_the_second() -> None:
    quick = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quick, flags=re.S)
    assert len(commands) == 2
    assert "polyloop demo" in commands[0]
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert commands[1].replace("pip install -e", "pip install -q -e") in ci
