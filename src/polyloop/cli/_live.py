"""What a run is waiting for, while it waits: the model call in flight (its attempt, and why the
last one failed) or the tool running, and for how long.

:class:`Waiting` follows a run's events (the kernel's ``ModelCallStarted``/``Finished``,
``ActionStarted``/``Finished``); :class:`LiveLine` draws its :meth:`Waiting.text` as one line
that rich refreshes twice a second on its own thread (never the event loop's), under the
lines the command prints. The line is for terminals only; without one, the commands print a
line per failed attempt (:meth:`Waiting.observe`) and per step instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.text import Text

from polyloop.events import (
    ActionFinished,
    ActionStarted,
    Event,
    ModelCallFinished,
    ModelCallStarted,
    ModelDelta,
    RunEnded,
    StepAppended,
)

__all__ = ["LiveLine", "Waiting"]


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 600 else f"{s / 60:.0f} min"


class Waiting:
    """The state of one run's wait, from its events. ``max_attempts`` is the retry policy's
    (``RetryPolicy.max_attempts``: a step's attempts are counted against it; a fallback to
    another model starts its own count in the kernel, so n can exceed it there)."""

    def __init__(self, max_attempts: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_attempts = max_attempts
        self.clock = clock
        self.step: int | None = None
        self.attempts = 0  # attempts made in this step so far
        self.model_since: float | None = None  # a model call in flight since
        self.failed_at: float | None = None  # the last attempt failed at (waiting to retry)
        self.last_error: str | None = None
        self.tool: str | None = None  # a tool running since tool_since
        self.tool_since = 0.0

    def observe(self, event: Event) -> str | None:
        """Follow ``event``; returns the line to print for a model attempt that failed
        (``step 3  attempt 1/3 failed after 30.0 s: timeout: ...``), else None."""
        now = self.clock()
        if isinstance(event, ModelCallStarted):
            if event.step_idx != self.step:
                self.step, self.attempts, self.last_error = event.step_idx, 0, None
            self.attempts += 1
            self.model_since, self.failed_at = now, None
        elif isinstance(event, ModelCallFinished):
            took = 0.0 if self.model_since is None else now - self.model_since
            self.model_since = None
            if event.error is not None:
                self.failed_at, self.last_error = now, event.error
                return (
                    f"step {event.step_idx:>3}  attempt {self.attempts}/{self.max_attempts} "
                    f"failed after {_seconds(took)}: {' '.join(event.error.split())[:200]}"
                )
        elif isinstance(event, ActionStarted):
            self.tool, self.tool_since = event.tool_name or event.action, now
        elif isinstance(event, ActionFinished):
            self.tool = None
        elif isinstance(event, StepAppended | RunEnded):
            self.model_since = self.failed_at = None
            self.tool = None
        return None

    def text(self) -> str:
        """What the run waits for now, in one line ("" when it waits for nothing)."""
        now = self.clock()
        step = f"step {self.step:>3}  " if self.step is not None else ""
        why = (
            f"  (last failed: {' '.join(self.last_error.split())[:80]})" if self.last_error else ""
        )
        if self.tool is not None:
            return f"  {step}{self.tool} running  {_seconds(now - self.tool_since)}"
        if self.model_since is not None:
            return (
                f"  {step}model call  attempt {self.attempts}/{self.max_attempts}  "
                f"{_seconds(now - self.model_since)}{why}"
            )
        if self.failed_at is not None:
            return f"  {step}waiting to retry  {_seconds(now - self.failed_at)}{why}"
        return ""


class LiveLine:
    """One line at the bottom of a terminal, redrawn twice a second from ``text()`` by rich's
    refresh thread; what the command prints meanwhile goes above it. ``pause()`` takes it
    away (while a reply streams its text), ``show()`` brings it back, ``close()`` ends it."""

    def __init__(self, console: Console, text: Callable[[], str]) -> None:
        self._console = console
        self._text = text
        self._live: Any = None

    def show(self) -> None:
        if self._live is None:
            from rich.live import Live

            self._live = Live(
                get_renderable=lambda: Text(self._text(), style="dim", overflow="ellipsis"),
                console=self._console,
                refresh_per_second=2,
                transient=True,
                redirect_stdout=True,
                redirect_stderr=True,
            )
            self._live.start()

    def pause(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    close = pause


def follows(event: Event) -> bool:
    """Whether the live line should be up after ``event`` (not while a reply's text
    streams)."""
    return isinstance(event, ModelCallStarted | ActionStarted)


def streams(event: Event) -> bool:
    return isinstance(event, ModelDelta) and event.kind == "text"
