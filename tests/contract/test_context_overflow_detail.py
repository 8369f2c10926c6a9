"""Rule B's stop says why: a ``context_overflow`` run's ``stop_detail`` names the prompt's size
and the limit it went over, on the first step and after some."""

from __future__ import annotations

import re

from polyloop import Limits, Loop, ModelReply, StopReason
from polyloop.journal import MemoryJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest
from tests.conftest import call


def _detail_numbers(detail: str | None) -> tuple[int, int]:
    assert detail is not None
    m = re.fullmatch(r"the prompt is (\d+) chars, over max_prompt_chars=(\d+)", detail)
    assert m, detail
    return int(m.group(1)), int(m.group(2))


async def test_a_first_prompt_too_big_names_its_size_and_the_limit() -> None:
    model = FunctionModel(lambda r: ModelReply(text="never asked"))
    r = await Loop(model, journal=MemoryJournal()).run(
        "x" * 500, limits=Limits(max_steps=5, max_prompt_chars=100)
    )
    assert r.stop_reason == StopReason.context_overflow
    size, limit = _detail_numbers(r.stop_detail)
    assert limit == 100 and size > 100


async def test_a_prompt_that_grew_too_big_names_the_size_the_next_step_would_send() -> None:
    def reply(r: ModelRequest) -> ModelReply:
        return call("no_such_tool", {"pad": "y" * 300})

    first = await Loop(FunctionModel(reply), journal=MemoryJournal()).run(
        "go", limits=Limits(max_steps=1)
    )
    limit = first.steps[0].prompt_chars + 100
    journal = MemoryJournal()
    r = await Loop(FunctionModel(reply), journal=journal).run(
        "go", limits=Limits(max_steps=5, max_prompt_chars=limit)
    )
    assert r.stop_reason == StopReason.context_overflow, r
    assert r.steps_used == 1
    size, said = _detail_numbers(r.stop_detail)
    assert said == limit and size > limit
    row = (await journal.list_runs(run_id=r.run_id))[0]
    assert row["stop_detail"] == r.stop_detail
