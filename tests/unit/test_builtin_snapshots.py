"""What the model sees of each built-in tool, pinned: a change in a spec is a visible diff.

The snapshots are ``tests/unit/snapshots/builtin_<name>.json``, made with the default settings.
After an intended change (and a new ``BuiltinTexts.version`` if the wording changed),
regenerate them with::

    POLYLOOP_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_builtin_snapshots.py

and review the diff.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from polyloop.tools.builtin import DEFAULT_BUILTIN_TEXTS, TOOL_NAMES, workspace_tools

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("POLYLOOP_UPDATE_SNAPSHOTS") == "1"


def snapshot_text(spec: Any) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_tool_spec_matches_its_snapshot(tmp_path: Path, name: str) -> None:
    if name == "shell" and shutil.which("bash") is None:
        pytest.skip("the snapshot describes the shell as bash")
    tool = workspace_tools(tmp_path).get(name)
    assert tool is not None
    actual = snapshot_text(tool.spec)
    assert str(tmp_path) not in actual  # specs never depend on where the workspace is
    path = SNAPSHOTS / f"builtin_{name}.json"
    if UPDATE:
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(
            f"no snapshot {path.name} for the built-in tool {name!r}; create it with "
            "POLYLOOP_UPDATE_SNAPSHOTS=1 pytest tests/unit/test_builtin_snapshots.py "
            "and commit it"
        )
    assert actual == path.read_text(encoding="utf-8"), (
        f"the spec of {name!r} changed; if intended, bump BuiltinTexts.version when the "
        "wording changed and regenerate with POLYLOOP_UPDATE_SNAPSHOTS=1"
    )


def test_every_snapshot_belongs_to_a_tool() -> None:
    names = {p.name for p in SNAPSHOTS.glob("builtin_*.json")}
    assert names == {f"builtin_{name}.json" for name in TOOL_NAMES}


def test_the_wording_version_is_pinned_with_the_snapshots() -> None:
    # Changing a model-visible string changes a snapshot; bump this version with it.
    assert DEFAULT_BUILTIN_TEXTS.version == "polyloop-builtin-2"
