"""Builders for each kind of step record, exactly as the table in kernel.md §7 says.

``replaced_chars`` is the step's count of code points that were not valid Unicode in the text
the kernel received for it (see :mod:`polyloop.kernel.text`); ``model`` is the name of the model
whose reply the step holds (``seams.model_name``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..types import (
    STEP_SCHEMA_VERSION,
    Action,
    ModelReply,
    Outcome,
    StepRecord,
    raw_response_of,
)

__all__ = [
    "action_step",
    "final_answer_step",
    "invalid_step",
    "model_failure_step",
    "model_failures_in_a_row",
    "observation_cut",
]


def _step(
    step_idx: int,
    reply: ModelReply | None,
    llm_call_id: str | None,
    prompt_chars: int,
    wall_ms: float,
    replaced_chars: int,
    model: str | None,
    *,
    parse_ok: bool = True,
    parse_error: str | None = None,
    action: Action | None = None,
    observation: str | None = None,
    synthetic: bool = False,
    truncated_chars: int = 0,
    args_json: str | None = None,
    outcome: Outcome | None = None,
    outcome_unknown: str | None = None,
) -> StepRecord:
    """The one builder of every kind of step record: what the model replied (``reply``; None
    for a model failure) and the kind's own fields (the action and its ``outcome``, or none)."""
    if reply is None:
        raw, n_text, n_reason = "", 0, 0
    else:
        raw, n_text, n_reason = raw_response_of(reply), len(reply.text), len(reply.reasoning or "")
    # Positional, in StepRecord's field order: every step is built here, and a call by
    # keyword costs more per field.
    return StepRecord(
        step_idx,
        raw,
        n_text,
        n_reason,
        None if action is None else action.text,
        parse_ok,
        parse_error,
        observation,
        synthetic,
        truncated_chars,
        prompt_chars,
        llm_call_id,
        wall_ms,
        None if action is None else action.tool_name,
        args_json,
        None if outcome is None else outcome.status,
        False if outcome is None else outcome.completed,
        STEP_SCHEMA_VERSION,
        replaced_chars,
        model,
        False,  # wrap_up: the wrap-up call's step is a copy (kernel/wrap_up.py)
        outcome_unknown,
    )


def model_failure_step(
    step_idx: int, prompt_chars: int, wall_ms: float, replaced_chars: int = 0
) -> StepRecord:
    """C: the only step with ``parse_ok=False`` and ``parse_error=None``."""
    return _step(step_idx, None, None, prompt_chars, wall_ms, replaced_chars, None, parse_ok=False)


def model_failures_in_a_row(steps: Sequence[StepRecord], most: int) -> int:
    """The model-failure steps (C: ``llm_call_id`` None) at the end of ``steps``, counted up
    to ``most`` (so the work is bounded by the limit, never the history)."""
    n = 0
    for step in reversed(steps):
        if n >= most or step.llm_call_id is not None:
            break
        n += 1
    return n


def invalid_step(
    step_idx: int,
    reply: ModelReply,
    llm_call_id: str,
    feedback: str,
    prompt_chars: int,
    wall_ms: float,
    replaced_chars: int = 0,
    model: str | None = None,
) -> StepRecord:
    """D: an invalid decision; ``parse_error`` is the feedback sent to the model."""
    return _step(
        step_idx,
        reply,
        llm_call_id,
        prompt_chars,
        wall_ms,
        replaced_chars,
        model,
        parse_ok=False,
        parse_error=feedback,
    )


def final_answer_step(
    step_idx: int,
    reply: ModelReply,
    llm_call_id: str,
    prompt_chars: int,
    wall_ms: float,
    steer_feedback: str | None = None,
    replaced_chars: int = 0,
    model: str | None = None,
) -> StepRecord:
    """E: a final answer; a steered one carries the guard's feedback as synthetic observation."""
    return _step(
        step_idx,
        reply,
        llm_call_id,
        prompt_chars,
        wall_ms,
        replaced_chars,
        model,
        observation=steer_feedback,
        synthetic=steer_feedback is not None,
    )


def action_step(
    step_idx: int,
    reply: ModelReply,
    llm_call_id: str,
    action: Action,
    args_json: str | None,
    outcome: Outcome,
    kernel_cut: int,
    prompt_chars: int,
    wall_ms: float,
    replaced_chars: int = 0,
    model: str | None = None,
    outcome_unknown: str | None = None,
) -> StepRecord:
    """F: executed, not executed, or env error. The observation is kept in full;
    ``observation_truncated_chars`` is PolyLoop's cut plus the tool's own."""
    return _step(
        step_idx,
        reply,
        llm_call_id,
        prompt_chars,
        wall_ms,
        replaced_chars,
        model,
        action=action,
        observation=outcome.observation,
        synthetic=outcome.synthetic,
        truncated_chars=kernel_cut + outcome.truncated_chars,
        args_json=args_json,
        outcome=outcome,
        outcome_unknown=outcome_unknown,
    )


def observation_cut(observation: str, max_chars: int | None) -> int:
    """Characters of ``observation`` the model will not see under ``max_observation_chars``."""
    if max_chars is None or len(observation) <= max_chars:
        return 0
    return len(observation) - max_chars
