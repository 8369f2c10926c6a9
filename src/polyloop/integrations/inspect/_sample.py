"""What PolyLoop reads of the Inspect sample it runs in: its identity (the run id), where the
eval log is (the default journal), and its limits (the run's budgets). Inspect's private
modules are read here only."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inspect_ai.solver import TaskState
from inspect_ai.util import sample_limits

from ...types import ConfigError, Limits

__all__ = [
    "JOURNAL_ENV",
    "Sample",
    "budgets",
    "current_sample",
    "sample_budgets",
    "sample_run_id",
]

JOURNAL_ENV = "POLYLOOP_INSPECT_JOURNAL"
"""The environment variable naming the SQLite journal file when ``journal=`` is not given."""

JOURNAL_FILE = "polyloop.sqlite"
"""The default journal's file name, in the eval's log directory."""


def sample_run_id(task_id: str, sample_id: int | str, epoch: int) -> str:
    """The PolyLoop run id of one sample of one eval: ``"inspect-"`` and the first 24 hex
    digits of the SHA-256 of ``[task_id, sample_id, epoch]`` as JSON. ``task_id`` is Inspect's
    ``EvalSpec.task_id``, which ``inspect eval-retry`` and ``eval_set`` keep for the retried
    eval, so a retried sample finds its run. A sample id of 1 and of "1" give different ids."""
    body = json.dumps([task_id, sample_id, epoch], separators=(",", ":"), ensure_ascii=False)
    return "inspect-" + hashlib.sha256(body.encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Sample:
    """The running sample: its identity, its ``TaskState`` and its log's location."""

    task_id: str
    task: str
    sample_id: int | str
    epoch: int
    log_location: str
    state: TaskState

    @property
    def run_id(self) -> str:
        return sample_run_id(self.task_id, self.sample_id, self.epoch)

    def identity(self) -> dict[str, Any]:
        """Stored with the run (``metadata["inspect"]``)."""
        return {
            "task_id": self.task_id,
            "task": self.task,
            "sample_id": self.sample_id,
            "epoch": self.epoch,
        }

    def journal_path(self) -> Path:
        """The default SQLite journal: ``$POLYLOOP_INSPECT_JOURNAL``, else ``polyloop.sqlite``
        in the eval log's directory.

        Raises:
            ConfigError: the log is not on a local file system (S3, ...) and no journal is
                named.
        """
        named = os.environ.get(JOURNAL_ENV)
        if named:
            return Path(named)
        location = self.log_location
        if location.startswith("file://"):
            location = location[len("file://") :]
        elif "://" in location:
            raise ConfigError(
                f"the eval log {self.log_location} is not on this machine, so PolyLoop's "
                f"journal cannot sit beside it: pass polyloop_agent(journal=...) or set "
                f"{JOURNAL_ENV} to a local SQLite file"
            )
        return Path(location).parent / JOURNAL_FILE


def current_sample() -> Sample:
    """The sample this code runs in.

    Raises:
        ConfigError: not inside a running Inspect sample.
    """
    from inspect_ai._control.eval_state import stable_task_id_for_eval
    from inspect_ai.log._samples import sample_active
    from inspect_ai.solver._task_state import sample_state

    active = sample_active()
    state = sample_state()
    if active is None or state is None:
        raise ConfigError(
            "polyloop_agent runs inside an Inspect sample: use it as a task's solver "
            "(Task(solver=polyloop_agent(...))) and run the task with inspect eval"
        )
    return Sample(
        task_id=stable_task_id_for_eval(active.eval_id),
        task=active.task,
        sample_id=state.sample_id,
        epoch=state.epoch,
        log_location=active.log_location,
        state=state,
    )


MESSAGES_PER_STEP = 2
"""Messages one step adds to the conversation: the model's and the tool result."""


def budgets(
    base: Limits,
    *,
    conversation: int,
    message_limit: float | None = None,
    turns_left: float | None = None,
    tokens_left: float | None = None,
    seconds_left: float | None = None,
) -> Limits:
    """``base`` tightened by what is left of a sample's limits (each only when it is set):

    * ``message_limit``: ``max_steps`` at most ``(message_limit - conversation) // 2``: each
      step adds two messages (the model's turn and the tool result) to the ``conversation``
      messages the run starts with, and Inspect refuses a model call once the conversation
      holds ``message_limit`` messages;
    * ``turns_left`` (of ``turn_limit``): ``max_steps`` at most that;
    * ``tokens_left`` (of ``token_limit``): ``max_tokens`` at most that (PolyLoop counts input
      plus output tokens of every attempt);
    * ``seconds_left`` (the lesser of ``time_limit``'s and ``working_limit``'s): ``max_seconds``
      at most that less a margin of 1 s plus 5 %, so that the run ends ``time_budget`` before
      Inspect's own timer cancels the sample.

    Each is at least 1 (1 ms for seconds): a limit already used up leaves the run one step,
    whose model call Inspect then refuses (``llm_error``, kind ``inspect_limit``).
    ``cost_limit`` is not mapped: Inspect's own check refuses the call that would cross it.
    """
    steps = base.max_steps
    if message_limit is not None:
        steps = min(steps, max(1, (int(message_limit) - conversation) // MESSAGES_PER_STEP))
    if turns_left is not None:
        steps = min(steps, max(1, int(turns_left)))
    tokens = base.max_tokens
    if tokens_left is not None:
        left = max(1, int(tokens_left))
        tokens = left if tokens is None else min(tokens, left)
    seconds = base.max_seconds
    if seconds_left is not None:
        room = max(seconds_left - 1.0 - 0.05 * seconds_left, 0.001)
        seconds = room if seconds is None else min(seconds, room)
    return replace(base, max_steps=steps, max_tokens=tokens, max_seconds=seconds)


def sample_budgets(base: Limits, conversation: int) -> Limits:
    """:func:`budgets` with what is left of the running sample's limits."""
    limits = sample_limits()
    times = [t for t in (limits.time.remaining, limits.working.remaining) if t is not None]
    return budgets(
        base,
        conversation=conversation,
        message_limit=limits.message.limit,
        turns_left=limits.turn.remaining,
        tokens_left=limits.token.remaining,
        seconds_left=min(times) if times else None,
    )
