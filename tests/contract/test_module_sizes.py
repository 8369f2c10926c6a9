"""No module of ``polyloop`` outgrows a reader: none is over ~600 lines. A module that grows past
that is split along the ideas a reader looks for (as the journals, the adapters, the types and
the CLI were), not by line count."""

from __future__ import annotations

from pathlib import Path

import polyloop

MAX_LINES = 600
SRC = Path(polyloop.__file__).parent


def test_no_module_of_polyloop_is_over_600_lines() -> None:
    sizes = {
        str(path.relative_to(SRC)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(SRC.rglob("*.py"))
    }
    assert len(sizes) > 100, f"found only {len(sizes)} modules under {SRC}"
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules along their ideas: {too_long}"
