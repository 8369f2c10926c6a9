"""Gemini's ``GenerateContentResponse`` read into a ``ModelReply``, for
:mod:`polyloop.models.gemini`: a response sent whole (:func:`reply`) and one streamed, chunk by
chunk (:class:`Chunks`, which puts the response sent whole together). No SDK is imported;
every field used is checked here, and a response of the wrong shape is ``bad_response``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, Final

from ..types import ModelReply, TokenLogprob, ToolCall
from ._common import (
    Relay,
    UsageFields,
    bad_response,
    content_filtered,
    cut_off,
    name_of,
    usage_from,
)
from ._logprobs import bounded_list, field, token_logprob

__all__ = ["OWN_ID_PREFIX", "USAGE", "Chunks", "reply"]

OWN_ID_PREFIX: Final = "gemini_"
"""The prefix of a function call id made here, for a call Gemini gave none (never sent)."""

USAGE: Final = UsageFields(
    ("prompt_token_count",),
    ("candidates_token_count", "thoughts_token_count"),
    ("cached_content_token_count",),
    ("thoughts_token_count",),
)
"""Where Gemini's usage holds each count (``GeminiModel``'s docstring says why)."""

# The finish reasons of a candidate Gemini stopped for its content policy.
_FILTERED: Final = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
    }
)


def _candidate(raw: Any, where: str, top: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
    return token_logprob(
        field(raw, "token"), field(raw, "log_probability"), field(raw, "token_id"), where, top
    )


def logprobs_of(result: Any, where: str, asked: int | None) -> tuple[TokenLogprob, ...] | None:
    """A candidate's ``logprobsResult``: ``chosenCandidates`` (token, tokenId, logProbability)
    with, at the same position, ``topCandidates[i].candidates`` (at most ``asked`` + 1).
    None when the candidate has none."""
    if result is None:
        return None
    chosen = bounded_list(field(result, "chosen_candidates") or [], where, "chosenCandidates")
    tops = bounded_list(field(result, "top_candidates") or [], where, "topCandidates")
    tokens = []
    for i, raw in enumerate(chosen):
        alternatives = field(tops[i], "candidates") if i < len(tops) else None
        most = (asked or 0) + 1  # the sampled token may be listed besides the top k
        alternatives = bounded_list(alternatives or [], where, "top candidates", most)
        top = tuple(_candidate(t, where) for t in alternatives)
        tokens.append(_candidate(raw, where, top))
    return tuple(tokens)


def reply(
    response: Any,
    where: str,
    remember: Callable[[str, bytes], None],
    asked: int | None = None,
) -> ModelReply:
    """Map a ``GenerateContentResponse`` to a ``ModelReply``; a wrong shape is
    ``bad_response``. ``remember`` is given each function call's id and the
    ``thoughtSignature`` Gemini attached to it, to send back with it. ``asked``: None when
    log-probabilities were not asked for (not read), else the top candidates asked for."""
    response_id = getattr(response, "response_id", None)
    candidates = getattr(response, "candidates", None)
    if not candidates:
        feedback = getattr(response, "prompt_feedback", None)
        reason = getattr(feedback, "block_reason", None)
        if reason is not None:
            raise content_filtered(
                where, f"it blocked the prompt (blockReason {getattr(reason, 'value', reason)})"
            )
        raise bad_response(where, f"no candidates in the response (responseId {response_id!r})")
    candidate = candidates[0]
    content = getattr(candidate, "content", None)
    parts = getattr(content, "parts", None) or ()
    finish = getattr(getattr(candidate, "finish_reason", None), "value", None)
    if finish in _FILTERED:
        raise content_filtered(where, f"finishReason {finish}")
    if not parts and finish in ("MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"):
        raise bad_response(where, f"the candidate ended {finish}")
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for part in parts:
        fn = getattr(part, "function_call", None)
        if fn is not None:
            name = getattr(fn, "name", None)
            if not isinstance(name, str) or not name:
                raise bad_response(where, f"a function call without a name: {fn!r}")
            args = getattr(fn, "args", None)
            gid = getattr(fn, "id", None)
            call_id = gid if isinstance(gid, str) and gid else None
            if call_id is None or call_id.startswith(OWN_ID_PREFIX):
                call_id = OWN_ID_PREFIX + uuid.uuid4().hex
            signature = getattr(part, "thought_signature", None)
            if isinstance(signature, bytes) and signature:
                remember(call_id, signature)
            calls.append(ToolCall(name, dict(args) if args else {}, call_id))
            continue
        text = getattr(part, "text", None)
        if isinstance(text, str) and text:
            (thoughts if getattr(part, "thought", None) else texts).append(text)
    return ModelReply(
        text="".join(texts),
        reasoning="".join(thoughts) or None,
        tool_calls=tuple(calls),
        call_id=response_id if isinstance(response_id, str) and response_id else None,
        usage=usage_from(getattr(response, "usage_metadata", None), USAGE),
        model=name_of(getattr(response, "model_version", None)),
        logprobs=None
        if asked is None
        else logprobs_of(getattr(candidate, "logprobs_result", None), where, asked),
    )


class Chunks:
    """The chunks of one streamed ``generateContent``, put together into the response sent
    whole: the first candidate's parts in order (each text or thought piece, and each
    function call, relayed to ``on_delta`` as it arrives), its ``finishReason``, the
    ``responseId``, and the ``modelVersion`` and usage of the last chunk that has them (a
    chunk's usage is the running total), and each chunk's ``logprobsResult`` lists, joined."""

    def __init__(self, where: str, on_delta: Callable[[str, str], None] | None) -> None:
        self.where = where
        self.relay = Relay(on_delta)
        self.parts: list[Any] = []
        self.finish: Any = None
        self.feedback: Any = None
        self.usage: Any = None
        self.model_version: str | None = None
        self.response_id: str | None = None
        self.logprobs: tuple[list[Any], list[Any]] | None = None

    def add(self, chunk: Any) -> None:
        self.response_id = self.response_id or name_of(getattr(chunk, "response_id", None))
        self.model_version = name_of(getattr(chunk, "model_version", None)) or self.model_version
        usage = getattr(chunk, "usage_metadata", None)
        if usage is not None:
            self.usage = usage
        feedback = getattr(chunk, "prompt_feedback", None)
        if getattr(feedback, "block_reason", None) is not None:
            self.feedback = feedback
        candidates = getattr(chunk, "candidates", None) or ()
        if not candidates:
            return
        candidate = candidates[0]
        for part in getattr(getattr(candidate, "content", None), "parts", None) or ():
            self.parts.append(part)
            fn = getattr(part, "function_call", None)
            if fn is not None:
                args = getattr(fn, "args", None)
                self.relay("tool_call", json.dumps(dict(args) if args else {}))
            elif getattr(part, "thought", None):
                self.relay("reasoning", getattr(part, "text", None))
            else:
                self.relay("text", getattr(part, "text", None))
        finish_reason = getattr(candidate, "finish_reason", None)
        if finish_reason is not None:
            self.finish = finish_reason
        result = getattr(candidate, "logprobs_result", None)
        if result is not None:
            chosen, top = self.logprobs = self.logprobs or ([], [])
            chosen += bounded_list(field(result, "chosen_candidates") or [], self.where, "chosen")
            top += bounded_list(field(result, "top_candidates") or [], self.where, "topCandidates")

    def response(self) -> Any:
        """The response; a stream with neither a finish reason nor a blocked prompt was cut
        off."""
        candidates = []
        if self.feedback is None:
            if self.finish is None:
                raise cut_off(self.where, "a chunk with a finishReason")
            content = SimpleNamespace(parts=self.parts)
            result = None
            if self.logprobs is not None:
                chosen, top = self.logprobs
                result = SimpleNamespace(chosen_candidates=chosen, top_candidates=top)
            candidates.append(
                SimpleNamespace(content=content, finish_reason=self.finish, logprobs_result=result)
            )
        return SimpleNamespace(
            candidates=candidates,
            prompt_feedback=self.feedback,
            response_id=self.response_id,
            model_version=self.model_version,
            usage_metadata=self.usage,
        )
