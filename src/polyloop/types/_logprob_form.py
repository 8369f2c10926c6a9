"""The JSON form of a reply's log-probabilities, one shape wherever PolyLoop writes them: a
turn's ``logprobs`` in the chat export and the ``model_calls.logprobs`` column of the journals
(journal schema 2.1), and read back from that column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._model_io import TokenLogprob

__all__ = ["logprobs_from_form", "logprobs_json"]


def _one(t: TokenLogprob) -> dict[str, Any]:
    return {"token": t.token, "logprob": t.logprob, "token_id": t.token_id}


def logprobs_json(tokens: tuple[TokenLogprob, ...] | None) -> list[dict[str, Any]] | None:
    """``tokens`` as a list of ``{"token", "logprob", "token_id", "top_logprobs"}``,
    ``top_logprobs`` a list of ``{"token", "logprob", "token_id"}`` (``token_id`` None where
    the server gave none); None for None (no log-probabilities recorded)."""
    if tokens is None:
        return None
    return [{**_one(t), "top_logprobs": [_one(a) for a in t.top]} for t in tokens]


def _token(d: Any, top: Sequence[TokenLogprob] = ()) -> TokenLogprob:
    if not isinstance(d, dict):
        raise TypeError(f"a token must be an object, not {type(d).__name__}")
    return TokenLogprob(d["token"], d["logprob"], d["token_id"], tuple(top))


def logprobs_from_form(value: Any) -> tuple[TokenLogprob, ...]:
    """The tokens of :func:`logprobs_json`'s form (parsed JSON).

    Raises:
        TypeError, ValueError or KeyError: ``value`` is not that form (``MalformedValue``, a
            TypeError and ValueError, for a field of the wrong type).
    """
    if not isinstance(value, list):
        raise TypeError(f"log-probabilities must be a list, not {type(value).__name__}")
    out = []
    for d in value:
        top = d.get("top_logprobs") if isinstance(d, dict) else None
        if not isinstance(top, list):
            raise TypeError("each token needs a top_logprobs list")
        out.append(_token(d, [_token(a) for a in top]))
    return tuple(out)
