"""C of the stop order (kernel.md §6): the model call — its intent durable before each attempt,
the retry policy, a FallbackModel's next model, streamed deltas, the attempt's usage and cost."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
from typing import TYPE_CHECKING

from ..types import (
    ConfigError,
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
    Pricing,
    RunResult,
    StopReason,
    Usage,
    usage_refusal,
)
from . import stopping
from . import wrap_up as wrapping
from .steps import (
    model_failure_step,
)
from .text import clean_error, clean_reply

if TYPE_CHECKING:
    from .run import RunDriver

__all__ = ["attempt_cost", "delta", "error_info", "model_phase", "pricing_of", "refuse_usage"]

log = logging.getLogger("polyloop")


def error_info(exc: BaseException) -> tuple[ErrorInfo, int]:
    """A model call's exception as journaled, its texts cleaned; the count replaced."""
    if isinstance(exc, ModelCallError):
        info = ErrorInfo(
            type(exc).__name__, str(exc.message), str(exc.kind), exc.retryable, exc.retry_after
        )
    else:
        info = ErrorInfo(type(exc).__name__, str(exc))
    return clean_error(info)


def pricing_of(model: object) -> Pricing | None:
    """A model's ``pricing`` attribute (optional; a ``Pricing`` or None)."""
    pricing = getattr(model, "pricing", None)
    if pricing is not None and not isinstance(pricing, Pricing):
        raise ConfigError(f"{model!r}.pricing must be a polyloop.Pricing or None, got {pricing!r}")
    return pricing


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


def attempt_cost(usage: Usage | None, pricing: Pricing | None) -> float | None:
    """An attempt's cost: the provider's reported cost, else its tokens at ``pricing``."""
    if usage is None:
        return None
    if usage.cost_usd is not None:
        return usage.cost_usd
    return None if pricing is None else pricing.cost(usage)


async def model_phase(
    d: RunDriver,
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
) -> RunResult | None:
    """C, from ``attempt`` on. ``failures``: failed attempts of this step so far, since it
    last fell back; ``replaced``: code points replaced in their errors (part of the step's
    count); ``tier``: which of the models the attempt asks (a FallbackModel's; a resumed
    run given fewer models asks its last); ``wrap_up``: the budget that ends the run, for
    the wrap-up call (``tool_choice="none"``, its message added; :mod:`.wrap_up`);
    ``written``: the first attempt's model intent is durable already (written with the step
    before it: ``RunDriver._next_intent``)."""
    cfg = d.cfg
    clock = cfg.clock
    last = len(d._models) - 1
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
        try:
            reply = await d._models[tier].complete(request)
            if not isinstance(reply, ModelReply):
                raise TypeError(f"the model returned {type(reply).__name__}, not ModelReply")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            latency = (clock.monotonic() - t) * 1000
            info, bad = error_info(exc)
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
            if info.retryable and cfg.retry.allows_retry(failures, info.retry_after):
                await d._write(
                    (ModelAttemptFailed(step_idx, intent_id, attempt, info, latency, bad),)
                )
                await clock.sleep(cfg.retry.backoff_s(failures, info.retry_after, random.random()))
                attempt += 1
                continue
            # The next model's turn, unless this one's partial output was already shown:
            # then recovery stays with it (a fallback would change an answer in view).
            if tier < last and info.kind in d._fallback_on and not d._partial:
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
            return await d._end(stopping.MODEL_FAILED, info.detail(attempt), step=step)
        latency = (clock.monotonic() - t) * 1000
        reply, bad = clean_reply(reply)  # before anything records or reads it
        if reply.usage is not None and (refused := usage_refusal(reply.usage)) is not None:
            reply = refuse_usage(d.run_id, step_idx, attempt, reply, refused)
        call_id = reply.call_id or intent_id
        st = d.state
        cost = attempt_cost(reply.usage, d._pricing[tier])
        if d._observers:
            d._emit(
                ModelCallFinished(d.run_id, step_idx, intent_id, attempt, call_id, latency, None)
            )
        # The result is written with the first record that acts on it (see _decide).
        result = ModelResult(step_idx, intent_id, attempt, call_id, reply, latency, bad, cost)
        st.count_result(result)
        if wrap_up is not None:
            return await wrapping.decide(
                d, wrap_up, step_idx, t0, prompt_chars, reply, call_id, (result,),
                replaced + bad, name,
            )  # fmt: skip
        return await d._decide(
            step_idx, t0, prompt_chars, reply, call_id, result, replaced + bad, name
        )


def delta(d: RunDriver, step_idx: int, intent_id: str, attempt: int, kind: str, text: str) -> None:
    """A streaming adapter's ``on_delta``: one ModelDelta event."""
    d._partial = True
    d._emit(ModelDelta(d.run_id, step_idx, intent_id, attempt, kind, text))
