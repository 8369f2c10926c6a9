"""The action's task starts eagerly: its first step runs inside it before start returns."""

from __future__ import annotations

import asyncio
from typing import Any

from polyloop.kernel import eager


async def test_a_coroutine_that_never_suspends_is_done_when_start_returns() -> None:
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    seen: list[Any] = []

    async def body() -> str:
        seen.append(asyncio.current_task())
        return "ok"

    task = eager.start(loop, body())
    assert task.done() and task.result() == "ok"
    assert seen == [task] and seen[0] is not me  # it ran as its own task
    assert asyncio.current_task() is me  # and the caller's task is current again


async def test_a_coroutine_that_suspends_goes_on_in_its_task() -> None:
    loop = asyncio.get_running_loop()
    steps: list[str] = []
    gate = loop.create_future()

    async def body() -> str:
        steps.append("first")
        await gate
        steps.append("second")
        return "ok"

    task = eager.start(loop, body())
    assert steps == ["first"] and not task.done()  # the first step ran, eagerly
    gate.set_result(None)
    assert await task == "ok" and steps == ["first", "second"]


async def test_its_cancellation_and_errors_stay_in_its_task() -> None:
    loop = asyncio.get_running_loop()

    async def fails() -> None:
        raise ValueError("boom")

    task = eager.start(loop, fails())
    assert task.done() and isinstance(task.exception(), ValueError)

    async def sleeps() -> None:
        await asyncio.sleep(10)

    task = eager.start(loop, sleeps())
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled() and not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_with_a_task_factory_the_task_starts_on_the_next_turn() -> None:
    loop = asyncio.get_running_loop()
    made: list[Any] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        made.append(task)
        return task

    async def body() -> str:
        return "ok"

    loop.set_task_factory(factory)
    try:
        task = eager.start(loop, body())
        assert made == [task] and not task.done()  # the factory's task, not run yet
        assert await task == "ok"
    finally:
        loop.set_task_factory(None)
