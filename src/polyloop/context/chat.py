"""The chat-style context builder: OpenAI chat messages, one assistant turn per step.

The conversation is an append-only list. ``messages()`` hands out O(1) snapshots of it and
``prompt_chars`` is updated by each append, so a step costs the size of what it adds, never the
size of the whole history.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, SupportsIndex, overload

from polyloop.types import (
    DEFAULT_TEMPLATES,
    Limits,
    Message,
    ModelReply,
    RunTotals,
    Templates,
    ToolSpec,
    Turn,
    canonical_json,
)

__all__ = ["ChatContext", "ChatContextBuilder", "MessagesSnapshot"]


class MessagesSnapshot(Sequence[Message]):
    """The first ``len(self)`` messages of a context, frozen at the time of the snapshot.

    A view over the context's append-only list plus the length at snapshot time: taking one is
    O(1), and later steps never change it (they only append past its end). Supports ``len``,
    indexing (negative too), slicing (a slice is a tuple) and iteration. The messages are the
    context's own dicts: do not mutate them.
    """

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[Message], length: int) -> None:
        self._items = items
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: SupportsIndex) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: SupportsIndex | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            return tuple(self._items[i] for i in range(start, stop, step))
        i = operator.index(index)
        if i < 0:
            i += self._length
        if not 0 <= i < self._length:
            raise IndexError("message index out of range")
        return self._items[i]

    def __iter__(self) -> Iterator[Message]:
        return itertools.islice(self._items, self._length)

    def __repr__(self) -> str:
        return f"<MessagesSnapshot of {self._length} messages>"


def _keys_sorted(value: Any) -> Any:
    """A copy of ``value`` with the keys of every mapping in it sorted, nested ones too (lists
    and tuples become lists): the order a durable journal stores a history in. A conversation
    built from a history is then the same bytes whether the history came from the caller or,
    on resume, from any journal."""
    if isinstance(value, Mapping):
        return {key: _keys_sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_keys_sorted(item) for item in value]
    return value


def _content_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    # Structured content (a list of parts) counts as its canonical JSON: deterministic, and it
    # grows with what is sent.
    return len(canonical_json(content))


def _message_chars(message: Message) -> int:
    """kernel.md §7 for one message: its content plus, per tool call, name and arguments."""
    chars = _content_chars(message.get("content"))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        arguments = function.get("arguments") or ""
        if not isinstance(arguments, str):
            arguments = canonical_json(arguments)
        chars += len(function.get("name") or "") + len(arguments)
    return chars


class ChatContext:
    """The conversation of one run (the Context seam), made by :class:`ChatContextBuilder`.

    ``add_step`` appends, for a step with a reply, the assistant message and then what the
    model is told:

    * an invalid decision (``step.parse_error``): the feedback, as one tool message per tool
      call of the reply (every call is answered, exactly once), or as a user message when the
      reply had no tool call;
    * an observation: the text the model may see (``turn.observation_cut`` characters cut from
      its end, with ``templates.observation_cut`` saying so, and the budget hint if enabled), as
      the tool message answering the reply's one tool call, or as a user message when the reply
      had no tool call (e.g. a guard's steer). With several tool calls (an interpreter that
      acted on one of them) each call is answered with "" and the observation follows as a
      user message;
    * otherwise (a final answer) nothing more; tool calls, if any, are answered with "".

    The assistant message's ``content`` is always a string, "" when the reply has no text
    (never null: some OpenAI-compatible servers refuse it). A step without a reply (a model
    failure) adds nothing. Tool calls without an id, or whose
    id repeats one earlier in the same reply, get ``call_<step_idx>_<n>`` (``n`` is the call's
    position, from 0), so that a rebuilt conversation is byte-identical.

    ``prompt_chars`` is kernel.md §7's measure, kept up to date by every append: the content of
    each message (None counts 0; structured content counts its canonical JSON), plus the name
    and arguments string of each tool call, plus the canonical JSON of the tool specs.
    """

    def __init__(
        self,
        *,
        goal: str,
        history: Sequence[Message],
        tool_specs: Sequence[ToolSpec],
        system_prompt: str,
        templates: Templates,
        budget_hint: bool,
    ) -> None:
        self._templates = templates
        self._budget_hint = budget_hint
        self._messages: list[Message] = []
        self._chars = len(canonical_json(list(tool_specs)))
        if system_prompt:
            self._append({"role": "system", "content": system_prompt})
        for message in history:
            if not isinstance(message, Mapping):
                raise TypeError(f"history messages must be mappings, got {type(message).__name__}")
            self._append(_keys_sorted(message))
        self._append({"role": "user", "content": templates.goal.format(goal=goal)})

    @property
    def prompt_chars(self) -> int:
        """The size of ``messages()`` plus the tool specs, in code points (kernel.md §7)."""
        return self._chars

    def messages(self) -> MessagesSnapshot:
        """An immutable O(1) snapshot of the conversation so far."""
        return MessagesSnapshot(self._messages, len(self._messages))

    def add_step(self, turn: Turn) -> None:
        """Append what ``turn`` adds to the conversation (see the class docstring)."""
        reply = turn.reply
        if reply is None:
            return
        step = turn.step
        ids = _call_ids(reply, step.step_idx)
        message, chars = _assistant_message(reply, ids)
        self._messages.append(message)
        self._chars += chars
        if step.parse_error is not None:
            if ids:
                self._answer_each(ids, step.parse_error)
            else:
                self._append({"role": "user", "content": step.parse_error})
        elif step.observation is not None:
            text = self._visible(turn, step.observation)
            if len(ids) == 1:
                # What _append does, with the size known: a tool message counts its content.
                self._messages.append({"role": "tool", "tool_call_id": ids[0], "content": text})
                self._chars += len(text)
            else:
                self._answer_each(ids, "")
                self._append({"role": "user", "content": text})
        else:
            self._answer_each(ids, "")

    def _visible(self, turn: Turn, observation: str) -> str:
        cut = min(max(turn.observation_cut, 0), len(observation))
        text = observation[: len(observation) - cut]
        if cut > 0:
            text += self._templates.observation_cut.format(cut=cut)
        if self._budget_hint:
            limits = turn.limits
            actions = ""
            if limits.max_actions is not None:
                left = max(limits.max_actions - turn.actions_executed, 0)
                actions = f" · {left} actions left"
            actions += _spend_left(limits, turn.totals)
            failure = ""
            if turn.failure_seen and limits.same_failure_limit is not None:
                failure = self._templates.failure_hint.format(
                    seen=turn.failure_seen, limit=limits.same_failure_limit
                )
            text += self._templates.budget_hint.format(
                step=turn.steps_used, max_steps=limits.max_steps, actions=actions, failure=failure
            )
        return text

    def _answer_each(self, ids: Sequence[str], content: str) -> None:
        for call_id in ids:
            self._append({"role": "tool", "tool_call_id": call_id, "content": content})

    def _append(self, message: Message) -> None:
        self._messages.append(message)
        self._chars += _message_chars(message)

    def __repr__(self) -> str:
        return f"<ChatContext: {len(self._messages)} messages, {self._chars} chars>"


def _call_ids(reply: ModelReply, step_idx: int) -> list[str]:
    ids: list[str] = []
    for n, call in enumerate(reply.tool_calls):
        call_id = call.id
        if not call_id or call_id in ids:
            call_id = f"call_{step_idx}_{n}"
        ids.append(call_id)
    return ids


def _assistant_message(reply: ModelReply, ids: Sequence[str]) -> tuple[dict[str, Any], int]:
    """The assistant message of ``reply`` and its size as :func:`_message_chars` counts it
    (computed while building it: the arguments text is made once)."""
    # Always a string, "" for a reply that only calls tools: OpenAI's own shape there is null,
    # which llama-cpp-python's server refuses; "" is accepted by every compatible server.
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    chars = len(reply.text)
    if reply.tool_calls:
        calls = []
        for call_id, call in zip(ids, reply.tool_calls, strict=True):
            arguments = call.arguments_text
            chars += len(call.name or "") + len(arguments)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }
            )
        message["tool_calls"] = calls
    return message, chars


class ChatContextBuilder:
    """Makes a :class:`ChatContext` per run (the ContextBuilder seam). Stateless between runs:
    one builder serves many concurrent runs.

    The conversation is at most one system message, then the ``history`` messages, then the
    goal as a user message (``templates.goal``). History messages are copied with the keys of every
    mapping sorted (their content is unchanged): SQLite and PostgreSQL store a history that
    way, so a resumed run sends the same bytes as before its crash.

    Passing a run's ``RunResult.messages`` as the next run's ``history=`` (the phase pattern)
    gives exactly one system message, first (some chat templates refuse two):

    * a ``history`` that starts with a system message brings the conversation's system
      message: it is kept (it is what the earlier run's model saw), and the builder adds none;
    * the builder's prompt yields to it silently only when it is PolyLoop's default wording or
      "": a prompt the caller chose (``system_prompt=``, or ``templates`` with another
      ``system_prompt``) must equal the history's, and when it differs :meth:`new` raises
      ``ValueError`` rather than drop either text (``Loop.run`` then writes nothing). Pass
      ``history[1:]`` to send the builder's prompt instead, or ``system_prompt=""`` to keep
      the history's;
    * otherwise the builder's system prompt comes first (none when it is "").

    System messages later in ``history`` stay where they are: PolyLoop never puts one there,
    OpenAI's API accepts them, and moving, converting or dropping one would change what the
    model is told (a server whose chat template wants a single leading system message will
    refuse such a history). The rule depends only on the history and the builder, so a
    resumed run rebuilds the same conversation from its stored history.

    Args:
        system_prompt: the system message; None uses ``templates.system_prompt``, "" sends none.
        templates: the wording PolyLoop writes for the model.
        budget_hint: append ``templates.budget_hint`` (steps used of ``max_steps``, and what is
            left of each of ``max_actions``, ``max_tokens``, ``max_cost``, ``max_seconds`` that
            is set, e.g. ``[step 3 of 30 · 1200 tokens left · $0.42 left · 35 s left]``; with
            ``same_failure_limit``, how often the failure counted at this step has been seen)
            to every observation the model sees. The time left is as of the step's write, so a
            resumed run rebuilds the same text.
    """

    def __init__(
        self,
        *,
        system_prompt: str | None = None,
        templates: Templates = DEFAULT_TEMPLATES,
        budget_hint: bool = False,
    ) -> None:
        self._system_prompt = templates.system_prompt if system_prompt is None else system_prompt
        # The default wording is no choice of the caller's: it yields to a history's prompt.
        self._prompt_chosen = bool(self._system_prompt) and (
            self._system_prompt != DEFAULT_TEMPLATES.system_prompt or system_prompt is not None
        )
        self._templates = templates
        self._budget_hint = budget_hint

    def new(
        self, *, goal: str, history: Sequence[Message], tool_specs: Sequence[ToolSpec]
    ) -> ChatContext:
        """A fresh context for one run: system message, ``history``, goal (see the class
        docstring for which system message).

        Raises:
            ValueError: ``history`` starts with a system message that differs from a system
                prompt the caller chose for this builder.
            TypeError: a ``history`` message is not a mapping.
        """
        system_prompt = self._system_prompt
        first = history[0] if len(history) else None
        if isinstance(first, Mapping) and first.get("role") == "system":
            theirs = first.get("content")
            if self._prompt_chosen and theirs != system_prompt:
                raise ValueError(
                    "history starts with a system message that differs from this "
                    f"ChatContextBuilder's system prompt ({_preview(theirs)} vs "
                    f"{_preview(system_prompt)}); pass history[1:] to send the builder's, "
                    "or system_prompt='' to keep the history's"
                )
            system_prompt = ""  # the history's is the conversation's system message
        return ChatContext(
            goal=goal,
            history=history,
            tool_specs=tool_specs,
            system_prompt=system_prompt,
            templates=self._templates,
            budget_hint=self._budget_hint,
        )

    def __repr__(self) -> str:
        return f"ChatContextBuilder(budget_hint={self._budget_hint})"


def _preview(content: Any, limit: int = 40) -> str:
    """``content`` for an error message: its repr, cut to about ``limit`` characters."""
    text = repr(content)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _spend_left(limits: Limits, totals: RunTotals | None) -> str:
    """The budget hint's part for the token, cost and time budgets that are set:
    `` · 1200 tokens left · $0.42 left · 35 s left``."""
    if totals is None:
        return ""
    out = ""
    if limits.max_tokens is not None:
        out += f" · {max(limits.max_tokens - totals.tokens, 0)} tokens left"
    if limits.max_cost is not None:
        out += f" · ${max(limits.max_cost - totals.cost_usd, 0.0):.2f} left"
    if limits.max_seconds is not None:
        out += f" · {max(limits.max_seconds - totals.active_s, 0.0):.0f} s left"
    return out
