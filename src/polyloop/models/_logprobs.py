"""The log-probabilities of a reply, read from the server's untrusted bytes into
:class:`~polyloop.types.TokenLogprob` once, here, for every adapter that can ask for them: the
option's check (``logprobs``, ``top_logprobs``), one sampled token or alternative read from
whatever object or mapping the SDK left it as, and the limits a reply's lists are held to.

A value of the wrong shape (a token that is not a string, a logprob that is not a finite
number <= 0 (NaN, an infinity, above 0 by more than rounding), a token id that is not an
int, more alternatives than asked for and one, more tokens than :data:`MAX_TOKENS`) makes
the reply ``bad_response``: the server was asked for log-probabilities and sent something
that is not, so the attempt failed (and is retried under the retry policy) rather than a
record being kept that cannot be trusted."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

from ..types import ConfigError, TokenLogprob
from ._common import bad_response

__all__ = ["MAX_TOKENS", "bounded_list", "check_logprobs", "field", "token_logprob", "tokens_of"]

MAX_TOKENS: Final = 1 << 20
"""The most sampled tokens one reply's log-probabilities may list (more: ``bad_response``)."""

_TOKEN_ID: Final = re.compile(r"token_id:(\d+)")
"""How vLLM spells a token under ``return_tokens_as_token_ids``."""


def check_logprobs(owner: str, logprobs: object, top_logprobs: object) -> int | None:
    """``ConfigError`` unless ``logprobs`` is a bool and ``top_logprobs`` None or an int >= 0
    given with ``logprobs=True``; returns ``top_logprobs`` (None: not sent)."""
    if not isinstance(logprobs, bool):
        raise ConfigError(f"{owner} logprobs must be True or False, got {logprobs!r}")
    if top_logprobs is None:
        return None
    if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int) or top_logprobs < 0:
        raise ConfigError(f"{owner} top_logprobs must be an int >= 0, got {top_logprobs!r}")
    if not logprobs:
        raise ConfigError(f"{owner} top_logprobs needs logprobs=True; pass both or neither")
    return top_logprobs


def field(raw: Any, name: str) -> Any:
    """``raw``'s field ``name``: an attribute of an SDK object (or a key of its ``model_extra``,
    where servers' additions land), or a key of a mapping the SDK left undecoded."""
    if isinstance(raw, Mapping):
        return raw.get(name)
    value = getattr(raw, name, None)
    if value is None:
        extra = getattr(raw, "model_extra", None)
        if isinstance(extra, Mapping):
            value = extra.get(name)
    return value


_ROUNDING: Final = 1e-6
"""How far above 0 a log-probability may be (a server's rounding); further is no probability."""


def _number(value: Any, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_response(where, f"{what} is not a finite number: {value!r:.80}")
    if value > _ROUNDING:
        raise bad_response(where, f"{what} is above 0, no log-probability: {value!r}")
    return float(value)


def token_logprob(
    token: Any, logprob: Any, token_id: Any, where: str, top: tuple[TokenLogprob, ...] = ()
) -> TokenLogprob:
    """One token as the server gave it, checked (see the module docstring). A token spelled
    ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``) has the id N when none is given."""
    if not isinstance(token, str):
        raise bad_response(where, f"a log-probability's token is not a string: {token!r:.80}")
    value = _number(logprob, where, f"the log-probability of token {token!r:.40}")
    if token_id is not None and (isinstance(token_id, bool) or not isinstance(token_id, int)):
        raise bad_response(where, f"token {token!r:.40} has a token id {token_id!r:.40}")
    if token_id is None and (m := _TOKEN_ID.fullmatch(token)) is not None:
        token_id = int(m.group(1))
    return TokenLogprob(token, value, token_id, top)


def _id_of(raw: Any) -> Any:
    """A token's id: ``token_id`` (Gemini, some servers) or ``id`` (llama.cpp's server)."""
    found = field(raw, "token_id")
    return field(raw, "id") if found is None else found


def bounded_list(value: Any, where: str, what: str, most: int = MAX_TOKENS) -> list[Any]:
    """``value`` if it is a list of at most ``most`` entries, else ``bad_response``."""
    if not isinstance(value, list):
        raise bad_response(where, f"{what} is not a list: {value!r:.80}")
    if len(value) > most:
        raise bad_response(where, f"{what} has {len(value)} entries, more than {most}")
    return value


def tokens_of(content: Any, where: str, top_logprobs: int | None) -> tuple[TokenLogprob, ...]:
    """The OpenAI shape, chat completions' ``logprobs.content`` and the Responses API's
    ``output_text.logprobs``: a list of ``{token, logprob, top_logprobs: [{token, logprob}]}``
    (``bytes`` is not kept: ``token`` holds the same text). At most ``top_logprobs`` + 1
    alternatives per token (llama-cpp-python adds the sampled token to the top k)."""
    most_top = (top_logprobs or 0) + 1
    tokens = []
    for raw in bounded_list(content, where, "the log-probabilities", MAX_TOKENS):
        alternatives = field(raw, "top_logprobs")
        top = tuple(
            token_logprob(field(t, "token"), field(t, "logprob"), _id_of(t), where)
            for t in bounded_list(alternatives or [], where, "a token's top_logprobs", most_top)
        )
        tokens.append(
            token_logprob(field(raw, "token"), field(raw, "logprob"), _id_of(raw), where, top)
        )
    return tuple(tokens)
