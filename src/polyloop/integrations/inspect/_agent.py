"""``polyloop_agent``: an Inspect AI agent that runs one PolyLoop run per sample."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from inspect_ai.agent import Agent, AgentState, agent
from inspect_ai.model import ChatMessageUser, GenerateConfig, ModelOutput
from inspect_ai.util import store, suspend_token_limit

from ...context import ChatContextBuilder
from ...journal import SQLiteJournal
from ...loop import Loop
from ...seams import Journal
from ...tools import ToolRegistry
from ...types import DEFAULT_TEMPLATES, ConfigError, Limits, RunNotFound, RunResult, StopReason
from ._messages import Converter, from_inspect
from ._model import InspectModel
from ._sample import Sample, current_sample, sample_budgets

__all__ = ["METADATA_KEY", "polyloop_agent"]

METADATA_KEY = "polyloop"
"""The key of the run's summary in the sample's metadata and store."""

# One SQLite journal per file per process, shared by the samples running at once (its writer
# thread commits their steps together) and closed when the last of them ends.
_open: dict[Path, tuple[SQLiteJournal, int]] = {}


@contextlib.asynccontextmanager
async def _journal(
    given: Journal | str | os.PathLike[str] | None, sample: Sample
) -> AsyncIterator[tuple[Journal, str]]:
    if given is not None and not isinstance(given, str | os.PathLike):
        yield given, type(given).__name__
        return
    path = (Path(given) if given is not None else sample.journal_path()).resolve()
    journal, users = _open.get(path, (None, 0))
    if journal is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        journal = SQLiteJournal(path)
    _open[path] = (journal, users + 1)
    try:
        yield journal, str(path)
    finally:
        journal, users = _open[path]
        if users > 1:
            _open[path] = (journal, users - 1)
        else:
            del _open[path]
            await journal.aclose()


def _goal(state: AgentState) -> tuple[str, list[Any]]:
    """The run's goal (the text of the conversation's last message, a user message) and its
    history (the messages before it)."""
    messages = state.messages
    if not messages or not isinstance(messages[-1], ChatMessageUser):
        raise ConfigError(
            "polyloop_agent needs the sample's conversation to end with a user message (the "
            "task's input), which becomes the run's goal; put it after any solver that adds "
            "other messages"
        )
    return messages[-1].text, from_inspect(messages[:-1])


@agent
def polyloop_agent(
    tools: ToolRegistry | None = None,
    *,
    journal: Journal | str | os.PathLike[str] | None = None,
    limits: Limits | None = None,
    system_prompt: str | None = None,
    config: GenerateConfig | None = None,
    wrap_up: bool = False,
) -> Agent:
    """An Inspect agent (usable as a task's ``solver``) that runs the sample as one PolyLoop
    run, journaled, so that a retried eval resumes its samples' runs where they stopped.

    The model is the task's (``get_model()``: ``inspect eval --model`` chooses it), through
    :class:`InspectModel`. The goal is the text of the sample's last message (its input), the
    messages before it (a ``system_message()`` solver's, say) the run's history.

    The run id is :func:`sample_run_id` of the eval's task id, the sample id and the epoch:
    ``inspect eval-retry`` (and ``eval_set``) keep the task id, so a sample the retry runs
    again finds its run in the journal and resumes it (an ended run comes back as it ended,
    with no model call), with PolyLoop's guarantees: every journaled step is kept, an action
    in flight at the crash is decided by its tool's replay policy. A fresh ``inspect eval``
    has a new task id, hence new runs.

    Budgets (the run's ``Limits``, stored with it when it starts): ``limits`` (default
    ``Limits()``), tightened by what is left of the sample's ``message_limit`` and
    ``turn_limit`` (``max_steps``), ``token_limit`` (``max_tokens``), ``time_limit`` and
    ``working_limit`` (``max_seconds``), as :func:`budgets` says; the run ends with
    PolyLoop's stop reason (``step_budget``, ``token_budget``, ``time_budget``) before
    Inspect's limit would cut the sample off. While PolyLoop carries the token limit,
    Inspect's own token metering is suspended for the run's calls (the usage still counts in
    the sample's totals). A resumed run keeps the budgets it was started with.

    After the run: the sample's messages are the run's conversation as the model saw it, its
    output is the final answer (``state.output.completion``; "" when the run ended without
    one, e.g. on a budget), and ``metadata["polyloop"]`` and ``store()["polyloop"]`` hold
    ``run_id``, ``stop_reason``, ``stop_detail``, ``steps_used``, ``actions_executed``,
    ``tokens``, ``cost_usd``, ``active_s`` and ``journal``. A run that parks for an approval
    raises ``ApprovalRequired`` (the sample errors; a retry after the decision resumes it).

    A crash (the process killed, the machine lost) leaves the run resumable, and so does an
    interrupted ``inspect eval`` (SIGINT: Inspect exits without ending its samples). A sample
    that Inspect cancels while the eval goes on (its ``time_limit`` passing despite the
    budget) is a cancellation of the run: its end record is ``cancelled`` (PolyLoop's
    cancellation contract), so a retry gets that ended run back, with no model call.

    Args:
        tools: the run's tools (PolyLoop tools; add Inspect tools with
            :func:`add_inspect_tools`). None: no tools.
        journal: where runs are journaled: a SQLite file path, or any ``Journal`` (a
            ``PostgresJournal``, ...; used as given, never closed here). None:
            ``$POLYLOOP_INSPECT_JOURNAL``, else ``polyloop.sqlite`` in the eval's log
            directory. A SQLite file is opened once per process and shared by the samples
            running at once.
        limits: the run's budgets before the sample's limits tighten them.
        system_prompt: the run's system message when the sample's messages bring none (None:
            PolyLoop's default; "" sends none).
        config: Inspect ``GenerateConfig`` for every model call (temperature, ...).
        wrap_up: ``Loop(wrap_up=True)``: a last tool-less call for the best answer when a
            budget ends the run.

    Raises:
        ConfigError: when the agent runs: not inside an Inspect sample, the sample's
            conversation does not end with a user message, or the eval log is remote and no
            journal is named.
    """
    base = limits if limits is not None else Limits()
    registry = tools if tools is not None else ToolRegistry()
    prompt = DEFAULT_TEMPLATES.system_prompt if system_prompt is None else system_prompt

    async def execute(state: AgentState) -> AgentState:
        sample = current_sample()
        goal, history = _goal(state)
        model = InspectModel(config=config)
        brings_system = bool(history) and history[0]["role"] == "system"
        conversation = len(history) + 1 + (0 if brings_system or not prompt else 1)
        run_limits = sample_budgets(base, conversation)
        suspended = (
            suspend_token_limit() if run_limits.max_tokens is not None else contextlib.nullcontext()
        )
        async with _journal(journal, sample) as (opened, where):
            loop = Loop(
                model,
                tools=registry,
                journal=opened,
                limits=run_limits,
                context=ChatContextBuilder(system_prompt=system_prompt),
                time_budget_grace_s=0.0,
                wrap_up=wrap_up,
            )
            with suspended:
                result = await _start_or_resume(loop, sample, goal, history, run_limits)
        summary = _summary(result, where)
        sample.state.metadata[METADATA_KEY] = summary
        store().set(METADATA_KEY, summary)
        state.output = ModelOutput.from_content(
            model=str(model.model),
            content=result.final_answer or "",
            stop_reason="stop" if result.stop_reason == StopReason.agent_finished else "unknown",
        )
        state.messages = Converter(str(model.model)).convert(result.messages)
        return state

    return execute


async def _start_or_resume(
    loop: Loop, sample: Sample, goal: str, history: list[Any], limits: Limits
) -> RunResult:
    """Resume the sample's run when the journal has it (a retried eval), else start it."""
    run_id = sample.run_id
    try:
        return await loop.resume(run_id)
    except RunNotFound:
        pass
    return await loop.run(
        goal,
        run_id=run_id,
        history=history,
        metadata={"inspect": sample.identity()},
        limits=limits,
    )


def _summary(result: RunResult, journal: str) -> dict[str, Any]:
    totals = result.totals
    return {
        "run_id": result.run_id,
        "stop_reason": str(result.stop_reason),
        "stop_detail": result.stop_detail,
        "steps_used": result.steps_used,
        "actions_executed": result.actions_executed,
        "tokens": totals.tokens,
        "cost_usd": totals.cost_usd,
        "active_s": totals.active_s,
        "journal": journal,
    }
