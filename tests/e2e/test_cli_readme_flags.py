"""The README's description of the ``polyloop`` command names every verb and every flag that
``polyloop VERB --help`` lists (typer builds the help from the same definitions, so a flag
added without its documentation fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

typer = pytest.importorskip("typer")

README = Path(__file__).resolve().parents[2] / "README.md"


def _commands() -> dict[str, list[str]]:
    from polyloop.cli.app import app

    root = typer.main.get_command(app)
    out = {}
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        flags = [
            opt
            for param in command.params
            for opt in (*param.opts, *param.secondary_opts)
            if opt.startswith("--") and opt != "--help"
        ]
        out[name] = flags
    return out


@pytest.mark.parametrize("verb", sorted(_commands()))
def test_the_readme_names_every_flag_of_the_verb(verb: str) -> None:
    text = README.read_text(encoding="utf-8")
    assert f"polyloop {verb}" in text, f"the README never shows polyloop {verb}"
    missing = [f for f in _commands()[verb] if not re.search(re.escape(f) + r"(?![\w-])", text)]
    assert not missing, f"polyloop {verb}: the README does not name {missing}"
