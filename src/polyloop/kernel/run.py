"""One run, driven through the stop order of kernel.md §6, writing ahead as durability.md says.

Per step the journal receives, each durable before the next thing happens:
``model_intent`` (one per attempt, before the model is called) → ``model_attempt_failed`` /
``model_failure``, or ``model_result`` in one transaction with the first record that acts on the
reply: the ``action_intent`` (before the environment is called), or the step of an invalid
decision or final answer (written alone first when run-end guards will read the answer) →
``action_result`` + ``step`` in one transaction. A step that ends the run is written in one
transaction with the end record; a step that does not is written in one transaction with the
next step's first ``model_intent`` whenever nothing stands between them (no request to end or
detach the run, A and B passed, no observers that could detach it: ``_next_intent``). So a
tool step costs two commits, not four: the reply is still durable before anything acts on it
(interpreting it is reading, not acting), the intent is still durable before the model is
called, and a crash before that commit is a model intent without result, which resume
answers by calling the model again (the lost attempt is marked ``uncertain`` in the
accounts).

In-memory state is updated *before* each write: a write that fails ends this execution with an
exception (the state is thrown away, the journal is what resume reads), and a write that is
cancelled still lands (the Journal seam's promise), so memory and journal never disagree.

The rules live in one module each, named for them: this one drives the loop (A, B, requests
to end or detach the run); :mod:`.driver` holds the run's state and writes its records (the
steps, the end); :mod:`.stopping` decides every stop reason; :mod:`.model_call` is C (retries,
fallback, streaming, cost); :mod:`.deciding` D, E and F's intent; :mod:`.acting` F and G (the
action, replay policies on resume); :mod:`.approving` actions that wait for a person;
:mod:`.guarding` E's run-end guards and the hand-over report; :mod:`.wrap_up` the graceful
last answer; :mod:`.continuing` the step a crash interrupted; :mod:`.cancelling`
cancellation; :mod:`.liveness` leases and heartbeats; :mod:`.requests` requests to end the run
made elsewhere; :mod:`.replay` rebuilds a run from its records; :mod:`.steps` builds the step
records. Each phase module takes a :class:`.driver.Driver`, never this module's class, so they
import one another without cycles (an import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import asyncio
import logging

from ..types import JournalError, RunDetached, RunResult, RunStarted, StopReason
from . import cancelling, continuing, liveness, retune, stopping
from . import model_call as calling
from . import wrap_up as wrapping
from .driver import Driver, KernelConfig, build_result
from .ids import new_id
from .replay import Interrupted
from .requests import requested_ending

__all__ = ["KernelConfig", "RunDriver", "new_id"]

log = logging.getLogger("polyloop")


class RunDriver(Driver):
    """Advances one run until it ends, is detached, is cancelled, or an exception escapes."""

    # -- the loop -----------------------------------------------------------------------------
    async def drive(self, interrupted: Interrupted | None) -> RunResult:
        """Run to the end. Raises ``RunDetached`` after a detach, re-raises cancellation after
        writing the ``cancelled`` end record, and lets any other exception propagate with no
        end record (the run stays resumable). The lease is released on every way out.

        A cancel request (:meth:`take_request`) cancels the task driving the run: the run
        ends ``cancelled`` as on any cancellation, but nobody cancelled the caller, so its
        cancellation is taken back (``Task.uncancel``) and the result is returned; if the
        caller was cancelled too, ``CancelledError`` propagates as usual."""
        self._task = asyncio.current_task()
        liveness.arm_heartbeat(self)
        try:
            st = self.state
            self._emit(RunStarted(self.run_id, self.spec.goal, self.resumed, len(st.steps)))
            if self.request is not None:  # stored before this execution took the run
                return await self._end_requested(interrupted)
            result = await continuing.finish(self, interrupted) if interrupted is not None else None
            while result is None:
                if self._begun is None:  # else the next step has begun: its intent is durable
                    if stopping.requested(self.request) is not None:  # before A
                        return await self._end_requested(None)
                    if self.detach_requested:
                        raise RunDetached(self.run_id, len(st.steps))
                    if self.limit_requests:  # Loop.set_limits, before A
                        await self._retune()
                result = await self._iteration()
            return result
        except asyncio.CancelledError:
            self._closing = True
            await cancelling.on_cancel(self)
            task = self._task
            if self._cancel_sent and task is not None and task.uncancel() == 0:
                return self._requested_cancel()  # only the request cancelled it
            raise
        finally:
            self._closing = True
            liveness.stop_heartbeat(self)
            if not self._ended:
                try:
                    await self.cfg.journal.release(self.lease)
                except Exception:  # the lease will expire; nothing else to do
                    log.warning("run %s: could not release its lease", self.run_id, exc_info=True)

    async def _retune(self) -> None:
        pending, self.limit_requests = self.limit_requests, ()
        st = self.state
        st.limits = await retune.apply_pending(
            self.cfg.journal, self.cfg.clock, self.lease, st.limits, pending
        )

    async def _iteration(self) -> RunResult | None:
        begun = self._begun
        if begun is not None:  # A and B were passed as the last step was written, with C's intent
            self._begun = None
            intent, t0, prompt_chars = begun
            return await calling.model_phase(
                self, intent.step_idx, t0, prompt_chars, intent.intent_id, 1, 0, written=True
            )
        st = self.state
        # A. Budget admission, at the start of the iteration.
        reason = self._admitted()
        if reason is not None:
            if self.cfg.wrap_up:
                return await self._wrap_up(reason)
            return await self._end(reason)
        # B. Context size: no step, no intent.
        prompt_chars = self.context.prompt_chars
        reason = stopping.context_overflows(st.limits, prompt_chars)
        if reason is not None:
            return await self._end(reason, stopping.overflow_detail(st.limits, prompt_chars))
        # C. Model call (retry inside).
        t0 = self.cfg.clock.monotonic()
        return await calling.model_phase(self, len(st.steps), t0, prompt_chars, new_id(), 1, 0)

    async def _wrap_up(self, reason: StopReason) -> RunResult:
        """A found ``reason``: make the wrap-up call (:mod:`.wrap_up`), or end at once if its
        prompt is too big."""
        prompt_chars = wrapping.prompt_chars(self, reason)
        if prompt_chars is None:
            return await self._end(reason)
        t0 = self.cfg.clock.monotonic()
        result = await calling.model_phase(
            self, len(self.state.steps), t0, prompt_chars, new_id(), 1, 0, wrap_up=reason
        )
        assert result is not None  # a wrap-up always ends the run
        return result

    async def _end_requested(self, interrupted: Interrupted | None) -> RunResult:
        """End the run as its request asks, with nothing in flight here (at a step boundary,
        or where a crash left it: an action intent without result is named, its outcome
        unknown)."""
        assert self.request is not None
        reason, detail, pending = requested_ending(self.request, interrupted)
        return await self._end(reason, detail, pending=pending)

    def _requested_cancel(self) -> RunResult:
        """The result of a run a cancel request cancelled (the caller was not cancelled)."""
        if self.state.end is None:
            raise JournalError(
                f"run {self.run_id!r}: cancelled on request, but its cancelled end record was "
                "not durable in time; the run stays resumable and its request stored (a resume "
                "ends it cancelled)"
            )
        return build_result(self.spec, self.state, self.context)
