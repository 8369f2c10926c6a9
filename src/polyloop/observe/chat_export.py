"""Runs as trainers read them: one record per run, its conversation in the OpenAI chat shape.

:func:`chat_records` reads a journal through its public read API (``list_runs``, ``read``,
``step_usage``: the SQLite, PostgreSQL and memory journals have them) and yields, run after
run, one JSON-ready dict: the run's fields and totals, ``messages`` (the conversation) and
``turns`` (what each assistant turn spent, and its log-probabilities when recorded). The
``polyloop export --format chat`` command writes them as JSON Lines.

The conversation is rebuilt from the journal's records with a context builder, step by step,
as the run built it, so it equals what ``RunResult.messages`` held for the run (and what a
resumed run rebuilt): the system message, any ``history``, the goal, then per step the
assistant message (its tool calls with their ids) and the tool or user messages that answered
it (the observation as the model saw it, cut where PolyLoop cut it; a parse error's feedback).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from polyloop.context import ChatContextBuilder
from polyloop.seams import ContextBuilder
from polyloop.types import (
    ActionResult,
    ActionStatus,
    ApprovalRequested,
    LimitsChanged,
    Message,
    ModelReply,
    ModelResult,
    Record,
    RunSpec,
    RunTotals,
    StepRecord,
    StepWritten,
    Turn,
)
from polyloop.types._logprob_form import logprobs_json

__all__ = [
    "PAGE_SIZE",
    "REDACTED",
    "RUN_FIELDS",
    "TURN_FIELDS",
    "ChatReader",
    "chat_records",
    "listed_runs",
    "redact_arguments",
]

PAGE_SIZE = 500
"""Runs per ``list_runs`` page when :func:`listed_runs` reads a journal: the rows held at once
(about 2.5 KB each)."""

REDACTED = "[redacted]"
"""What a redacted text becomes."""

RUN_FIELDS = (
    "run_id",
    "status",
    "stop_reason",
    "stop_detail",
    "final_answer",
    "steps_used",
    "actions_executed",
    "created_at",
    "ended_at",
    "wording_version",
    "tokens_used",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_usd",
    "active_seconds",
    "usage_missing",
    "metadata",
    "goal",
)
"""The run's fields of a chat record, named and valued as ``list_runs`` gives them."""

TURN_FIELDS = (
    "message_index",
    "step_idx",
    "model",
    "wrap_up",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "cost_usd",
    "logprobs",
)
"""The fields of each entry of a chat record's ``turns``."""

_STEP_USAGE = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens", "cost_usd")


class ChatReader(Protocol):
    """The read API :func:`chat_records` uses (the SQLite, PostgreSQL and memory journals)."""

    async def list_runs(self) -> list[dict[str, Any]]: ...

    async def read(self, run_id: str) -> tuple[RunSpec, Any]: ...

    async def step_usage(self, run_id: str) -> dict[int, dict[str, Any]]: ...


def _pages(list_runs: Any) -> bool:
    """Whether a journal's ``list_runs`` takes the page keywords ``after`` and ``limit``."""
    try:
        params = inspect.signature(list_runs).parameters
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return True
    return "after" in params and "limit" in params


async def listed_runs(
    journal: Any, *, page_size: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Yield ``journal.list_runs()``'s rows, oldest first, read ``page_size`` runs at a time
    (None: :data:`PAGE_SIZE`) with ``list_runs(after=..., limit=page_size)`` (the SQLite,
    PostgreSQL and memory journals page by keyset), so memory holds one page of rows. A
    journal whose ``list_runs`` takes no ``after``/``limit`` keywords is read with one
    ``list_runs()`` call. Raises ``ValueError`` for a ``page_size`` below 1, and what
    ``list_runs`` raises."""
    if page_size is None:
        page_size = PAGE_SIZE
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size takes a whole number >= 1, got {page_size!r}")
    if not _pages(journal.list_runs):
        for row in await journal.list_runs():
            yield row
        return
    after: tuple[float, str] | None = None
    while True:
        rows = await journal.list_runs(after=after, limit=page_size)
        for row in rows:
            yield row
        if len(rows) < page_size:
            return
        after = (rows[-1]["created_at"], rows[-1]["run_id"])


async def chat_records(
    journal: ChatReader,
    *,
    context: ContextBuilder | None = None,
    redact: bool = False,
    page_size: int | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Yield one chat record per run of ``journal``, oldest run first.

    Streaming: a run is read, turned into its record and handed out before the next run is
    read, and the runs are listed ``page_size`` at a time (:func:`listed_runs`; None:
    :data:`PAGE_SIZE`), so memory
    holds one run's records and one page of ``list_runs`` rows, however many runs there are
    (a journal whose ``list_runs`` cannot page lists every run's row first).

    A record has the run's fields (:data:`RUN_FIELDS`, as ``list_runs`` names them: tokens are
    the run's totals, ``cost_usd`` US dollars or None when unknown), then:

    * ``messages``: the conversation in the OpenAI chat shape, equal to ``RunResult.messages``
      of the run: ``{"role": "system"|"user"|"assistant"|"tool", "content": str}``, an
      assistant message with ``tool_calls`` (``id``, ``type: "function"``, ``function``:
      ``name`` and ``arguments`` as a JSON string), a tool message with ``tool_call_id``. A run
      that has not ended gives its conversation so far. The wrap-up message of a wrap-up step
      (``Templates.wrap_up``) was sent after the conversation but is not part of it: the
      step's turn says ``wrap_up: true``.
    * ``turns``: one entry per assistant message the run's steps added, in order
      (:data:`TURN_FIELDS`): ``message_index`` (its index in ``messages``), ``step_idx``,
      ``model`` (the name of the model that answered, None without one), ``wrap_up``, the
      tokens and cost of the step's model calls (summed over its attempts; None when not
      reported), and ``logprobs``: the answering attempt's sampled tokens when its reply
      carried them (a model built with ``logprobs=True``), ``{"token", "logprob",
      "token_id", "top_logprobs"}`` each, ``top_logprobs`` a list of ``{"token", "logprob",
      "token_id"}`` (``token_id`` None where the server returns none); None otherwise.

    ``context`` is the context builder the runs were made with (default: a
    ``ChatContextBuilder()``, which ``Loop`` and ``polyloop run`` use unless told otherwise):
    the journal holds no system prompt or templates, so pass the same builder for the same
    messages. A budget hint's failure count (``same_failure_limit``) is not rebuilt: it
    reads 0.

    ``redact``: every message's content, the tool calls' argument values, the goal, the final
    answer and the stop detail become ``"[redacted]"`` (tool names, ids and roles stay; the
    metadata stays, as the run's labels).

    Raises what the journal's reads raise (``JournalError`` for an unreadable run).
    """
    builder = context if context is not None else ChatContextBuilder()
    async for row in listed_runs(journal, page_size=page_size):
        run_id = row["run_id"]
        spec, records = await journal.read(run_id)
        usage = await journal.step_usage(run_id)
        messages, turns = _conversation(builder, spec, records, usage)
        out: dict[str, Any] = {name: row.get(name) for name in RUN_FIELDS}
        out["messages"], out["turns"] = messages, turns
        yield _redacted(out) if redact else out


def _conversation(
    builder: ContextBuilder,
    spec: RunSpec,
    records: Any,
    usage: Mapping[int, Mapping[str, Any]],
) -> tuple[list[Message], list[dict[str, Any]]]:
    """The run's messages (a copy of the rebuilt context's) and its turns."""
    ctx = builder.new(goal=spec.goal, history=spec.history, tool_specs=())
    walk = _Walk(spec)
    turns: list[dict[str, Any]] = []
    for rec in records:
        turn = walk.see(rec)
        if turn is None:
            continue
        before = len(ctx.messages())
        ctx.add_step(turn)
        step = turn.step
        if turn.reply is not None and len(ctx.messages()) > before:
            spent = usage.get(step.step_idx) or {}
            turns.append(
                {
                    "message_index": before,
                    "step_idx": step.step_idx,
                    "model": step.model,
                    "wrap_up": step.wrap_up,
                    **{name: spent.get(name) for name in _STEP_USAGE},
                    "logprobs": logprobs_json(turn.reply.logprobs),
                }
            )
    return [dict(m) for m in ctx.messages()], turns


class _Walk:
    """What a context builder is given per step, from the run's records in order: the step's
    reply (its model result), PolyLoop's observation cut (the step's, less what the tool cut
    itself) and the counters of the budget hint."""

    def __init__(self, spec: RunSpec) -> None:
        self.limits = spec.limits
        self.reply: ModelReply | None = None
        self.tool_cut = 0
        self.steps = 0
        self.actions = 0
        self.tokens = 0
        self.cost = 0.0
        self.missing = 0
        self.active_s = 0.0

    def see(self, rec: Record) -> Turn | None:
        match rec:
            case ModelResult(reply=reply, cost_usd=cost):
                self.reply = reply
                if reply.usage is None:
                    self.missing += 1
                else:
                    self.tokens += (reply.usage.input_tokens or 0) + (
                        reply.usage.output_tokens or 0
                    )
                    self.cost += cost or 0.0
            case ActionResult(outcome=outcome):
                self.tool_cut = outcome.truncated_chars
            case ApprovalRequested(active_s=active_s) if active_s is not None:
                self.active_s = active_s
            case LimitsChanged(limits=limits):
                self.limits = limits
            case StepWritten(step=step, active_s=active_s):
                return self._turn(step, active_s)
        return None

    def _turn(self, step: StepRecord, active_s: float | None) -> Turn:
        if active_s is not None:
            self.active_s = active_s
        self.steps += 1
        if step.action_status is ActionStatus.executed:
            self.actions += 1
        reply = self.reply
        cut = max(0, step.observation_truncated_chars - self.tool_cut)
        self.reply, self.tool_cut = None, 0
        limits = self.limits
        budgets = (limits.max_tokens, limits.max_cost, limits.max_seconds)
        totals = None
        if any(b is not None for b in budgets):
            totals = RunTotals(self.tokens, self.cost, self.active_s, self.missing)
        return Turn(step, reply, cut, self.steps, self.actions, limits, totals=totals)


def redact_arguments(arguments_json: str) -> str:
    """Tool-call arguments (a JSON text) with every value ``"[redacted]"`` (an object keeps its
    keys; anything else, or text that is not JSON, becomes ``"[redacted]"`` as a whole)."""
    try:
        args = json.loads(arguments_json)
    except ValueError:
        args = None
    return json.dumps({k: REDACTED for k in args} if isinstance(args, dict) else REDACTED)


def _redacted(record: dict[str, Any]) -> dict[str, Any]:
    for key in ("goal", "final_answer", "stop_detail"):
        if record[key] is not None:
            record[key] = REDACTED
    messages = []
    for message in record["messages"]:
        m = dict(message)
        if m.get("content") not in (None, ""):
            m["content"] = REDACTED
        if m.get("tool_calls"):
            m["tool_calls"] = [_redacted_call(call) for call in m["tool_calls"]]
        messages.append(m)
    record["messages"] = messages
    return record


def _redacted_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if arguments is not None:
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        function["arguments"] = redact_arguments(text)
    return {**call, "function": function}
