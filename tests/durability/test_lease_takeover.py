"""A dead owner's lease is taken over at once, a live one's never (durability.md "Leases"), on
SQLite and PostgreSQL, with real processes: a child advancing a run, its action in flight, is
killed with SIGKILL, and the test (its parent) resumes the run at once, before reaping it, so
the child is still being torn down or a zombie; a live and a stopped (SIGSTOP) child keep it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import polyloop
from polyloop import Loop, ModelReply, RunLeased, StopReason, ToolRegistry
from polyloop.journal._owner import parse_owner, process_start
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest
from tests.conftest import call
from tests.durability.journals import REPO, Store


def tools(*, busy: bool) -> ToolRegistry:
    """``work`` (idempotent; when ``busy``, it says so on stdout and never returns) and the
    completion marker ``submit``."""
    registry = ToolRegistry()

    @registry.tool(replay="idempotent")
    async def work() -> str:
        """Do the work."""
        if busy:
            print("busy", flush=True)
            await asyncio.Event().wait()  # in flight until the process is killed
        return "worked"

    @registry.tool(completion_marker=True)
    def submit(answer: str) -> str:
        """Submit the answer."""
        return "ok"

    return registry


def script(request: ModelRequest) -> ModelReply:
    return call("work") if request.step_idx == 0 else call("submit", {"answer": "done"})


def resumer(journal: Any) -> Loop:
    return Loop(FunctionModel(script), tools=tools(busy=False), journal=journal)


_CHILD = """
import asyncio, sys
from polyloop import Loop
from polyloop.testing import FunctionModel
from tests.durability.crash_child import opened_journal
from tests.durability.test_lease_takeover import script, tools

async def main():
    journal = await opened_journal(sys.argv[1])
    await Loop(FunctionModel(script), tools=tools(busy=True), journal=journal,
               lease_ttl_s=3600).run("g", run_id="r")  # no heartbeat during the test

asyncio.run(main())
"""


@contextlib.contextmanager
def mid_run(store: Store) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process advancing run ``r`` with its first action in flight, and the owner its
    lease names. Reaped only at the end (killed first if it still runs)."""
    src = str(Path(polyloop.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((src, str(REPO)))}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, store.where],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline().strip() if ready else ""
        if line != "busy":
            proc.kill()
            raise AssertionError(f"the child never started its action: {proc.communicate()}")
        owner = store.sql("SELECT owner FROM runs WHERE run_id = 'r'")[0][0]
        parsed = parse_owner(owner)
        assert parsed is not None and parsed.pid == proc.pid
        yield proc, owner
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def wait_until_stopped(pid: int) -> None:
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.001)


async def test_a_run_killed_mid_action_is_resumed_at_once_before_its_parent_reaps_the_child(
    journal_backend: Store,
) -> None:
    store = journal_backend
    with mid_run(store) as (child, owner):
        dead = parse_owner(owner)
        assert dead is not None and process_start(child.pid) == dead.start
        os.kill(child.pid, signal.SIGKILL)
        async with store.journal() as journal:
            r = await resumer(journal).resume("r")  # no RunLeased: the owner is dead
        # The child was not reaped meanwhile: its /proc entry (a zombie by now) is still there.
        assert process_start(child.pid) == dead.start and child.returncode is None
        assert child.wait(30) == -signal.SIGKILL
    assert r.stop_reason == StopReason.task_completed
    assert [(s.tool_name, s.observation) for s in r.steps] == [
        ("work", "worked"),
        ("submit", "ok"),
    ]
    assert store.sql("SELECT owner FROM runs") == [(None,)]


async def test_a_live_or_stopped_owner_keeps_its_lease_until_it_is_killed(
    journal_backend: Store,
) -> None:
    store = journal_backend
    with mid_run(store) as (child, owner):
        async with store.journal() as journal:
            before = store.dump()
            with pytest.raises(RunLeased) as info:
                await resumer(journal).resume("r")
            assert info.value.owner == owner
            os.kill(child.pid, signal.SIGSTOP)
            wait_until_stopped(child.pid)
            with pytest.raises(RunLeased) as info:
                await resumer(journal).resume("r")
            assert info.value.owner == owner
            assert store.dump() == before  # refused twice, nothing written
            os.kill(child.pid, signal.SIGKILL)  # stopped, then killed: dead at once
            r = await resumer(journal).resume("r")
    assert r.stop_reason == StopReason.task_completed
