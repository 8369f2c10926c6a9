"""``polyloop view`` as a subprocess: it serves the journal on 127.0.0.1 and stops on Ctrl-C."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.viewer.serve import serving

pytest.importorskip("typer")


def test_view_serves_the_journal_and_stops_on_ctrl_c(journal_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYLOOP_")}
    env["PYTHONUNBUFFERED"] = "1"
    with serving(journal_path, env) as get:
        assert 'data-run="run-task_completed"' in get("")
        assert 'data-reason="step_budget"' in get("runs/run-step_budget")
