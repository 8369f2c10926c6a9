"""Log-probabilities from the real model: a run of ``OpenAIModel(logprobs=True, top_logprobs=3)``
against llama-cpp-python's server records, for every attempt the journal holds as answered,
the sampled tokens the server sent with their log-probabilities and top alternatives (sent
whole: exactly those of the wire; streamed: the chunks' put together, one per token of the
reply's text)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from polyloop import Limits, Loop
from polyloop.context import ChatContextBuilder
from polyloop.interpreters import JsonTextInterpreter
from polyloop.journal import SQLiteJournal
from polyloop.models.openai import OpenAIModel
from polyloop.testing.real_model import MODEL_ALIAS, LlamaServer

from .support import Wire, model_calls

pytestmark = pytest.mark.real_model


@pytest.mark.parametrize("stream", [False, True])
async def test_every_attempt_of_a_real_run_records_its_logprobs(
    text_server: LlamaServer, tmp_path: Path, stream: bool
) -> None:
    db = tmp_path / "journal.db"
    wire = Wire(text_server.base_url)  # it reads bodies whole: not for a stream
    options = {"max_tokens": 8, "temperature": 0.0, "logprobs": True, "top_logprobs": 3}
    if stream:
        model = OpenAIModel(MODEL_ALIAS, base_url=text_server.base_url, stream=True, **options)
    else:
        model = OpenAIModel(MODEL_ALIAS, client=wire.client, **options)
    interpreter = JsonTextInterpreter()
    goal = "Answer with a JSON final answer: what is 2 plus 3? " + interpreter.instructions
    try:
        async with SQLiteJournal(db) as journal:
            loop = Loop(
                model,
                interpreter=interpreter,
                context=ChatContextBuilder(system_prompt=""),
                journal=journal,
                limits=Limits(max_steps=3, max_consecutive_invalid=3),
            )
            result = await loop.run(goal, run_id="lp")
    finally:
        await model.aclose()
        await wire.aclose()

    answered = [(c["step_idx"], c["attempt"]) for c in model_calls(db, "lp") if c["state"] == "ok"]
    assert answered, "the run made no model call"
    assert [(a.step_idx, a.attempt) for a in result.logprobs] == answered
    for attempt in result.logprobs:
        assert attempt.tokens, f"step {attempt.step_idx}: the server sent no token"
        assert len(attempt.tokens) <= 8  # max_tokens
        for token in attempt.tokens:
            assert math.isfinite(token.logprob) and token.logprob <= 1e-6
            assert 1 <= len(token.top) <= 4  # the top 3, and the sampled token when not in them
            assert all(alt.logprob <= 1e-6 and alt.top == () for alt in token.top)
    for step, attempt in zip(result.steps, result.logprobs, strict=True):
        assert "".join(t.token for t in attempt.tokens) == step.raw_response
    if not stream:
        for exchange, attempt in zip(wire.exchanges, result.logprobs, strict=True):
            assert exchange.sent["logprobs"] is True and exchange.sent["top_logprobs"] == 3
            content = exchange.received["choices"][0]["logprobs"]["content"]
            assert [(t.token, t.logprob) for t in attempt.tokens] == [
                (e["token"], e["logprob"]) for e in content
            ]
            assert [[(a.token, a.logprob) for a in t.top] for t in attempt.tokens] == [
                [(a["token"], a["logprob"]) for a in e["top_logprobs"]] for e in content
            ]
            assert all(t.token_id is None for t in attempt.tokens)  # this server sends none
