"""kernel.md §6: ``kernel/stopping.py`` is the only implementation of the stop decision. Other
kernel modules carry an end out, but none of them names the reason a run stops: each takes it
from :mod:`polyloop.kernel.stopping` (comparing a reason stopping chose is reading, not choosing).
"""

from __future__ import annotations

import ast
from pathlib import Path

import polyloop.kernel

KERNEL = Path(polyloop.kernel.__file__).parent


def _chosen_outside_stopping() -> list[str]:
    """``StopReason.<member>`` anywhere but in a comparison, in kernel modules but stopping.py."""
    found = []
    for path in sorted(KERNEL.glob("*.py")):
        if path.name == "stopping.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        compared = {
            id(node)
            for cmp in ast.walk(tree)
            if isinstance(cmp, ast.Compare)
            for node in ast.walk(cmp)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "StopReason"
                and id(node) not in compared
            ):
                found.append(f"{path.name}:{node.lineno}: StopReason.{node.attr}")
    return found


def test_no_kernel_module_but_stopping_chooses_a_stop_reason() -> None:
    assert _chosen_outside_stopping() == []
