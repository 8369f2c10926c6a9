"""Files and folders that are really read-only, also for root.

Root ignores permission bits (``CAP_DAC_OVERRIDE``), and the tests and CI run as root. A child
process started with :func:`unprivileged` as its ``preexec_fn`` drops the capabilities that
bypass permission checks from its bounding set before it executes: it keeps uid 0 (so it can
still run this interpreter and read this checkout), but the owner's permission bits now apply
to it, so a folder chmodded 0o555 is one it cannot create a file in. As another user nothing
needs dropping.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import stat
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import polyloop

REPO = Path(__file__).resolve().parents[1]
SRC = Path(polyloop.__file__).resolve().parents[1]  # the tree these tests import

_PR_CAPBSET_DROP = 24
_BYPASS = (1, 2, 3)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER
_libc = ctypes.CDLL(None, use_errno=True)


def unprivileged() -> None:
    """``preexec_fn``: permission bits apply to the child, even as root."""
    if os.geteuid() != 0:
        return
    for cap in _BYPASS:
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def run_unprivileged(
    argv: Sequence[str], *, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` to completion in a process that permission bits apply to."""
    try:
        return subprocess.run(
            list(argv),
            cwd=cwd,
            env=env if env is not None else child_env(),
            preexec_fn=unprivileged,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise
    except subprocess.SubprocessError as exc:  # preexec_fn failed: no CAP_SETPCAP here
        pytest.skip(f"cannot drop CAP_DAC_OVERRIDE in a child ({exc}): run as a non-root user")


def unprivileged_view(argv: Sequence[str], *, cwd: Path, env: dict[str, str]) -> str:
    """Start ``polyloop view ... --port 0`` (``argv``) unprivileged, fetch its first page, stop
    it with Ctrl-C (it must exit 0); the page."""
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env={**env, "PYTHONUNBUFFERED": "1"},
        preexec_fn=unprivileged,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        assert match, (line, proc.stderr.read() if proc.stderr else "")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
        with opener.open(match.group(1), timeout=10) as response:
            page: str = response.read().decode()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        return page
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def child_env() -> dict[str, str]:
    """This environment, importing polyloop from the tree the tests import (and ``tests``)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO)])}


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args``, unprivileged."""
    return run_unprivileged([sys.executable, "-c", code, *args])


@contextlib.contextmanager
def read_only(*paths: Path) -> Iterator[None]:
    """``paths`` read-only for the block (folders r-x, files r--), then as they were."""
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in paths}
    try:
        for p in paths:
            p.chmod(0o555 if p.is_dir() else 0o444)
        yield
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
