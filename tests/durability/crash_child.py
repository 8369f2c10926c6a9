"""A child process for the crash-injection harness: runs the contract scenario of
tests/contract/test_resume.py on a durable journal and kills itself with SIGKILL just before
or just after its n-th journal write. Tool side effects go to a file, which survives.

    python -m tests.durability.crash_child JOURNAL N before|after EFFECTS [RUN_ID [SCENARIO]]

Other scenarios (:data:`SCENARIOS`, for :meth:`ForkServer.crash`): ``stop`` / ``cancel`` run the
same scenario, its model asking its own Loop to stop (cancel) the run during step 3's call;
``request`` stops an existing run from this process, its request being write 1.

JOURNAL is a SQLite file, or ``postgres:DSN`` for a PostgresJournal on that DSN (a store's
``where``, tests/durability/journals.py). :class:`ForkServer` runs many such children quickly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from polyloop import Loop, ModelReply
from polyloop.journal import SQLiteJournal
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelRequest
from tests.contract.test_escalate import handover_loop
from tests.contract.test_fix_loop_ledger import fix_loop
from tests.contract.test_outcome_unknown_live import unknown_loop
from tests.contract.test_resume import World, new_loop, script
from tests.contract.test_wrap_up import budget_loop
from tests.durability.large_observation import large_loop

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]


SCENARIOS = {
    "fix": fix_loop,
    "escalate": handover_loop,
    "budget": budget_loop,
    "unknown": unknown_loop,
    "large": large_loop,
}
"""The loops other than ``pay``, by scenario name: each builds a Loop on a journal."""


class Logged(list[str]):
    """A side-effect log that is on disk before the tool returns."""

    def __init__(self, tag: str, path: str) -> None:
        super().__init__()
        self.tag, self.path = tag, path

    def append(self, item: str) -> None:
        super().append(item)
        with open(self.path, "a") as f:
            f.write(f"{self.tag} {item}\n")
            f.flush()
            os.fsync(f.fileno())


class Dying:
    """Delegates to the journal; SIGKILLs the process around its n-th write: an append, or a
    request to end a run (``request_end``). "After" a write that raised (a cancelled append
    still lands) is after it too."""

    def __init__(self, inner: Any, n: int, after: bool) -> None:
        self.inner, self.n, self.after, self.count = inner, n, after, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def append(self, lease: Any, records: Sequence[Any]) -> None:
        await self._write(self.inner.append(lease, records))

    async def request_end(self, run_id: str, request: Any, **kw: Any) -> Any:
        return await self._write(self.inner.request_end(run_id, request, **kw))

    async def decide(self, run_id: str, decision: Any) -> Any:
        return await self._write(self.inner.decide(run_id, decision))

    async def _write(self, write: Awaitable[T]) -> T:
        self.count += 1
        mine = self.count
        if mine == self.n and not self.after:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            return await write
        finally:
            if mine == self.n and self.after:
                os.kill(os.getpid(), signal.SIGKILL)


def open_journal(path: str) -> Any:
    """The journal a store's ``where`` names (a PostgresJournal connects on first use)."""
    if path.startswith("postgres:"):
        from polyloop.journal import PostgresJournal

        return PostgresJournal(path.removeprefix("postgres:"))
    if path.startswith("sqlite-process:"):
        return SQLiteJournal(path.removeprefix("sqlite-process:"), writer="process")
    return SQLiteJournal(path)


async def opened_journal(path: str) -> Any:
    """:func:`open_journal`, its tables already checked (a SQLiteJournal checks them as it is
    made; a PostgresJournal connects now)."""
    journal = open_journal(path)
    if isinstance(journal, SQLiteJournal):
        return journal
    return await journal.open()


ASKED_AT_STEP = 3
"""The step during whose model call the ``stop`` and ``cancel`` scenarios ask."""


def asking_loop(world: World, journal: Any, kind: str) -> Loop:
    """The contract scenario's Loop, its model asking this Loop to ``kind`` (stop or cancel)
    the run during the call of step :data:`ASKED_AT_STEP` (each attempt, so a resumed run asks
    again), then answering as the script does."""
    loop: Loop

    async def fn(request: ModelRequest) -> ModelReply:
        if request.step_idx == ASKED_AT_STEP:
            if kind == "stop":
                await loop.stop(request.run_id, "enough", by="the model")
            else:
                await loop.cancel(request.run_id, reason="enough", by="the model")
        return script(request)

    loop = Loop(FunctionModel(fn), tools=world.tools(), journal=journal, clock=FakeClock())
    return loop


async def approval_scenario(journal: Any, run_id: str, effects: str | None) -> Any:
    """``send_email`` (approval=True, replay never) parks the run; this process approves it
    (``by="child"``) and resumes it to its end. ``effects``: the file each e-mail sent is
    logged to, before the tool returns. Its writes: the park, the decision, the resume's."""
    from polyloop import ApprovalRequired
    from tests.contract.test_approval import Mailer, loop_of

    world = Mailer()
    if effects is not None:
        world.sent = Logged("sent", effects)  # type: ignore[assignment]
    try:
        return await loop_of(world, journal).run("mail the CEO", run_id=run_id)
    except ApprovalRequired as parked:
        await loop_of(world, journal).approve(run_id, parked.op_id, by="child")
    return await loop_of(world, journal).resume(run_id)


KNOWN = ("pay", "stop", "cancel", "request", "approval", *SCENARIOS)
"""Every scenario :meth:`ForkServer.crash` runs."""


async def main(
    path: str, n: int, after: bool, effects: str, run_id: str = "r", scenario: str = "pay"
) -> None:
    """Run a scenario: ``pay`` (tests/contract/test_resume.py's), ``fix`` (the fix loop of
    tests/contract/test_fix_loop_ledger.py, which writes every failure-ledger record),
    ``escalate`` (tests/contract/test_escalate.py's hand-over), ``budget`` (a token budget
    spent, then the wrap-up call: tests/contract/test_wrap_up.py), ``unknown`` (an idempotent
    tool raising ``OutcomeUnknown`` live: tests/contract/test_outcome_unknown_live.py),
    ``large`` (observations stored once: tests/durability/large_observation.py),
    ``stop`` / ``cancel`` (``pay``, its model asking its own Loop to end the run) or
    ``request`` (a stop of an existing run from this process)."""
    journal = Dying(open_journal(path), n, after)
    if scenario in SCENARIOS:
        await SCENARIOS[scenario](journal).run("fix", run_id=run_id)
        sys.exit(3)
    world = World()
    world.charged = Logged("charged", effects)
    world.stored = Logged("stored", effects)
    if scenario == "pay":
        await new_loop(world, journal).run("pay", run_id=run_id)
    elif scenario == "approval":
        await approval_scenario(journal, run_id, effects)
    elif scenario == "request":
        await new_loop(world, journal).stop(run_id, "halt", by="the requester")
    else:
        await asking_loop(world, journal, scenario).run("pay", run_id=run_id)
    sys.exit(3)  # not reached while n is within the scenario's writes


# -- the fork server --------------------------------------------------------------------------

_FORK_SERVER = r"""
import asyncio, contextlib, os, sys
with contextlib.suppress(ImportError):  # imported once here, not in every child
    import psycopg, psycopg_pool
import tests.durability.crash_child as child

print("ready", flush=True)
for line in sys.stdin:
    journal, run_id, n, when, effects, scenario = line.rstrip("\n").split("\t")
    pid = os.fork()
    if pid == 0:
        try:
            asyncio.run(child.main(journal, int(n), when == "after", effects, run_id, scenario))
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkServer:
    """A process that imports this module once, then forks one child per request to run
    :func:`main` (which SIGKILLs itself around its n-th journal write) and reports how the
    child ended. Each child is a real process holding the lease when it dies; forking spares
    the harness a Python start and the imports for each of its crash points."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lock = asyncio.Lock()

    @classmethod
    async def start(cls) -> ForkServer:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FORK_SERVER,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))},
        )  # fmt: skip
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.strip() == b"ready", line
        return cls(proc)

    async def crash(
        self,
        journal: str,
        run_id: str,
        n: int,
        after: bool,
        effects: Path,
        scenario: str = "pay",
    ) -> int:
        """Run ``scenario`` (:data:`KNOWN`) as ``run_id`` on the journal ``journal`` names,
        in a forked child dying around write ``n``; the child's exit code."""
        assert scenario in KNOWN
        assert self.proc.stdin is not None and self.proc.stdout is not None
        async with self.lock:
            when = "after" if after else "before"
            request = f"{journal}\t{run_id}\t{n}\t{when}\t{effects}\t{scenario}\n"
            self.proc.stdin.write(request.encode())
            await self.proc.stdin.drain()
            reply = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        return int(reply)

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "after", *sys.argv[4:7]))
