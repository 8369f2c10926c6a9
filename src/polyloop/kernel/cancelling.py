"""Cancellation (kernel.md §8): the ``cancelled`` end record, written once, after an in-flight
action's grace (``cancel_grace_s``); its outcome, if it arrives, is journaled with its step
first."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from ..types import Outcome, Record, RunEnded
from . import acting, stopping
from .driver import Driver
from .requests import pending_action, request_detail

__all__ = ["grace", "late_end_write", "on_cancel"]

log = logging.getLogger("polyloop")


def late_end_write(run_id: str, write: asyncio.Future[None]) -> None:
    """How a ``cancelled`` end record that outlived its wait ended."""
    if write.cancelled():
        log.warning(
            "run %s: the wait for the late cancelled end record was cancelled; it may have "
            "landed (resume tells)",
            run_id,
        )
    elif (exc := write.exception()) is not None:
        log.warning(
            "run %s: the late cancelled end record failed (%r); the run stays resumable",
            run_id,
            exc,
        )
    else:
        log.info("run %s: the late cancelled end record landed", run_id)


async def on_cancel(d: Driver) -> None:
    """Write the ``cancelled`` end record (once), after giving an in-flight action up to
    ``cancel_grace_s`` to finish. Waits at most ``end_write_timeout_s`` for that write;
    past it, cancellation proceeds and the write may still land on its own (a journal
    finishes a write it started); if it never does, the run stays resumable."""
    if d._ended:
        return
    task = d._action_task
    if task is not None and task.done() and not task.cancelled():
        exc = task.exception()
        if exc is not None and not isinstance(exc, Exception):
            # The action raised KeyboardInterrupt or SystemExit: asyncio let it out of the
            # event loop, whose shutdown cancels this run. Nobody cancelled the run itself:
            # no end record, it stays resumable (as for any exception escaping a run).
            log.warning("run %s: its action raised %r; no end record", d.run_id, exc)
            return
    st = d.state
    records: tuple[Record, ...] = ()
    detail: str | None = None
    sc = d._intent_written
    if sc is not None:
        outcome = await grace(d)
        intent = sc.intent
        if outcome is not None:
            result = acting.result_record(d, sc, outcome, 0.0)
            step, cut = acting.step_record(d, sc, result)
            judged = stopping.after_action(result.outcome) is None
            seen = st.ledger.observe(
                sc.step_idx, result.outcome, intent.action.text, st.limits, judged=judged
            )
            records = (result, *seen.records, d._add_to_context(step, sc.reply, cut))
        else:
            started = d._action_task is not None or sc.resumed  # it may have run
            pending = pending_action(intent, intent.replay_policy)
            detail = (
                f"in-flight action {pending.describe()}: outcome unknown"
                if started
                else f"action {pending.describe()}: cancelled before it started"
            )
    if d._cancel_sent:  # a cancel request's reason comes first
        detail = request_detail(d.request, detail)
    reason = stopping.CANCELLED
    end = st.end_record(reason, detail, d.cfg.clock.time(), d._active())
    write = asyncio.ensure_future(d.cfg.journal.append(d.lease, (*records, end)))
    try:
        done, _ = await asyncio.wait({write}, timeout=d.cfg.end_write_timeout_s)
    except asyncio.CancelledError:
        done = {write} if write.done() else set()
    if not done or write.cancelled() or write.exception() is not None:
        exc = None if not done or write.cancelled() else write.exception()
        log.warning(
            "run %s: the cancelled end record was not durable in time (%r); it may still "
            "land (the journal finishes a started write), else the run stays resumable",
            d.run_id,
            exc,
        )
        if not done:  # say how the write ends, and retrieve its error
            write.add_done_callback(functools.partial(late_end_write, d.run_id))
        return
    d._ended = True
    st.end = end
    d._emit(RunEnded(d.run_id, reason, end.stop_detail, end.steps_used, end.actions_executed))


async def grace(d: Driver) -> Outcome | None:
    task = d._action_task
    if task is None:
        return None
    if not task.done():
        with contextlib.suppress(asyncio.CancelledError):  # cancelled again: stop waiting
            await asyncio.wait({task}, timeout=d.cfg.cancel_grace_s)
    if not task.done():
        task.cancel()
        return None
    if task.cancelled() or task.exception() is not None:
        return None
    outcome = task.result()
    # An execution that reported its outcome unknown (OutcomeUnknown, handed back): none.
    return outcome if isinstance(outcome, Outcome) else None
