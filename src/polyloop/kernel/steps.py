"""Builders for each kind of step record, exactly as the table in kernel.md §7 says.

``replaced_chars`` is the step's count of code points that were not valid Unicode in the text
the kernel received for it (see :mod:`polyloop.kernel.text`); ``model`` is the name of the model
whose reply the step holds (``seams.model_name``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..types import (
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


def model_failure_step(
    step_idx: int, prompt_chars: int, wall_ms: float, replaced_chars: int = 0
) -> StepRecord:
    """C: the only step with ``parse_ok=False`` and ``parse_error=None``."""
    return StepRecord(
        step_idx=step_idx,
        raw_response="",
        response_chars=0,
        reasoning_chars=0,
        action=None,
        parse_ok=False,
        parse_error=None,
        observation=None,
        observation_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=prompt_chars,
        llm_call_id=None,
        step_wall_ms=wall_ms,
        replaced_chars=replaced_chars,
    )


def model_failures_in_a_row(steps: Sequence[StepRecord], most: int) -> int:
    """The model-failure steps (C: ``llm_call_id`` None) at the end of ``steps``, counted up
    to ``most`` (so the work is bounded by the limit, never the history)."""
    n = 0
    for step in reversed(steps):
        if n >= most or step.llm_call_id is not None:
            break
        n += 1
    return n


def _reply_fields(reply: ModelReply) -> tuple[str, int, int]:
    return raw_response_of(reply), len(reply.text), len(reply.reasoning or "")


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
    raw, n_text, n_reason = _reply_fields(reply)
    return StepRecord(
        step_idx=step_idx,
        raw_response=raw,
        response_chars=n_text,
        reasoning_chars=n_reason,
        action=None,
        parse_ok=False,
        parse_error=feedback,
        observation=None,
        observation_synthetic=False,
        observation_truncated_chars=0,
        prompt_chars=prompt_chars,
        llm_call_id=llm_call_id,
        step_wall_ms=wall_ms,
        replaced_chars=replaced_chars,
        model=model,
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
    raw, n_text, n_reason = _reply_fields(reply)
    return StepRecord(
        step_idx=step_idx,
        raw_response=raw,
        response_chars=n_text,
        reasoning_chars=n_reason,
        action=None,
        parse_ok=True,
        parse_error=None,
        observation=steer_feedback,
        observation_synthetic=steer_feedback is not None,
        observation_truncated_chars=0,
        prompt_chars=prompt_chars,
        llm_call_id=llm_call_id,
        step_wall_ms=wall_ms,
        replaced_chars=replaced_chars,
        model=model,
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
    raw, n_text, n_reason = _reply_fields(reply)
    return StepRecord(
        step_idx=step_idx,
        raw_response=raw,
        response_chars=n_text,
        reasoning_chars=n_reason,
        action=action.text,
        parse_ok=True,
        parse_error=None,
        observation=outcome.observation,
        observation_synthetic=outcome.synthetic,
        observation_truncated_chars=kernel_cut + outcome.truncated_chars,
        prompt_chars=prompt_chars,
        llm_call_id=llm_call_id,
        step_wall_ms=wall_ms,
        tool_name=action.tool_name,
        tool_args_json=args_json,
        action_status=outcome.status,
        completed=outcome.completed,
        replaced_chars=replaced_chars,
        model=model,
        outcome_unknown=outcome_unknown,
    )


def observation_cut(observation: str, max_chars: int | None) -> int:
    """Characters of ``observation`` the model will not see under ``max_observation_chars``."""
    if max_chars is None or len(observation) <= max_chars:
        return 0
    return len(observation) - max_chars
