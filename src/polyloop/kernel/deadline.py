"""The time budget's cap (``Limits.max_seconds``) on what a run waits for.

A run's time budget ends when it has been active ``max_seconds`` (summed over its executions;
:meth:`.driver.Driver._active`). Rule A settles it at the start of an iteration; what follows
keeps the iteration that is under way from running far past it:

* **Calls.** Every model call attempt and every action is given what is left of the budget
  when it begins plus the Loop's ``time_budget_grace_s`` (:func:`cap`). The kernel stops a
  model call at it itself; an action gets it as ``ToolContext.timeout_s`` (the environment
  stops its call, recorded as that call's own timeout). All calls of one iteration thus end
  by one instant: the budget's end plus the grace.
* **Retries.** Another attempt (a retry after its backoff, or a ``FallbackModel``'s next
  model) starts only before the budget's end; one that would start at or after it is not
  started: the run waits out what is left of the budget (:func:`wait_out`) and the failure
  is the step's (a model-failure step), so A ends the run ``time_budget`` at the next
  iteration, as it does after a call the cap cut short.
* **Wrap-up.** The wrap-up call (``Loop(wrap_up=True)``) has a budget of its own: what is
  left of ``max_seconds`` when it begins, if anything, plus the grace (:func:`wrap_up_end`).

The grace lets an answer that is arriving arrive (a reply being streamed, a command being
killed and reported) instead of throwing away the last call of every run that hits the
budget. What the cap cannot shorten is work that is not an interruptible wait: journal
writes, code that runs without awaiting (a context builder, an observer, a tool that blocks
the event loop), a run-end guard's check, the backoff before an action whose outcome was
unknown is executed again, a custom environment that ignores ``ToolContext.timeout_s``.
"""

from __future__ import annotations

from ..types import ModelCallError
from .driver import Driver

__all__ = ["budget_end", "cap", "cut", "wait_out", "wrap_up_end"]


def budget_end(d: Driver) -> float | None:
    """The budget's end, in active seconds (``max_seconds``); None: no time budget."""
    return d.state.limits.max_seconds


def wrap_up_end(d: Driver) -> float | None:
    """The wrap-up call's end, in active seconds: the budget's end, or now if that has passed
    (its own grace is then all it has); None: no time budget."""
    end = d.state.limits.max_seconds
    return None if end is None else max(end, d._active())


def cap(d: Driver, end: float) -> float:
    """Seconds a call beginning now may take: to ``end`` plus the grace (at least 0)."""
    return max(end + d.cfg.time_budget_grace_s - d._active(), 0.0)


def cut(seconds: float, grace: float) -> ModelCallError:
    """The failure of a model call the cap stopped after ``seconds``: a retryable timeout,
    recorded as an adapter's request timeout is."""
    return ModelCallError(
        f"no answer within {seconds:g} s: what was left of the time budget (max_seconds) "
        f"plus its grace of {grace:g} s",
        retryable=True,
        kind="timeout",
    )


async def wait_out(d: Driver, end: float) -> None:
    """Sleep (the run's clock) until the run has been active ``end`` seconds (a clock may wake
    a sleep a hair early: at most three sleeps, so a clock whose sleep does not advance it
    cannot hold the run)."""
    for _ in range(3):
        left = end - d._active()
        if left <= 0:
            return
        await d.cfg.clock.sleep(left)
