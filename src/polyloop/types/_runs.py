"""What a run is outside its journal records: the ``runs`` row it was started with
(``RunSpec``), the lease that lets one execution advance it (``Lease``), its result
(``RunResult``), and what a context builder is given per step (``Turn``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._enums import StopReason
from ._fast import fast_init
from ._ledger import TestEdit
from ._limit_requests import LimitsRequest
from ._limits import Limits
from ._model_io import Message, ModelReply, TokenLogprob
from ._records import PendingAction, RunTotals
from ._report import EscalationReport
from ._requests import EndRequest
from ._step import StepRecord
from ._usage import Usage

__all__ = ["AttemptLogprobs", "Lease", "RunResult", "RunSpec", "Turn"]


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a run was started with; the journal's ``runs`` row holds it."""

    run_id: str
    goal: str
    limits: Limits
    created_at: float
    history: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] | None = None
    wording_version: str = ""


@fast_init
@dataclass(frozen=True, slots=True)
class Lease:
    """The right to advance one run, held by one execution until ``expires_at`` (epoch s).

    ``owner`` names the execution (host id, pid, process start time, random token); two
    executions never share one. Journals fence every write of a run with its lease.

    ``request``: the request to end the run stored in its ``runs`` row when the journal handed
    this lease out (``acquire``, ``renew``), or None; journals that take no requests leave it
    None. The owner learns of a request from it, with no read of its own.

    ``limits``: the requests to change the run's budgets not applied yet when the journal
    handed this lease out (oldest first); the owner applies them at its next step boundary.
    """

    run_id: str
    owner: str
    expires_at: float
    request: EndRequest | None = None
    limits: tuple[LimitsRequest, ...] = ()


@dataclass(frozen=True, slots=True)
class AttemptLogprobs:
    """The log-probabilities of one model call attempt's reply (``ModelReply.logprobs``):
    the attempt ``attempt`` (from 1, as in ``model_calls``) of step ``step_idx``."""

    step_idx: int
    attempt: int
    tokens: tuple[TokenLogprob, ...]


@dataclass(frozen=True, slots=True)
class RunResult:
    """The result of a run (kernel.md §9). Also rebuilt by ``Loop.resume`` of an ended run.

    ``stop_reason`` is ``cancelled`` on a result that ``Loop.run`` returned only after a cancel
    request (``Loop.cancel``); a cancellation of the caller's task re-raises instead, and then
    only a rebuilt result of the cancelled run carries it.
    """

    run_id: str
    stop_reason: StopReason
    stop_detail: str | None
    final_answer: str | None
    steps: tuple[StepRecord, ...]
    steps_used: int
    actions_executed: int
    started_at: float
    """Epoch seconds the run was created."""
    ended_at: float
    """Epoch seconds the end record was written."""
    pending_action: PendingAction | None = None
    """The unresolved action of a ``resume_state_unknown`` run."""
    usage: Usage | None = None
    """Token totals over all model calls whose provider reported usage; None if none did."""
    report: EscalationReport | None = None
    """Why a ``repeated_failure`` or ``escalated`` run was stopped (``to_markdown()``,
    ``to_json()``)."""
    totals: RunTotals = field(default_factory=lambda: RunTotals())
    """What the run spent: tokens, cost, active seconds (the budgets of ``Limits``)."""
    test_edits: tuple[TestEdit, ...] = ()
    """Every edit of a test file the run's actions reported (``FileEdit.test_file``), in
    order: a run that completed after one may have weakened its tests instead of fixing."""
    messages: tuple[Message, ...] = field(default=(), repr=False)
    """The conversation as the model last saw it (plus the final reply), for the next phase."""
    logprobs: tuple[AttemptLogprobs, ...] = field(default=(), repr=False)
    """The log-probabilities of every attempt whose reply carried them (a model built with
    ``logprobs=True``), in the order the attempts were made; empty when none did. A resumed
    run's include those of the attempts made before (journaled in ``model_calls.logprobs``)."""


@fast_init
@dataclass(frozen=True, slots=True)
class Turn:
    """What a context builder is given to add one step to the conversation.

    Args:
        step: the step record (its ``parse_error`` or ``observation`` is what the model is told).
        reply: the model reply of the step (None for a model-failure step: nothing to add).
        observation_cut: characters PolyLoop cut from the end of ``step.observation`` for the
            model (``Limits.max_observation_chars``); 0 when it sees it all.
        steps_used: steps in the trajectory including this one.
        actions_executed: executed actions including this one.
        limits: the limits in force for this step (for an opt-in budget hint).
        failure_seen: how often the failure the failure guard counted at this step has been
            counted so far, this step included (0 when it counted none), for the hint.
        totals: what the run had spent when the step was written (tokens, cost, active
            seconds), for the hint of the token, cost and time budgets; None when the run has
            none of those budgets.
    """

    step: StepRecord
    reply: ModelReply | None
    observation_cut: int
    steps_used: int
    actions_executed: int
    limits: Limits
    failure_seen: int = 0
    totals: RunTotals | None = None
