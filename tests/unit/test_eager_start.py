"""kernel/_eager.py: a coroutine runs inline until it suspends, then as a task, like a Task."""

from __future__ import annotations

import asyncio

import pytest

from polyloop.kernel._eager import start


async def test_a_coroutine_that_never_suspends_finishes_inline_without_a_task() -> None:
    async def quick() -> int:
        return 7

    started = start(quick())
    assert started.task is None and started.value == 7


async def test_an_exception_before_the_first_suspension_propagates_at_once() -> None:
    async def broken() -> int:
        raise ValueError("early")

    with pytest.raises(ValueError, match="early"):
        start(broken())


async def test_a_suspending_coroutine_continues_as_a_task_through_every_kind_of_await() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def many() -> str:
        await asyncio.sleep(0)  # a bare yield
        seen.append("slept")
        fut: asyncio.Future[str] = loop.create_future()
        loop.call_later(0.01, fut.set_result, "value")
        seen.append(await fut)  # a future that resolves later
        bad: asyncio.Future[str] = loop.create_future()
        loop.call_soon(bad.set_exception, KeyError("from a future"))
        try:
            await bad
        except KeyError:
            seen.append("caught")
        return "done"

    started = start(many())
    assert started.task is not None and seen == []
    assert await started.task == "done"
    assert seen == ["slept", "value", "caught"]


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    cleaned = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.set()

    started = start(forever())
    assert started.task is not None
    await asyncio.sleep(0)
    started.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await started.task
    assert cleaned.is_set()


async def test_a_coroutine_may_swallow_cancellation_and_return() -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "finished anyway"
        return "slept"

    started = start(stubborn())
    assert started.task is not None
    await asyncio.sleep(0)
    started.task.cancel()
    assert await started.task == "finished anyway"
