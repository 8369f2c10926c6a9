"""Shared helpers: replies, tool sets, and a journal that records or crashes its appends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from polyloop import EnvironmentFailure, ModelReply, Outcome, ToolCall, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.types import (
    ActionIntent,
    ActionStatus,
    Lease,
    ModelRequest,
    Record,
    RunEnd,
    RunSpec,
    StepWritten,
    canonical_json,
)


def call(name: str, args: dict[str, Any] | str | None = None, id: str | None = None) -> ModelReply:
    """A reply with one native tool call."""
    return ModelReply(tool_calls=(ToolCall(name, {} if args is None else args, id),))


class Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the kernel catches it."""


class RecordingJournal:
    """A MemoryJournal that remembers each append (one transaction) and can crash before or
    after the n-th one (1-based), like a process killed around a journal write."""

    def __init__(
        self,
        inner: MemoryJournal | None = None,
        *,
        crash_at: int | None = None,
        crash_after: bool = False,
    ) -> None:
        self.inner = inner or MemoryJournal()
        self.appends: list[tuple[Record, ...]] = []
        self.crash_at = crash_at
        self.crash_after = crash_after
        self.count = 0

    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease:
        return await self.inner.create(spec, ttl_s=ttl_s)

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]:
        return await self.inner.read(run_id)

    async def acquire(
        self, run_id: str, *, ttl_s: float
    ) -> tuple[Lease, RunSpec, Sequence[Record]]:
        return await self.inner.acquire(run_id, ttl_s=ttl_s)

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        self.count += 1
        if self.count == self.crash_at and not self.crash_after:
            raise Crash(f"before write {self.count}")
        await self.inner.append(lease, records)
        self.appends.append(tuple(records))
        if self.count == self.crash_at and self.crash_after:
            raise Crash(f"after write {self.count}")

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        return await self.inner.renew(lease, ttl_s=ttl_s)

    async def release(self, lease: Lease) -> None:
        await self.inner.release(lease)

    def kinds(self) -> list[list[str]]:
        return [[r.kind for r in batch] for batch in self.appends]

    def end(self, run_id: str) -> RunEnd | None:
        ends = [r for r in self.inner.records(run_id) if isinstance(r, RunEnd)]
        assert len(ends) <= 1, "a run has exactly one end record"
        return ends[0] if ends else None

    def steps(self, run_id: str) -> list[Any]:
        return [r.step for r in self.inner.records(run_id) if isinstance(r, StepWritten)]


@pytest.fixture
def journal() -> RecordingJournal:
    return RecordingJournal()


def make_tools(log: list[str] | None = None) -> ToolRegistry:
    """noop, count(n: int), boom (raises), done (marker), broken (EnvironmentFailure),
    big (long output), finish_env (environment-signalled completion)."""
    tools = ToolRegistry()
    seen = log if log is not None else []

    @tools.tool
    def noop() -> str:
        """Do nothing."""
        seen.append("noop")
        return "ok"

    @tools.tool
    def count(n: int) -> str:
        """Count to n."""
        seen.append(f"count {n}")
        return " ".join(str(i) for i in range(1, n + 1))

    @tools.tool
    def boom() -> str:
        """Always raises."""
        seen.append("boom")
        raise ValueError("kaboom")

    @tools.tool(completion_marker=True)
    def done(answer: str) -> str:
        """Submit the answer."""
        seen.append(f"done {answer}")
        return f"submitted {answer}"

    @tools.tool(completion_marker=True)
    def bad_submit() -> str:
        """A marker tool that raises."""
        raise RuntimeError("submission rejected")

    @tools.tool
    def broken() -> str:
        """The environment is broken."""
        raise EnvironmentFailure("sandbox is gone")

    @tools.tool
    def big(n: int) -> str:
        """Return n characters."""
        return "x" * n

    @tools.tool
    def finish_env() -> Outcome:
        """The environment reports the goal reached."""
        seen.append("finish_env")
        return Outcome(ActionStatus.executed, "goal reached", completed=True)

    return tools


def first_write(ref: RecordingJournal, kind: str, tool: str | None = None) -> int:
    """1-based number of the reference run's first write holding a record of ``kind`` (for an
    action intent, of ``tool``)."""
    return next(
        i
        for i, batch in enumerate(ref.appends, start=1)
        if any(
            r.kind == kind
            and (tool is None or (isinstance(r, ActionIntent) and r.action.tool_name == tool))
            for r in batch
        )
    )


def prompt_size(request: ModelRequest) -> int:
    """kernel.md §7's prompt_chars of ``request``, from scratch."""
    total = len(canonical_json(list(request.tool_specs)))
    for m in request.messages:
        total += len(m.get("content") or "")
        for c in m.get("tool_calls") or ():
            total += len(c["function"]["name"]) + len(c["function"]["arguments"])
    return total
