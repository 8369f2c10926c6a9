"""C of the stop order (kernel.md §6): the model call — its intent durable before each attempt,
the retry policy, a FallbackModel's next model, streamed deltas, the attempt's usage and cost."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import random

from ..seams import Pricer
from ..types import (
    ErrorInfo,
    ModelAttemptFailed,
    ModelCallError,
    ModelCallFinished,
    ModelCallStarted,
    ModelDelta,
    ModelFailure,
    ModelIntent,
    ModelReply,
    ModelRequest,
    ModelResult,
    RunResult,
    StepRecord,
    StopReason,
    Usage,
    usage_refusal,
)
from . import deadline, deciding, stopping
from . import wrap_up as wrapping
from .driver import Driver
from .steps import model_failure_step, model_failures_in_a_row
from .text import clean_error, clean_reply

__all__ = ["attempt_cost", "delta", "error_info", "failed", "model_phase", "refuse_usage"]

log = logging.getLogger("polyloop")


def error_info(exc: BaseException) -> tuple[ErrorInfo, int]:
    """A model call's exception as journaled, its texts cleaned; the count replaced.

    A custom model's ``ModelCallError`` is read here, once: a ``retry_after`` that is not a
    number of seconds >= 0 (a str, NaN, negative) counts as not said; an infinite one ("wait
    forever") makes the failure final; ``retryable`` is true only when it is ``True``."""
    if isinstance(exc, ModelCallError):
        after = exc.retry_after
        retryable = exc.retryable is True
        if isinstance(after, bool) or not isinstance(after, int | float) or not after >= 0:
            after = None
        elif after == math.inf:
            after, retryable = None, False
        info = ErrorInfo(type(exc).__name__, str(exc.message), str(exc.kind), retryable, after)
    else:
        info = ErrorInfo(type(exc).__name__, str(exc))
    return clean_error(info)


def refuse_usage(
    run_id: str, step_idx: int, attempt: int, reply: ModelReply, refused: str
) -> ModelReply:
    """``reply`` with its usage recorded as not reported: a usage that cannot be believed is
    refused (``Usage``), so it never lowers a total or switches a budget off."""
    log.warning(
        "run %s step %d attempt %d: refused the reported usage (%s); the attempt counts as "
        "usage not reported (usage_missing)",
        run_id,
        step_idx,
        attempt,
        refused,
    )
    return dataclasses.replace(reply, usage=None)


def attempt_cost(usage: Usage | None, pricing: Pricer | None) -> float | None:
    """An attempt's cost: the provider's reported cost, else its tokens at ``pricing`` (the
    model's own ``Pricing``, else its price in the price table); None when neither is known."""
    if usage is None:
        return None
    if usage.cost_usd is not None:
        return usage.cost_usd
    return None if pricing is None else pricing.cost(usage)


async def model_phase(
    d: Driver,
    step_idx: int,
    t0: float,
    prompt_chars: int,
    intent_id: str,
    attempt: int,
    failures: int,
    replaced: int = 0,
    tier: int = 0,
    wrap_up: StopReason | None = None,
    *,
    written: bool = False,
    shown: bool = False,
) -> RunResult | None:
    """C, from ``attempt`` on. ``failures``: failed attempts of this step so far, since it
    last fell back; ``replaced``: code points replaced in their errors (part of the step's
    count); ``tier``: which of the models the attempt asks (a FallbackModel's; a resumed
    run given fewer models asks its last); ``wrap_up``: the budget that ends the run, for
    the wrap-up call (``tool_choice="none"``, its message added; :mod:`.wrap_up`);
    ``written``: the first attempt's model intent is durable already (written with the step
    before it: ``Driver._next_intent``); ``shown``: an earlier attempt of this step showed
    partial output (``ModelDelta`` events), so the step never falls back to another model.

    With a time budget, each attempt is stopped at what is left of it plus the grace, and no
    further attempt starts after its end (:mod:`.deadline`)."""
    cfg = d.cfg
    clock = cfg.clock
    last = len(d._models) - 1
    end = deadline.budget_end(d) if wrap_up is None else deadline.wrap_up_end(d)
    while True:
        tier = min(tier, last)
        name = d._model_names[tier]
        if written:
            written = False
        else:
            await d._write((ModelIntent(step_idx, intent_id, attempt, name, wrap_up),))
        on_delta = None
        d._partial = False
        if d._observers:
            d._emit(ModelCallStarted(d.run_id, step_idx, intent_id, attempt))
            on_delta = functools.partial(delta, d, step_idx, intent_id, attempt)
        if wrap_up is None:
            request = ModelRequest(
                d.run_id,
                step_idx,
                attempt,
                d.context.messages(),
                d.tool_specs,
                on_delta,
            )
        else:
            request = wrapping.request(d, step_idx, attempt, wrap_up, on_delta)
        t = clock.monotonic()
        limit: asyncio.Timeout | None = None
        try:
            if end is None:
                reply = await d._models[tier].complete(request)
            else:
                seconds = deadline.cap(d, end)
                async with asyncio.timeout(seconds) as limit:
                    reply = await d._models[tier].complete(request)
            if not isinstance(reply, ModelReply):
                raise TypeError(f"the model returned {type(reply).__name__}, not ModelReply")
            # Before anything records or reads it; a reply that breaks its contract (arguments
            # JSON cannot hold) is this attempt's failure, as one of the wrong type is.
            reply, bad = clean_reply(reply)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            latency = (clock.monotonic() - t) * 1000
            budget = limit is not None and limit.expired()  # the time budget's cap stopped it
            info, bad = error_info(
                deadline.cut(seconds, cfg.time_budget_grace_s) if budget else exc
            )
            replaced += bad
            failures += 1
            if d._observers:
                d._emit(
                    ModelCallFinished(
                        d.run_id,
                        step_idx,
                        intent_id,
                        attempt,
                        None,
                        latency,
                        f"{info.type}: {info.message}",
                    )
                )
            partial = d._partial
            shown = shown or partial
            retry = info.retryable and cfg.retry.allows_retry(failures, info.retry_after)
            # The next model's turn, unless partial output of this step was already shown
            # (by any attempt): then recovery stays with its model (a fallback would change
            # an answer in view).
            fallback = tier < last and info.kind in d._fallback_on and not shown
            backoff = (
                cfg.retry.backoff_s(failures, info.retry_after, random.random()) if retry else 0.0
            )
            # No attempt starts at or after the time budget's end (nor after the cap cut one).
            if end is not None and (
                budget or ((retry or fallback) and d._active() + backoff >= end)
            ):
                await deadline.wait_out(d, end)
                retry = fallback = False
                budget = True
            if retry:
                retried = ModelAttemptFailed(
                    step_idx, intent_id, attempt, info, latency, bad, partial_shown=partial
                )
                await d._write((retried,))
                await clock.sleep(backoff)
                attempt += 1
                continue
            if fallback:
                fell = ModelAttemptFailed(
                    step_idx, intent_id, attempt, info, latency, bad, fallback=True
                )
                await d._write((fell,))
                tier += 1
                failures = 0
                attempt += 1
                continue
            await d._write((ModelFailure(step_idx, intent_id, attempt, info, latency, bad),))
            wall = (clock.monotonic() - t0) * 1000
            step = model_failure_step(step_idx, prompt_chars, wall, replaced)
            if wrap_up is not None:
                return await wrapping.failed(d, wrap_up, step, info.detail(attempt))
            return await failed(d, step, info.detail(attempt), budget=budget)
        latency = (clock.monotonic() - t) * 1000
        if reply.usage is not None and (refused := usage_refusal(reply.usage)) is not None:
            reply = refuse_usage(d.run_id, step_idx, attempt, reply, refused)
        call_id = reply.call_id or intent_id
        st = d.state
        cost = attempt_cost(reply.usage, d._pricing[tier])
        if d._observers:
            d._emit(
                ModelCallFinished(d.run_id, step_idx, intent_id, attempt, call_id, latency, None)
            )
        # The result is written with the first record that acts on it (see deciding.decide).
        result = ModelResult(step_idx, intent_id, attempt, call_id, reply, latency, bad, cost)
        if (warning := st.count_result(result, name)) is not None:
            log.warning("run %s: %s", d.run_id, warning)
        if wrap_up is not None:
            return await wrapping.decide(
                d, wrap_up, step_idx, t0, prompt_chars, reply, call_id, (result,),
                replaced + bad, name,
            )  # fmt: skip
        return await deciding.decide(
            d, step_idx, t0, prompt_chars, reply, call_id, result, replaced + bad, name
        )


async def failed(
    d: Driver, step: StepRecord, detail: str, *, budget: bool = False
) -> RunResult | None:
    """The step of a model call that failed after the retry policy (its ``model_failure``
    durable): with the end record ``llm_error`` when it makes
    ``max_consecutive_model_failures`` such steps in a row, else appended (it adds nothing to
    the conversation) and the run goes on at A. Live and on resume alike: the count is read
    from the steps at the end of the trajectory. ``budget``: the time budget's cap stopped
    the call, or refused the attempt that would have followed (:mod:`.deadline`): the step is
    appended and A ends the run ``time_budget``."""
    st = d.state
    if budget:
        await d._append_step((), step, None, 0)
        return None
    limit = st.limits.max_consecutive_model_failures
    in_a_row = 1 + model_failures_in_a_row(st.steps, limit - 1)
    reason = stopping.after_model_failure(st.limits, in_a_row)
    if reason is not None:
        return await d._end(reason, detail, step=step)
    await d._append_step((), step, None, 0)
    return None


def delta(d: Driver, step_idx: int, intent_id: str, attempt: int, kind: str, text: str) -> None:
    """A streaming adapter's ``on_delta``: one ModelDelta event."""
    d._partial = True
    d._emit(ModelDelta(d.run_id, step_idx, intent_id, attempt, kind, text))
