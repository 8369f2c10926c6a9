"""The chat export (``polyloop.observe.chat_export.chat_records``) round-trips: for runs made
through ``Loop.run`` on each journal, every record's ``messages`` equal the conversation the
run's ``RunResult.messages`` held, and its ``turns`` point at the assistant messages.

The runs: native tool calls with a parse failure; the JSON-text and code-block interpreters;
an approval that parked the run and was denied; a wrap-up after the step budget; observations
large enough to be stored once; a run that crashed mid-way and was resumed; and a run with a
budget hint and a history (the phase pattern)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from polyloop import ApprovalRequired, Limits, Loop, RunResult
from polyloop.context import ChatContextBuilder
from polyloop.interpreters import CodeBlockInterpreter, JsonTextInterpreter
from polyloop.observe.chat_export import REDACTED, RUN_FIELDS, TURN_FIELDS, chat_records
from polyloop.testing import FakeClock, FunctionModel, ScriptedModel
from polyloop.types import ModelReply, ModelRequest
from tests.conftest import Crash, call, make_tools
from tests.contract.test_approval import Mailer, mail_then_answer
from tests.durability import large_observation as large
from tests.durability.conftest import OpenJournal


async def exported(journal: Any, **kw: Any) -> dict[str, dict[str, Any]]:
    records: AsyncIterator[dict[str, Any]] = chat_records(journal, **kw)
    return {r["run_id"]: r async for r in records}


class CrashOnce:
    """A model that answers with ``count`` calls, dying (``Crash``) once at step 2."""

    def __init__(self) -> None:
        self.crashed = False

    def __call__(self, request: ModelRequest) -> ModelReply:
        if request.step_idx == 2 and not self.crashed:
            self.crashed = True
            raise Crash("the process dies mid-call")
        if request.step_idx < 3:
            return call("count", {"n": request.step_idx})
        return ModelReply("counted to 2")


async def make_runs(open_journal: OpenJournal) -> dict[str, RunResult]:
    results: dict[str, RunResult] = {}
    clock = FakeClock()
    async with open_journal() as journal:

        async def run(run_id: str, replies: list[Any], history: Any = (), **kw: Any) -> None:
            model = ScriptedModel(replies)
            loop = Loop(model, tools=make_tools(), journal=journal, clock=clock, **kw)
            results[run_id] = await loop.run(run_id, run_id=run_id, history=history)

        await run("native", [call("noop"), call("nosuchtool"), call("count", {"n": 3}), "ok"])
        as_json = ['{"tool": "noop", "arguments": {}}', "not json {'x", "done"]
        await run("json", as_json, interpreter=JsonTextInterpreter())
        await run("code", ["no code here", "FINAL ANSWER: 42"], interpreter=CodeBlockInterpreter())

        world = Mailer()
        mailer = Loop(
            FunctionModel(mail_then_answer), tools=world.tools, journal=journal, clock=clock
        )
        with pytest.raises(ApprovalRequired) as parked:
            await mailer.run("mail the CEO", run_id="denied")
        await mailer.deny("denied", parked.value.op_id, reason="not to the CEO", by="bob")
        results["denied"] = await mailer.resume("denied")

        wrap = [call("noop"), call("noop"), "The answer is 42."]
        await run("wrap", wrap, wrap_up=True, limits=Limits(max_steps=2))

        results["large"] = await large.large_loop(journal).run("large", run_id="large")

        await run(
            "hinted",
            [call("count", {"n": 1}), call("big", {"n": 9000}), "fine"],
            history=(
                {"role": "user", "content": "earlier"},
                {"role": "assistant", "content": "ok"},
            ),
            context=ChatContextBuilder(budget_hint=True),
            limits=Limits(max_steps=9, max_observation_chars=500),
        )

        crashing = CrashOnce()
        with pytest.raises(Crash):
            await Loop(FunctionModel(crashing), tools=make_tools(), journal=journal).run(
                "count to 2", run_id="resumed"
            )
    async with open_journal() as journal:
        loop = Loop(FunctionModel(crashing), tools=make_tools(), journal=journal)
        results["resumed"] = await loop.resume("resumed")
    return results


async def test_exported_messages_are_the_runs_conversations(every_journal: OpenJournal) -> None:
    results = await make_runs(every_journal)
    async with every_journal() as journal:
        plain = await exported(journal)
        hinted = await exported(journal, context=ChatContextBuilder(budget_hint=True))
    assert sorted(plain) == sorted(results)  # one record per run
    for run_id, result in results.items():
        record = hinted[run_id] if run_id == "hinted" else plain[run_id]
        assert record["messages"] == list(result.messages), run_id
        assert list(record)[: len(RUN_FIELDS)] == list(RUN_FIELDS)
        assert record["stop_reason"] == result.stop_reason
        assert record["steps_used"] == result.steps_used
        assert record["tokens_used"] == result.totals.tokens
        turns = record["turns"]
        assistants = [i for i, m in enumerate(record["messages"]) if m["role"] == "assistant"]
        if run_id == "hinted":
            assistants = assistants[1:]  # the history's assistant message is no turn
        assert [t["message_index"] for t in turns] == assistants, run_id
        for t in turns:
            assert list(t) == list(TURN_FIELDS)
            assert t["logprobs"] is None
    # The cases each run is there for.
    assert "nosuchtool" in str(plain["native"]["messages"])
    assert any(s.parse_error for s in results["json"].steps)
    assert any(s.parse_error for s in results["code"].steps)
    assert "not to the CEO" in str(plain["denied"]["messages"])
    assert [t["wrap_up"] for t in plain["wrap"]["turns"]] == [False, False, True]
    assert max(len(str(m["content"])) for m in plain["large"]["messages"]) >= large.SIZE
    assert "of 9" in str(hinted["hinted"]["messages"])
    assert "of 9" not in str(plain["hinted"]["messages"])  # the builder decides
    assert results["resumed"].final_answer == "counted to 2"


async def test_redacted_records_hold_no_content(every_journal: OpenJournal) -> None:
    results = await make_runs(every_journal)
    async with every_journal() as journal:
        redacted = await exported(journal, redact=True)
    text = str(redacted)
    for secret in ("ceo@example.com", "not to the CEO", "The answer is 42.", "count to 2"):
        assert secret not in text
    calls = [c for m in redacted["denied"]["messages"] for c in m.get("tool_calls", ())]
    assert [c["function"]["name"] for c in calls] == ["send_email"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"to": REDACTED, "body": REDACTED}
    assert len(redacted["native"]["messages"]) == len(results["native"].messages)


async def test_a_turn_carries_the_answering_attempts_logprobs() -> None:
    from polyloop.journal import MemoryJournal
    from polyloop.types import TokenLogprob

    said = (TokenLogprob("ok", -0.5, 7, (TokenLogprob("ok", -0.5, 7), TokenLogprob("no", -2.0))),)
    journal = MemoryJournal()
    model = ScriptedModel([ModelReply("ok", logprobs=said)])
    result = await Loop(model, journal=journal, clock=FakeClock()).run("go", run_id="lp")
    (turn,) = (await exported(journal))["lp"]["turns"]
    assert result.logprobs[0].tokens == said
    assert turn["logprobs"] == [
        {
            "token": "ok",
            "logprob": -0.5,
            "token_id": 7,
            "top_logprobs": [
                {"token": "ok", "logprob": -0.5, "token_id": 7},
                {"token": "no", "logprob": -2.0, "token_id": None},
            ],
        }
    ]
