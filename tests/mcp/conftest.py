"""Real MCP servers for the tests of polyloop.tools.mcp: mcp-server-time and mcp-server-git
(PyPI, installed by the dev extra), @modelcontextprotocol/server-everything and
@modelcontextprotocol/server-filesystem (npm: installed into a cache folder by
.ci/mcp_servers.sh when missing, with Node itself), and the SDK-built faulty_server.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The command-line tests (test_mcp_cli.py) use the end-to-end suite's fixtures.
from tests.e2e.test_cli import cli, fake, workspace  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
FAULTY = Path(__file__).with_name("faulty_server.py")
TIME = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]


@pytest.fixture(scope="session")
def npm_bin() -> Path:
    """The folder of the npm servers' executables (installed when missing)."""
    out = subprocess.run(
        ["bash", str(ROOT / ".ci" / "mcp_servers.sh")],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def everything(npm_bin: Path) -> list[str]:
    return [str(npm_bin / "mcp-server-everything")]


@pytest.fixture
def filesystem(npm_bin: Path) -> list[str]:
    return [str(npm_bin / "mcp-server-filesystem")]


@pytest.fixture
def faulty_log(tmp_path: Path) -> Path:
    return tmp_path / "faulty.log"


def faulty_argv() -> list[str]:
    return [sys.executable, str(FAULTY)]


def faulty_env(log: Path, **flags: str) -> dict[str, str]:
    return {**os.environ, "FAULTY_LOG": str(log), **flags}


def read_log(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def git_repo(path: Path, *, staged: str | None = None) -> Path:
    """A repository with one commit ("first") of a.txt; ``staged``: new a.txt text, staged."""
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com"}
    env |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    for args in (["init", "-q", "-b", "main"], ["config", "user.name", "t"]):
        subprocess.run(["git", *args], cwd=path, check=True, env=env)
    subprocess.run(["git", "config", "user.email", "t@example.com"], cwd=path, check=True)
    (path / "a.txt").write_text("one\n")
    subprocess.run(["git", "add", "a.txt"], cwd=path, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "first"], cwd=path, check=True, env=env)
    if staged is not None:
        (path / "a.txt").write_text(staged)
        subprocess.run(["git", "add", "a.txt"], cwd=path, check=True)
    return path


def commits(repo: Path) -> list[str]:
    out = subprocess.run(
        ["git", "log", "--format=%s"], cwd=repo, check=True, capture_output=True, text=True
    )
    return out.stdout.split("\n")[:-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HttpServer:
    """server-everything in its Streamable HTTP mode, on a free port of 127.0.0.1."""

    def __init__(self, argv: list[str]) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen(
            [*argv, "streamableHttp"],
            env={**os.environ, "PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None:
                    break
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server-everything did not listen on port {self.port}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def everything_http(everything: list[str]) -> Iterator[HttpServer]:
    server = HttpServer(everything)
    try:
        yield server
    finally:
        server.stop()
