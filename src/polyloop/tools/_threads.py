"""Calling user code that may be synchronous without blocking the event loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any


async def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a worker thread (never on the event loop). If it returns an
    awaitable — a synchronous wrapper around a coroutine function — that is awaited too."""
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result
