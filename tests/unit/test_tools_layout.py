"""The tools package stays easy to read: a module per idea, none over ~600 lines (a longer one
is split along its ideas, not by line count)."""

from __future__ import annotations

from pathlib import Path

import polyloop.tools

MAX_LINES = 600


def test_no_module_of_the_tools_package_is_over_600_lines() -> None:
    root = Path(polyloop.tools.__file__).parent
    lines = {
        str(path.relative_to(root)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }
    assert lines, "no modules found under polyloop/tools"
    too_long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules along their ideas: {too_long}"
