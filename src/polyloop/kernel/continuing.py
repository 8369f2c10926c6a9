"""Resume: finish the step a crash (or a detach, a park, a lost lease) interrupted, from where
its records say it got (durability.md, "Resume: what happens for each state the journal can
be in"). The run then goes on through the loop as any run does."""

from __future__ import annotations

from dataclasses import replace

from ..types import RunResult, StopReason
from . import acting, approving, deciding
from . import model_call as calling
from . import wrap_up as wrapping
from .driver import Driver, StepCtx
from .replay import Interrupted
from .steps import model_failure_step

__all__ = ["call_again", "finish"]


async def finish(d: Driver, it: Interrupted) -> RunResult | None:
    """Finish the step a crash interrupted, from where its records say it got."""
    t0 = d.cfg.clock.monotonic()
    prompt_chars = d.context.prompt_chars
    if it.wrap_up is not None:  # a wrap-up call: finish it as it began
        return await _wrap_up(d, it, t0)
    if it.failure is not None:  # model_failure without its step: no model call
        step = model_failure_step(it.step_idx, prompt_chars, 0.0, it.replaced)
        return await calling.failed(d, step, it.failure.error.detail(it.failure.attempt))
    if it.result is None:  # model intent without result: same intent id, next attempt
        return await call_again(d, it, t0, prompt_chars)
    reply, call_id = it.result.reply, it.result.llm_call_id
    if it.action_intent is None:  # model result without step: re-interpret, no model call
        return await deciding.decide(
            d, it.step_idx, t0, prompt_chars, reply, call_id, replaced=it.replaced, model=it.model
        )
    sc = StepCtx(
        it.step_idx,
        t0,
        prompt_chars,
        reply,
        call_id,
        it.action_intent,
        it.replaced,
        True,
        it.model,
    )
    if it.unknown_reports:  # live executions reported their outcome unknown
        sc = replace(sc, unknown_reports=it.unknown_reports, outcome_unknown=it.unknown_path)
    if it.action_result is not None:  # result without step: build the step, never re-run
        return await acting.settle(d, sc, it.action_result, durable=True)
    if it.approval is not None:  # it awaited a person's decision
        return await approving.resume(d, sc, it)
    return await acting.replay_action(d, sc)


async def call_again(
    d: Driver,
    it: Interrupted,
    t0: float,
    prompt_chars: int,
    wrap_up: StopReason | None = None,
) -> RunResult | None:
    """C again for a step whose model intent has no result: the same intent id, the next
    attempt, the failures and fallbacks so far."""
    return await calling.model_phase(
        d,
        it.step_idx,
        t0,
        prompt_chars,
        it.intent_id,
        it.last_attempt + 1,
        it.failures,
        it.replaced,
        it.tier,
        wrap_up,
        shown=it.shown,
    )


async def _wrap_up(d: Driver, it: Interrupted, t0: float) -> RunResult:
    """Finish a wrap-up a crash interrupted, with the budget its intent names."""
    reason = it.wrap_up
    assert reason is not None
    prompt_chars = d.context.prompt_chars + len(wrapping.message(d, reason))
    if it.failure is not None:
        step = model_failure_step(it.step_idx, prompt_chars, 0.0, it.replaced)
        return await wrapping.failed(d, reason, step, it.failure.error.detail(it.failure.attempt))
    if it.result is not None:
        return await wrapping.decide(
            d,
            reason,
            it.step_idx,
            t0,
            prompt_chars,
            it.result.reply,
            it.result.llm_call_id,
            (),
            it.replaced,
            it.model,
        )
    result = await call_again(d, it, t0, prompt_chars, reason)
    assert result is not None
    return result
