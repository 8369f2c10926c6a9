"""What crosses the model seam: the request the kernel sends, the reply a model returns (with
its tool calls), and the decision an interpreter reads from it."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._canonical import canonical_json
from ._checks import bad_value as _bad
from ._fast import fast_init
from ._usage import Usage

__all__ = [
    "Action",
    "Decision",
    "FinalAnswer",
    "InvalidDecision",
    "Message",
    "ModelReply",
    "ModelRequest",
    "TokenLogprob",
    "ToolCall",
    "ToolSpec",
    "raw_response_of",
]

Message: TypeAlias = Mapping[str, Any]
"""One chat message in the OpenAI chat format (``role``, ``content``, ``tool_calls``, ...).
Messages handed out by PolyLoop are never mutated after they are built; do not mutate them."""

ToolSpec: TypeAlias = Mapping[str, Any]
"""One tool as the model sees it, in the OpenAI format:
``{"type": "function", "function": {"name", "description", "parameters"}}``."""


@fast_init
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One native tool call in a model reply.

    ``arguments`` is a mapping or a JSON string; the string form is kept exactly as received
    (``raw_response`` records it verbatim, and malformed JSON is the interpreter's to judge).
    The field types are checked here: a wrong one raises ``MalformedValue``.
    """

    name: str
    arguments: Mapping[str, Any] | str
    id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise _bad("ToolCall.name", "a str", self.name)
        a = self.arguments
        if type(a) is not str and type(a) is not dict and not isinstance(a, str | Mapping):
            raise _bad("ToolCall.arguments", "a mapping or a JSON str", a)
        if self.id is not None and not isinstance(self.id, str):
            raise _bad("ToolCall.id", "a str or None", self.id)

    @property
    def arguments_text(self) -> str:
        """The arguments as a string: verbatim if received as a string, else canonical JSON."""
        if isinstance(self.arguments, str):
            return self.arguments
        return canonical_json(dict(self.arguments))


@fast_init
@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token of a reply with its log-probability (natural log, <= 0 up to
    rounding), as the server reported it: ``token`` its text as the server spelled it (vLLM's
    ``return_tokens_as_token_ids`` spells it ``"token_id:123"``), ``token_id`` the tokenizer's
    id when the server gave one (None: not given; never guessed), ``top`` the most likely
    tokens at this position (each a ``TokenLogprob`` whose own ``top`` is empty), in the
    server's order, which may include the sampled token itself. A field of the wrong type
    (or a logprob that is not a finite number) raises ``MalformedValue``."""

    token: str
    logprob: float
    token_id: int | None = None
    top: tuple[TokenLogprob, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.token, str):
            raise _bad("TokenLogprob.token", "a str", self.token)
        lp = self.logprob
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp):
            raise _bad("TokenLogprob.logprob", "a finite number", lp)
        i = self.token_id
        if i is not None and (isinstance(i, bool) or not isinstance(i, int)):
            raise _bad("TokenLogprob.token_id", "an int or None", i)
        if type(self.top) is not tuple:
            raise _bad("TokenLogprob.top", "a tuple of TokenLogprob", self.top)
        for alt in self.top:
            if not isinstance(alt, TokenLogprob):
                raise _bad("each of TokenLogprob.top", "a TokenLogprob", alt)


@fast_init
@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What the kernel hands the model for one call.

    ``messages`` is an immutable snapshot of the context at call time; ``attempt`` starts at 1
    and grows with each retry of the same step (also across a resume).
    """

    run_id: str
    step_idx: int
    attempt: int
    messages: Sequence[Message]
    tool_specs: Sequence[ToolSpec]
    on_delta: Callable[[str, str], None] | None = None
    """For a streaming adapter: call ``on_delta(kind, text)`` with each piece of the reply as
    it arrives (``kind`` is ``"text"``, ``"reasoning"`` or ``"tool_call"``, the latter with a
    fragment of a call's arguments); the kernel turns each into a ``ModelDelta`` event. None
    when nothing listens. Deltas are for display only: the journal records the complete reply
    that ``complete`` returns, or the attempt's failure."""
    tool_choice: str | None = None
    """None: the adapter's own tool choice. ``"none"``: ``tool_specs`` are sent (a provider may
    refuse a conversation with tool calls but no tool definitions) and the model must not call
    any: the built-in adapters send their API's "none" choice (the wrap-up call,
    ``Loop(wrap_up=True)``, asks this way)."""


@fast_init
@dataclass(frozen=True, slots=True)
class ModelReply:
    """One model reply: visible ``text``, optional ``reasoning``, native ``tool_calls``, the
        provider's ``call_id`` (None or "" when it gave none: PolyLoop then uses its intent id),
        ``usage`` (None when the provider did not report it) and ``model``, the name of the model
        that answered as the provider reported it (e.g. a dated snapshot of the model asked for;
        None when not reported), ``logprobs`` the sampled tokens of the reply with their
    log-probabilities, in order, when the model was asked for them (``OpenAIModel(logprobs=True)``)
    and the server sent them (None: not asked, or none sent; ``()``: asked and the server sent
    an empty list). ``tool_calls`` may be given as
        any sequence of :class:`ToolCall` (it is kept as a tuple); a field of the wrong type raises
        ``MalformedValue`` here (inside ``Model.complete``, that makes the call a failed one)."""

    text: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str | None = None
    usage: Usage | None = None
    model: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None

    def __post_init__(self) -> None:
        # Straight-line checks: a reply is built every step.
        if not isinstance(self.text, str):
            raise _bad("ModelReply.text", "a str", self.text)
        if self.reasoning is not None and not isinstance(self.reasoning, str):
            raise _bad("ModelReply.reasoning", "a str or None", self.reasoning)
        if self.call_id is not None and not isinstance(self.call_id, str):
            raise _bad("ModelReply.call_id", "a str or None", self.call_id)
        if self.usage is not None and not isinstance(self.usage, Usage):
            raise _bad("ModelReply.usage", "a Usage or None", self.usage)
        if self.model is not None and not isinstance(self.model, str):
            raise _bad("ModelReply.model", "a str or None", self.model)
        if self.logprobs is not None:
            _check_logprobs(self.logprobs)
        calls = self.tool_calls
        if type(calls) is not tuple:
            if isinstance(calls, str | bytes | Mapping):
                raise _bad("ModelReply.tool_calls", "a sequence of ToolCall", calls)
            try:
                calls = tuple(calls)
            except TypeError:
                raise _bad("ModelReply.tool_calls", "a sequence of ToolCall", calls) from None
            object.__setattr__(self, "tool_calls", calls)
        for call in calls:
            if not isinstance(call, ToolCall):
                raise _bad("each of ModelReply.tool_calls", "a ToolCall", call)


def _check_logprobs(logprobs: object) -> None:
    if type(logprobs) is not tuple:
        raise _bad("ModelReply.logprobs", "a tuple of TokenLogprob or None", logprobs)
    for lp in logprobs:
        if not isinstance(lp, TokenLogprob):
            raise _bad("each of ModelReply.logprobs", "a TokenLogprob", lp)


def raw_response_of(reply: ModelReply) -> str:
    """``raw_response`` of kernel.md §7: the visible text, and for native tool calls a newline
    plus the canonical JSON of the calls as received (``arguments`` verbatim)."""
    if not reply.tool_calls:
        return reply.text
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments_text} for c in reply.tool_calls]
    return reply.text + "\n" + canonical_json(calls)


@fast_init
@dataclass(frozen=True, slots=True)
class Action:
    """A decision to act. ``text`` is how the action appears in the trajectory (the interpreter
    decides: ``name(args)`` for a tool call, the code for a code block). ``tool_name`` and
    ``arguments`` are set for tool actions; ``call_id`` is the native tool call's id. A field of
    the wrong type raises ``MalformedValue`` here."""

    text: str
    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = None
    call_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise _bad("Action.text", "a str", self.text)
        if self.tool_name is not None and not isinstance(self.tool_name, str):
            raise _bad("Action.tool_name", "a str or None", self.tool_name)
        a = self.arguments
        if a is not None and type(a) is not dict and not isinstance(a, Mapping):
            raise _bad("Action.arguments", "a mapping or None", a)
        if self.call_id is not None and not isinstance(self.call_id, str):
            raise _bad("Action.call_id", "a str or None", self.call_id)


@fast_init
@dataclass(frozen=True, slots=True)
class FinalAnswer:
    """A decision to stop with an answer (``text``: a str, else ``MalformedValue``)."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise _bad("FinalAnswer.text", "a str", self.text)


@fast_init
@dataclass(frozen=True, slots=True)
class InvalidDecision:
    """The reply could not be read as an action or a final answer. ``feedback`` is sent back to
    the model and recorded as the step's ``parse_error`` (a str, else ``MalformedValue``)."""

    feedback: str

    def __post_init__(self) -> None:
        if not isinstance(self.feedback, str):
            raise _bad("InvalidDecision.feedback", "a str", self.feedback)


Decision: TypeAlias = Action | FinalAnswer | InvalidDecision
