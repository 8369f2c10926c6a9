"""layout.md rule 6: an optional extra's package is imported on first use, and its absence
gives one line naming the extra to install."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polyloop.types import import_extra

HINT = "install it with: pip install 'polyloop[thing]'"


def test_a_missing_extra_raises_the_install_line_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "polyloop_fake_sdk", None)  # as if not installed
    with pytest.raises(ImportError) as info:
        import_extra("polyloop_fake_sdk", HINT)
    assert str(info.value) == HINT and info.value.__cause__ is None


def test_a_missing_parent_package_counts_as_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "polyloop_fake_ns", None)
    with pytest.raises(ImportError, match=r"^install it with: pip install 'polyloop\[thing\]'$"):
        import_extra("polyloop_fake_ns.trace", HINT, missing=("polyloop_fake_ns",))


def test_an_installed_extra_that_fails_to_import_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The package is there, but something it imports is not: not the extra's absence.
    (tmp_path / "polyloop_fake_broken.py").write_text("import polyloop_fake_absent_dep\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as info:
        import_extra("polyloop_fake_broken", HINT)
    message = str(info.value)
    assert message.startswith(HINT + " (importing it failed: ")
    assert "polyloop_fake_absent_dep" in message
    assert isinstance(info.value.__cause__, ImportError)
    assert import_extra("json", HINT) is sys.modules["json"]
