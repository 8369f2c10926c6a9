"""End-to-end: what ``polyloop run`` and ``batch`` show while a step waits — a line per model
attempt that fails (without a terminal), a live line of the call in flight (on a terminal,
driven here under a pseudo-terminal), and batch counts that are right, with the pace.

Every command runs as ``python -m polyloop.cli ...`` against the fake OpenAI server on
127.0.0.1 (see ``test_cli.py``).
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli import CLI, SlowableServer, cli, fake, run_args, slow, workspace
from tests.fakes.openai_server import completion, server_error

pytest.importorskip("typer")
pytest.importorskip("openai")

__all__ = ["cli", "fake", "workspace"]  # fixtures


def test_without_a_terminal_each_failed_attempt_is_a_line_naming_why(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(server_error(503), completion("done"))
    done = cli(*run_args(fake, workspace))
    assert done.code == 0, done
    failed = re.search(r"^step +0  attempt 1/3 failed after [\d.]+ s: (.+)$", done.out, re.M)
    assert failed, done
    assert "503" in failed.group(1) or "server" in failed.group(1), done
    assert done.out.index(failed.group(0)) < done.out.index("agent_finished"), done


def read_until(fd: int, pattern: str, timeout: float) -> str:
    """What the terminal showed until ``pattern`` appeared (or the deadline)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the process closed the terminal
                break
            if not chunk:
                break
            seen += chunk
            if re.search(pattern, seen.decode("utf-8", "replace")):
                break
    return seen.decode("utf-8", "replace")


def test_on_a_terminal_a_live_line_says_which_call_waits_and_for_how_long(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(slow(completion("done"), 4.0))
    master, slave = pty.openpty()
    env = {**cli.env, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(
        cli.argv(run_args(fake, workspace)), cwd=cli.cwd, env=env,
        stdin=slave, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    try:
        shown = read_until(master, r"model call  attempt 1/3  [\d.]+ s", timeout=30)
        assert re.search(r"step +0  model call  attempt 1/3  [\d.]+ s", shown), shown
        assert proc.poll() is None, "the line was drawn while the call was in flight"
        rest = read_until(master, r"agent_finished after", timeout=30)
        assert "agent_finished after 1 steps" in rest, shown + rest
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_batch_counts_the_runs_in_flight_right_and_shows_the_pace(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    goals = cli.cwd / "goals.jsonl"
    goals.write_text("".join(json.dumps({"goal": f"g{i}"}) + "\n" for i in range(4)))
    fake.script(*(slow(completion(f"answer {i}"), 0.5) for i in range(4)))
    done = cli(
        "batch", str(goals), "--model", "openai:test-model", "--base-url", fake.url,
        "--workspace", str(workspace), "--tools", "files", "--journal", "b.db",
        "--concurrency", "2",
    )  # fmt: skip
    assert done.code == 0, done
    shown = re.findall(r"^done (\d)/4  running (\d)(.*)$", done.out, re.M)
    assert all(int(running) <= 2 for _, running, _ in shown), done
    lines = [line for line in shown if line[0] != "0"]  # a line per run that came back
    assert [int(d) for d, _, _ in lines] == [1, 2, 3, 4], done
    for d, running, _ in lines:  # a worker that finishes a run takes the next one at once
        assert int(running) == min(2, 4 - int(d)), done
    assert all(re.search(r"  [\d.]+ runs/min  tokens [\d,]+", rest) for _, _, rest in lines), done
    assert re.search(r"left ~\d+ s", lines[0][2]), done
