"""Start a task and run its first step at once, in the task (an *eager* start).

An action runs in its own task (kernel.md §8: what the tool sees as the current task is the
action's, and on the run's cancellation the action gets its grace period). A plain
``create_task`` schedules the task's first step for the next turn of the event loop, and the
task's end wakes the run one turn later: two turns per step, even for a tool that returns at
once. An eager start runs the first step now, inside the new task; a tool that never suspends
is then finished when :func:`start` returns, and the run goes on without giving up its turn.

Python 3.12 and later do this themselves (``asyncio.Task(..., eager_start=True)``). On 3.11
the same is done by hand for asyncio's own event loops: the step ``create_task`` just queued
is taken back from the loop's ready queue and run with the new task entered as the current one
(the run's task left and entered again around it, as 3.12 swaps them). Anything else — a task
factory, another event loop (uvloop), a loop whose queue does not look as expected — gets a
plain ``create_task``: the same behaviour one turn later.
"""

from __future__ import annotations

import asyncio
import collections
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["start"]

T = TypeVar("T")

_NATIVE_EAGER = sys.version_info >= (3, 12)


def start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """The task running ``coro``, its first step already run where that can be done (see the
    module docstring); otherwise ``loop.create_task(coro)``."""
    if loop.get_task_factory() is not None:
        return loop.create_task(coro)
    if _NATIVE_EAGER:
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg,unused-ignore]
    return _start_311(loop, coro)


def _start_311(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    ready = getattr(loop, "_ready", None)
    if not isinstance(loop, asyncio.BaseEventLoop) or type(ready) is not collections.deque:
        return loop.create_task(coro)
    queued = len(ready)
    task = loop.create_task(coro)
    if len(ready) != queued + 1:  # not the one step a Task queues as it is made
        return task
    current = asyncio.current_task(loop)
    handle = ready.pop()  # the task's first step
    if current is not None:
        asyncio.tasks._leave_task(loop, current)  # type: ignore[attr-defined,unused-ignore]
    try:
        handle._run()  # type: ignore[attr-defined,unused-ignore]
    finally:
        if current is not None:
            asyncio.tasks._enter_task(loop, current)  # type: ignore[attr-defined,unused-ignore]
    return task
