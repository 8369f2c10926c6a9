"""Start a coroutine eagerly: run it inline to its first suspension, and only then hand it to a
task (what Python 3.12's eager task factory does; PolyLoop supports 3.11).

Why: an action must survive the run's cancellation for a grace period, which needs a task of
its own. Creating and shielding a task costs ~20 µs of CPU per step, more than the rest of the
kernel's step. Most actions that never suspend (a refused call, a fast async tool) need no task:
nothing can cancel code that never yields to the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["Started", "start"]

T = TypeVar("T")


class Started:
    """Either a finished ``value`` or a ``task`` that runs the rest of the coroutine."""

    __slots__ = ("task", "value")

    def __init__(self, value: Any = None, task: asyncio.Future[Any] | None = None) -> None:
        self.value = value
        self.task = task


def start(coro: Coroutine[Any, Any, T]) -> Started:
    """Run ``coro`` until it first suspends. Exceptions it raises before then propagate."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return Started(value=stop.value)
    return Started(task=asyncio.ensure_future(_drive(coro, yielded)))


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _drive(coro: Coroutine[Any, Any, T], yielded: Any) -> T:
    """Continue a coroutine suspended on ``yielded``, as ``asyncio.Task`` would: wait until the
    future it yielded is done, then resume it; forward cancellation into it."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            if yielded is None:  # a bare yield (asyncio.sleep(0)): just reschedule
                await asyncio.sleep(0)
            else:
                if not getattr(yielded, "_asyncio_future_blocking", False):
                    raise RuntimeError(f"the action awaited a non-asyncio object: {yielded!r}")
                yielded._asyncio_future_blocking = False
                if not yielded.done():
                    waiter: asyncio.Future[None] = loop.create_future()
                    yielded.add_done_callback(lambda f, w=waiter: _wake(w, f))
                    await waiter
        except asyncio.CancelledError as exc:
            if yielded is not None:
                yielded.cancel()
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            continue
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
