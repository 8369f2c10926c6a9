"""Stopping and cancelling a run that another process drives, on SQLite and PostgreSQL, with real
processes: the owner is a child process advancing the run; the request comes from this one (or
from two children racing). The owner learns of a request at its next heartbeat (its lease
renewal returns it), so every owner here renews every 0.2 s (``lease_ttl_s=0.6``) unless the
test needs it not to.

The time from the request to the run's end record is printed (``-s`` shows it), never asserted:
bench/stop_latency.py measures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from polyloop import Limits, Loop, ModelReply, StopReason, ToolRegistry
from polyloop.testing import FunctionModel
from polyloop.types import ActionIntent, ModelRequest, RunEnd, RunSpec, StepWritten
from tests.conftest import call
from tests.durability.journals import REPO, Store, records_of

HEARTBEAT_TTL_S = 0.6  # the owners renew (and so look for requests) every 0.2 s


def owner_tools(hold_s: float) -> ToolRegistry:
    """``tick`` (a short step), ``hold`` (``hold_s`` seconds; says ``holding`` on stdout when
    it starts), ``forever`` (says ``holding``, never returns)."""
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    async def tick() -> str:
        """A short step."""
        await asyncio.sleep(0.01)
        return "ticked"

    @tools.tool
    async def hold() -> str:
        """A long action."""
        print("holding", flush=True)
        await asyncio.sleep(hold_s)
        return "held to the end"

    @tools.tool
    async def forever() -> str:
        """Never returns."""
        print("holding", flush=True)
        await asyncio.Event().wait()
        return "never"

    return tools


def owner_script(ticks: int, then: str) -> Any:
    """``tick`` for steps 0..ticks-1, then ``then`` at every step."""

    def fn(request: ModelRequest) -> ModelReply:
        return call("tick") if request.step_idx < ticks else call(then)

    return fn


_OWNER = """
import asyncio, json, sys
from polyloop import Limits, Loop
from polyloop.testing import FunctionModel
from tests.durability.crash_child import opened_journal
from tests.durability.test_stop_requests_processes import owner_script, owner_tools

async def main(where, run_id, ticks, then, hold_s, ttl, grace):
    journal = await opened_journal(where)
    loop = Loop(FunctionModel(owner_script(int(ticks), then)), tools=owner_tools(float(hold_s)),
                journal=journal, limits=Limits(max_steps=100_000), lease_ttl_s=float(ttl),
                cancel_grace_s=float(grace))
    print("ready", flush=True)
    r = await loop.run("g", run_id=run_id)  # returns: a request never raises into its caller
    print(json.dumps({"stop_reason": r.stop_reason, "stop_detail": r.stop_detail,
                      "steps": r.steps_used, "last": r.steps[-1].observation if r.steps else None}),
          flush=True)
    await journal.aclose()

asyncio.run(main(*sys.argv[1:]))
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


class Owner:
    """A child process driving run ``run_id`` (see ``_OWNER``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if not raw:
            assert self.proc.stderr is not None
            err = (await self.proc.stderr.read()).decode()
            raise AssertionError(f"the owner exited early: {err}")
        return raw.decode().strip()

    async def result(self) -> dict[str, Any]:
        """What its ``run`` returned (it exits after printing it)."""
        while True:
            text = await self.line()
            if text.startswith("{"):
                out: dict[str, Any] = json.loads(text)
                assert await asyncio.wait_for(self.proc.wait(), 60) == 0
                return out


@contextlib.asynccontextmanager
async def owner(
    store: Store,
    run_id: str,
    *,
    ticks: int = 2,
    then: str = "tick",
    hold_s: float = 1.5,
    ttl: float = HEARTBEAT_TTL_S,
    grace: float = 30.0,
) -> AsyncIterator[Owner]:
    argv = [store.where, run_id, str(ticks), then, str(hold_s), str(ttl), str(grace)]
    async with spawn_owner(_OWNER, argv) as child:
        yield child


@contextlib.asynccontextmanager
async def spawn_owner(script: str, argv: list[str]) -> AsyncIterator[Owner]:
    """``script`` in a child process with ``argv``, once it printed ``ready``; killed after."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *argv, cwd=REPO, env=child_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    child = Owner(proc)
    try:
        assert await child.line() == "ready"
        yield child
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def requester(journal: Any) -> Loop:
    """A Loop of this process, on the same store (its model is never called)."""
    return Loop(FunctionModel(lambda r: pytest.fail("no model call")), journal=journal)


async def wait_for_steps(journal: Any, run_id: str, n: int) -> None:
    """Until the run has ``n`` steps (polled: the owner is another process)."""
    while True:
        rows = await journal.list_runs(run_id=run_id)
        if rows and rows[0]["steps_used"] >= n:
            return
        await asyncio.sleep(0.02)


async def wait_until_ended(journal: Any, run_id: str) -> float:
    """Seconds until the run's end record is visible (polled)."""
    t0 = time.monotonic()
    while True:
        rows = await journal.list_runs(run_id=run_id)
        if rows[0]["status"] == "ended":
            return time.monotonic() - t0
        await asyncio.sleep(0.005)


def one_end(store: Store, run_id: str) -> None:
    ends = store.sql("SELECT count(*) FROM journal WHERE run_id = ? AND kind = 'end'", run_id)
    assert ends == [(1,)], ends


# -- a live owner -----------------------------------------------------------------------------


async def test_a_live_owner_in_another_process_stops_at_its_next_heartbeat(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal, owner(store, "live", ticks=10**6) as child:
        await wait_for_steps(journal, "live", 3)
        answer = await requester(journal).stop("live", "enough ticking", by="the test")
        assert answer.happened == "requested"
        waited = await wait_until_ended(journal, "live")
        print(f"\n{type(journal).__name__}: stopped {waited * 1000:.0f} ms after the request "
              f"(heartbeat every {HEARTBEAT_TTL_S / 3:.1f} s)")  # fmt: skip
        done = await child.result()
        assert (done["stop_reason"], done["stop_detail"]) == ("stopped", "enough ticking")
        records = await records_of(journal, "live")
    assert records[-2].kind == "step" and isinstance(records[-1], RunEnd)  # at a boundary
    assert done["steps"] == sum(isinstance(r, StepWritten) for r in records)
    row = store.rows("SELECT stop_reason, request, requested_by FROM runs")[0]
    assert row == {"stop_reason": "stopped", "request": "stop", "requested_by": "the test"}
    one_end(store, "live")


async def test_a_stop_during_an_action_in_flight_elsewhere_records_that_step_first(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal, owner(store, "s", then="hold") as child:
        assert await child.line() == "holding"  # step 2's action runs for 1.5 s
        assert (await requester(journal).stop("s", "halt")).happened == "requested"
        done = await child.result()
    assert done == {
        "stop_reason": "stopped",
        "stop_detail": "halt",
        "steps": 3,
        "last": "held to the end",
    }
    one_end(store, "s")


async def test_a_cancel_of_a_live_owner_elsewhere_gives_its_action_the_grace_and_returns(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal, owner(store, "c", then="hold") as child:
        assert await child.line() == "holding"
        answer = await requester(journal).cancel("c", reason="wrong goal")
        assert answer.happened == "requested"
        done = await child.result()  # run() returned: nobody cancelled the child's caller
    assert done == {
        "stop_reason": "cancelled",
        "stop_detail": "wrong goal",
        "steps": 3,
        "last": "held to the end",
    }


async def test_a_cancelled_action_elsewhere_that_outlives_the_grace_is_named(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal, owner(store, "c", then="forever", grace=0.2) as child:
        assert await child.line() == "holding"
        await requester(journal).cancel("c")
        done = await child.result()
    assert (done["stop_reason"], done["steps"]) == ("cancelled", 2)
    assert done["stop_detail"].startswith("in-flight action op_id=")
    assert "tool=forever" in done["stop_detail"] and "outcome unknown" in done["stop_detail"]


# -- no live owner ----------------------------------------------------------------------------


async def test_a_sigkilled_owner_is_ended_at_once_its_action_in_flight_named(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        async with owner(store, "k", then="forever", ttl=3600) as child:  # never expires
            assert await child.line() == "holding"
            child.proc.send_signal(signal.SIGKILL)
            await child.proc.wait()
        answer = await requester(journal).stop("k", "owner is gone")
        assert (answer.happened, answer.stop_reason) == ("ended", StopReason.stopped)
        r = await requester(journal).resume("k")  # ended: read only, no model call
        records = await records_of(journal, "k")
    intent = records[-2]
    assert isinstance(intent, ActionIntent) and intent.action.tool_name == "forever"
    assert r.pending_action is not None and r.pending_action.op_id == intent.op_id
    pending = r.pending_action.describe()
    assert r.stop_detail == f"owner is gone; in-flight action {pending}: outcome unknown"
    one_end(store, "k")


async def test_a_request_stored_while_its_owner_lived_is_honoured_by_the_next_resume(
    journal_backend: Store,
) -> None:
    store = journal_backend
    async with store.journal() as journal:
        # The owner renews only every 20 minutes: it dies before it learns of the request.
        async with owner(store, "p", then="forever", ttl=3600) as child:
            assert await child.line() == "holding"
            assert (await requester(journal).stop("p", "halt")).happened == "requested"
            child.proc.send_signal(signal.SIGKILL)
            await child.proc.wait()
        assert store.sql("SELECT status, request FROM runs") == [("running", "stop")]
        r = await Loop(
            FunctionModel(lambda r: pytest.fail("honoured before any model call")),
            tools=owner_tools(0.0),
            journal=journal,
        ).resume("p")
    assert r.stop_reason == StopReason.stopped and r.steps_used == 2
    assert r.pending_action is not None and r.pending_action.tool_name == "forever"
    one_end(store, "p")


_RACER = """
import asyncio, json, sys
from polyloop import Loop
from polyloop.testing import FunctionModel
from tests.durability.crash_child import opened_journal

async def main(where, run_id, kind, by):
    journal = await opened_journal(where)
    loop = Loop(FunctionModel(lambda r: "unused"), journal=journal)
    print("ready", flush=True)
    sys.stdin.readline()  # every racer is ready: go
    if kind == "stop":
        answer = await loop.stop(run_id, f"stop by {by}", by=by)
    else:
        answer = await loop.cancel(run_id, reason=f"cancel by {by}", by=by)
    print(json.dumps({"happened": answer.happened, "by": answer.request.by if answer.request
                      else None, "stop_reason": answer.stop_reason}), flush=True)
    await journal.aclose()

asyncio.run(main(*sys.argv[1:]))
"""


async def racer(store: Store, run_id: str, kind: str, by: str) -> asyncio.subprocess.Process:
    """A child that sends one request (``_RACER``) when it reads a line on stdin."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", _RACER, store.where, run_id, kind, by, cwd=REPO, env=child_env(),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.parametrize(
    "kinds", [("stop", "stop"), ("stop", "cancel")], ids=["stop-stop", "stop-cancel"]
)
async def test_two_requests_racing_end_a_detached_run_once_and_the_loser_says_who_won(
    kinds: tuple[str, str], journal_backend: Store
) -> None:
    store = journal_backend
    runs = [f"race{i}" for i in range(4)]
    async with store.journal() as journal:
        for run_id in runs:  # rows made ahead and never started (as a batch queues them)
            lease = await journal.create(RunSpec(run_id, "g", Limits(), 0.0), ttl_s=30)
            await journal.release(lease)
    for run_id in runs:
        racers = [await racer(store, run_id, kind, f"racer{i}") for i, kind in enumerate(kinds)]
        for r in racers:
            assert r.stdout is not None
            assert (await asyncio.wait_for(r.stdout.readline(), 60)).strip() == b"ready"
        for r in racers:
            assert r.stdin is not None
            r.stdin.write(b"go\n")
            await r.stdin.drain()
        answers = []
        for r in racers:
            out, _ = await asyncio.wait_for(r.communicate(), 60)
            answers.append(json.loads(out.decode().strip().splitlines()[-1]))
        won = [a for a in answers if a["happened"] == "ended"]
        lost = [a for a in answers if a["happened"] == "already_ended"]
        assert len(won) == 1 and len(lost) == 1, answers
        assert lost[0]["by"] == won[0]["by"]  # the loser names the request that ended it
        assert lost[0]["stop_reason"] == won[0]["stop_reason"]
        one_end(store, run_id)
        row = store.rows("SELECT stop_reason, requested_by FROM runs WHERE run_id = ?", run_id)
        assert row == [{"stop_reason": won[0]["stop_reason"], "requested_by": won[0]["by"]}]
