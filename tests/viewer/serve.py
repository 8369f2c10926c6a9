"""``polyloop view`` as a subprocess, for tests that read what it serves."""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def serving(journal_path: Path, env: dict[str, str]) -> Iterator[Callable[[str], str]]:
    """Start ``polyloop view`` on a free port; yield ``get(path)`` (the text served at that
    path, on loopback, no proxy); on leaving, stop it with Ctrl-C and check it exits 0."""
    where = ("--journal", str(journal_path), "--port", "0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "polyloop.cli", "view", *where],
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

        def get(where: str) -> str:
            with opener.open(url + where, timeout=10) as r:
                assert r.status == 200
                text: str = r.read().decode()
                return text

        yield get
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
