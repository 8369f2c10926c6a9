"""Test doubles for the seams, public so users can test their environments and tools offline.

* :class:`ScriptedModel` serves scripted replies in call order.
* :class:`FunctionModel` answers each request with a function of it.
* :class:`FakeClock` makes time (and backoff) instant and observable.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeAlias

from ..types import ModelReply, ModelRequest, Pricing

__all__ = ["FakeClock", "FunctionModel", "ScriptExhausted", "ScriptedModel"]

ScriptItem: TypeAlias = ModelReply | str | BaseException


class ScriptExhausted(Exception):
    """A :class:`ScriptedModel` was called more times than it has items."""


class ScriptedModel:
    """A model that serves ``items`` in call order, one per call (a retry consumes one too).

    Each item is a ``ModelReply``, a ``str`` (a text reply) or an exception instance (raised
    for that call: a ``ModelCallError(retryable=True)`` is retried by the kernel). Running out
    raises :class:`ScriptExhausted`, so the run ends ``llm_error`` saying the script ran out.

    ``requests`` holds every request received, for assertions. ``name`` (optional) is the
    model's name as the journal records it (``model_calls.model``, ``StepRecord.model``);
    ``pricing`` (optional) prices its replies' usage for ``Limits.max_cost``.
    """

    def __init__(
        self,
        items: Iterable[ScriptItem],
        *,
        name: str | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        self.name = name
        self.pricing = pricing
        self._items = list(items)
        self._next = 0
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int:
        """Items not served yet."""
        return len(self._items) - self._next

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        if self._next >= len(self._items):
            raise ScriptExhausted(
                f"the ScriptedModel ran out of replies after {len(self._items)} "
                f"(call for step {request.step_idx}, attempt {request.attempt})"
            )
        item = self._items[self._next]
        self._next += 1
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, str):
            return ModelReply(text=item)
        return item


ReplyFn: TypeAlias = Callable[[ModelRequest], ModelReply | str | Awaitable[ModelReply | str]]


class FunctionModel:
    """A model whose reply is ``fn(request)``: sync or async, returning a ``ModelReply`` or a
    ``str`` (a text reply). Exceptions it raises are the model call's failures. Key replies by
    ``request.step_idx`` for scripts that must survive a crash and resume. ``name`` and
    ``pricing`` as for :class:`ScriptedModel`."""

    def __init__(
        self, fn: ReplyFn, *, name: str | None = None, pricing: Pricing | None = None
    ) -> None:
        self.name = name
        self.pricing = pricing
        self.fn = fn
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelReply:
        self.requests.append(request)
        out = self.fn(request)
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, str):
            return ModelReply(text=out)
        return out


class FakeClock:
    """A clock for tests: ``sleep`` advances time at once (after yielding to the event loop)
    and records the requested durations in ``sleeps``."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move time forward without sleeping."""
        self.now += seconds
