"""The lines ``polyloop show`` prints for a run's rows of the ``requests`` table (its retunes:
``Loop.set_limits`` / ``polyloop limits``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import when


def _value(v: object) -> str:
    if v is None:
        return "none"
    return f"{v:g}" if isinstance(v, float) else str(v)


def request_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """``limits request 1 by alice at 2026-12-03 10:00:00 ('why'): max_steps 30 -> 80;
    applied at …`` (``pending`` while no owner has applied it), one per row."""
    lines = []
    for r in rows:
        values = r["values"] if isinstance(r["values"], dict) else {}
        changes = ", ".join(
            f"{name} {_value(v.get('old'))} -> {_value(v.get('new'))}"
            for name, v in values.items()
            if isinstance(v, dict)
        )
        if r["applied_at"] is None:
            done = "pending (its owner applies it at its next step boundary, or the next resume)"
        else:
            done = f"{r['outcome']} at {when(r['applied_at'])}"
        reason = "" if not r["reason"] else f" ({r['reason']!r})"
        lines.append(
            f"{r['kind']} request {r['seq']} by {r['requested_by']} at "
            f"{when(r['requested_at'])}{reason}: {changes}; {done}"
        )
    return lines
