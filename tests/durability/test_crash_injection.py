"""The crash-injection proof (durability.md, "How this is proven").

A child process runs a scripted six-step run on a SQLite journal and is killed with SIGKILL
just before, then just after, every journal write in turn. The run is then resumed here, in
another process, from the file the dead child left (its lease still held by the dead owner).
For every point: a never-replay tool's side effect happened at most once; an idempotent tool
that ran before the crash saw the same op_id again; the resumed trajectory equals the
uncrashed one field by field except timings and per-run ids, or the run ended
resume_state_unknown exactly where the replay policy demands; no step lost or duplicated.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from polyloop import ReplayPolicy, StopReason
from polyloop.journal import SQLiteJournal
from polyloop.types import ActionIntent
from tests.contract.test_resume import World, comparable, new_loop, reference

ROOT = Path(__file__).resolve().parents[2]


async def crash_and_resume(tmp: Path, n: int, after: bool) -> tuple[Any, list[str], World]:
    path, effects = tmp / f"j{n}{after}.db", tmp / f"fx{n}{after}.txt"
    effects.touch()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.durability.crash_child", str(path), str(n),
        "after" if after else "before", str(effects),
        cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == -signal.SIGKILL, (n, after, err.decode())
    world = World()
    async with SQLiteJournal(path) as journal:
        result = await new_loop(world, journal).resume("r")
    return result, effects.read_text().splitlines(), world


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_sigkill_around_every_write_then_resume_in_another_process(
    after: bool, tmp_path: Path
) -> None:
    ref_journal, ref = await reference()
    writes = ref_journal.appends
    never = {
        i: batch[0] for i, batch in enumerate(writes, start=1)
        if isinstance(batch[0], ActionIntent) and batch[0].replay_policy == ReplayPolicy.never
    }  # fmt: skip
    store_results = {  # writes holding the result of the idempotent `store` tool
        i for i, batch in enumerate(writes, start=1)
        if batch[0].kind == "action_result" and "stored" in batch[0].outcome.observation
    }  # fmt: skip
    gate = asyncio.Semaphore(2)

    async def one(n: int) -> tuple[int, Any, list[str], World]:
        async with gate:
            return (n, *await crash_and_resume(tmp_path, n, after))

    outcomes = await asyncio.gather(*(one(n) for n in range(1, len(writes) + 1)))
    assert len(outcomes) >= 20
    for n, r, lines, world in outcomes:
        charged = [x for x in lines if x.startswith("charged")] + world.charged
        stored = [x.split()[1] for x in lines if x.startswith("stored")] + world.stored
        assert len(charged) <= 1, f"the never-replay tool ran twice (crash at write {n})"
        replayed = len(stored) - len(set(stored))  # op_ids the idempotent tool saw twice
        if not after and n in store_results:  # it ran, its result was lost: same op_id again
            assert replayed == 1, n
        else:
            assert replayed == 0, n
        unknown = never.get(n if after else n - 1)
        if unknown is not None:
            assert r.stop_reason == StopReason.resume_state_unknown, n
            assert r.pending_action is not None
            assert r.pending_action.tool_name == unknown.action.tool_name, n
            k = unknown.step_idx
            assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps[:k]]
            continue
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert (r.steps_used, r.actions_executed) == (ref.steps_used, ref.actions_executed)
        assert len(charged) == 1, n
