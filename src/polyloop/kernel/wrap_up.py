"""The graceful last answer (``Loop(wrap_up=True)``): when rule A stops a run for a budget, one
more model call, with tools withheld and the wrap-up message, may give the run a final answer.

The rules, each tested in tests/contract/test_wrap_up.py:

* It happens once, when A finds any budget spent (``step_budget``, ``action_budget``,
  ``token_budget``, ``cost_budget``, ``time_budget``) and the wrap-up message fits
  ``max_prompt_chars`` (else the run just ends). It is the one case where ``steps_used`` may
  exceed ``max_steps``, by one.
* The stop reason stays the budget's (``WHERE stop_reason = 'step_budget'`` still counts every
  budget stop); the step has ``wrap_up = true``. A final answer sets ``final_answer``; a reply
  that calls a tool anyway is recorded ``not_executed`` (nothing runs) and an invalid one as
  invalid; a failed call is a model-failure step, the run's ``stop_detail`` saying why.
  Run-end guards are not consulted: the run is over whatever they say.
* It is written like every step: its model intent (which names the budget, ``wrap_up``) before
  the call, the step with the end record. A resume finishes a wrap-up that a crash interrupted
  as it began, with the budget its intent names, even if the limits were raised meanwhile.
* The message is ``Templates.wrap_up`` as the last user message of the request, after the
  conversation; it is not added to the conversation itself (``RunResult.messages`` ends with
  the reply).
* Tools are withheld by ``ModelRequest.tool_choice="none"``, not by leaving the specs out: a
  conversation with tool calls but no tool definitions is refused by some providers
  (Anthropic's Messages API). So the request carries the run's tool specs, and the step's
  ``prompt_chars`` (the conversation, the specs and the message) is what was sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..types import (
    Action,
    ActionStatus,
    FinalAnswer,
    InvalidDecision,
    ModelReply,
    ModelRequest,
    Outcome,
    Record,
    RunResult,
    StepRecord,
    StopReason,
)
from . import stopping
from .driver import Driver
from .steps import action_step, final_answer_step, invalid_step
from .text import clean_action, clean_decision

__all__ = ["decide", "failed", "message", "prompt_chars", "request"]


def _budget(reason: StopReason) -> str:
    return str(reason).replace("_", " ")


def message(d: Driver, reason: StopReason) -> str:
    return d.cfg.wrap_up_prompt.format(budget=_budget(reason))


def prompt_chars(d: Driver, reason: StopReason) -> int | None:
    """The wrap-up call's prompt size, when A found ``reason``; None when it does not fit
    ``max_prompt_chars`` (the run then just ends)."""
    size = d.context.prompt_chars + len(message(d, reason))
    if stopping.context_overflows(d.state.limits, size) is not None:
        return None
    return size


def request(
    d: Driver,
    step_idx: int,
    attempt: int,
    reason: StopReason,
    on_delta: Callable[[str, str], None] | None,
) -> ModelRequest:
    """The conversation plus the wrap-up message; the tool specs are sent (a provider may
    refuse tool calls in a conversation without tool definitions) with ``tool_choice="none"``."""
    last = {"role": "user", "content": message(d, reason)}
    messages = (*d.context.messages(), last)
    return ModelRequest(d.run_id, step_idx, attempt, messages, d.tool_specs, on_delta, "none")


async def failed(d: Driver, reason: StopReason, step: StepRecord, detail: str) -> RunResult:
    step = dataclasses.replace(step, wrap_up=True)
    return await d._end(reason, f"the wrap-up call failed: {detail}", step=step)


async def decide(
    d: Driver,
    reason: StopReason,
    step_idx: int,
    t0: float,
    prompt_chars: int,
    reply: ModelReply,
    call_id: str,
    first: tuple[Record, ...],
    replaced: int,
    model: str | None,
) -> RunResult:
    """Interpret the wrap-up reply (as if there were no tools) and end the run with its step;
    ``model``: the name of the model that answered."""
    try:
        decision = d.cfg.interpreter.interpret(reply, ())
    except Exception:
        if first:  # the reply is durable before the error propagates, as in deciding.decide
            await d._write(first)
        raise
    wall = (d.cfg.clock.monotonic() - t0) * 1000
    if isinstance(decision, Action):
        action, args_json, bad = clean_action(decision)
        text = d.cfg.wrap_up_no_action.format(budget=_budget(reason))
        outcome = Outcome(ActionStatus.not_executed, text, synthetic=True)
        step = action_step(
            step_idx, reply, call_id, action, args_json, outcome, 0, prompt_chars, wall,
            replaced + bad, model,
        )  # fmt: skip
        answer = None
    elif isinstance(decision, FinalAnswer | InvalidDecision):
        cleaned, bad = clean_decision(decision)
        if isinstance(cleaned, FinalAnswer):
            step = final_answer_step(
                step_idx, reply, call_id, prompt_chars, wall, None, replaced + bad, model
            )
            answer = cleaned.text
        else:
            assert isinstance(cleaned, InvalidDecision)
            step = invalid_step(
                step_idx, reply, call_id, cleaned.feedback, prompt_chars, wall,
                replaced + bad, model,
            )  # fmt: skip
            answer = None
    else:
        raise TypeError(f"the interpreter returned {decision!r}, not a Decision")
    step = dataclasses.replace(step, wrap_up=True)
    return await d._end(reason, final_answer=answer, records=first, step=step, reply=reply)
