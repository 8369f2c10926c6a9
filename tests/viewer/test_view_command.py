"""``polyloop view`` as a subprocess: it serves the journal on 127.0.0.1 and stops on Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("typer")


def test_view_serves_the_journal_and_stops_on_ctrl_c(journal_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POLYLOOP_")}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "polyloop.cli",
            "view",
            "--journal",
            str(journal_path),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert match, line
        url = match.group(1)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
        with opener.open(url, timeout=10) as r:
            html = r.read().decode()
        assert r.status == 200 and 'data-run="run-task_completed"' in html
        with opener.open(url + "runs/run-step_budget", timeout=10) as r:
            assert 'data-reason="step_budget"' in r.read().decode()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
