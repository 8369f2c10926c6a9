"""``polyloop demo --real`` runs a short run with the real model, offline: its steps, its stop
reason (the exit code follows it) and the ``model_calls`` rows it prints agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polyloop import StopReason
from polyloop.cli.app import exit_code
from polyloop.testing.real_model import RealModel

pytestmark = pytest.mark.real_model


def test_demo_real_runs_the_real_model_and_shows_its_records(
    real_model: RealModel, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "POLYLOOP_REAL_MODEL_PY": str(real_model.python),
        "POLYLOOP_REAL_MODEL_GGUF": str(real_model.gguf),
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "polyloop.cli", "demo", "--real"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    ended = re.search(r"^  -> (\w+) after (\d+) steps, (\d+) actions$", out, re.MULTILINE)
    assert ended, out
    reason, steps = StopReason(ended.group(1)), int(ended.group(2))
    assert done.returncode == exit_code(reason), out
    assert re.search(rf"^  run demo-real: {reason}$", out, re.MULTILINE), out
    assert len(re.findall(r"^  step \d+ ", out, re.MULTILINE)) == steps, out
    calls = re.findall(r"^    (\d+)  1  ok\s+(chatcmpl-\S+)  (\d+)/(\d+)$", out, re.MULTILINE)
    assert [int(step) for step, *_ in calls] == list(range(steps)), out  # one call per step
    assert all(int(tokens_in) > 0 for _, _, tokens_in, _ in calls), out
    assert list(tmp_path.iterdir()) == [], "the demo leaves no files behind"
