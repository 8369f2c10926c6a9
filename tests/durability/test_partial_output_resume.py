"""A step that showed partial output stays with its model after a resume, on every journal: the
mark (``model_attempt_failed.partial_shown``) is read back from the store."""

from __future__ import annotations

import pytest

from polyloop import FallbackModel, Loop, ModelCallError, ModelReply, RetryPolicy, StopReason
from polyloop.testing import FakeClock, ScriptedModel
from polyloop.types import ModelAttemptFailed, ModelRequest
from tests.conftest import Crash
from tests.durability.conftest import OpenJournal

CUT = ModelCallError("stream cut off", retryable=True, kind="connection")


class StreamsThenDies:
    """Attempt 1 streams "Par" and is cut off; attempt 2 dies with the process."""

    name = "s:streams"

    async def complete(self, request: ModelRequest) -> ModelReply:
        if request.attempt == 1:
            if request.on_delta is not None:
                request.on_delta("text", "Par")
            raise CUT
        raise Crash("the process dies during attempt 2")


async def test_a_resumed_step_that_showed_partial_output_does_not_fall_back(
    every_journal: OpenJournal,
) -> None:
    retry = RetryPolicy(max_attempts=2)
    async with every_journal() as journal:
        loop = Loop(
            FallbackModel(StreamsThenDies(), ScriptedModel([], name="b")),
            journal=journal,
            retry=retry,
            clock=FakeClock(),
            observers=[lambda event: None],
        )
        with pytest.raises(Crash):
            await loop.run("go", run_id="p")
        _, records = await journal.read("p")
    failed = [x for x in records if isinstance(x, ModelAttemptFailed)]
    assert [(x.attempt, x.partial_shown) for x in failed] == [(1, True)]
    primary = ScriptedModel([CUT], name="s:streams")
    backup = ScriptedModel(["Rome."], name="b")
    async with every_journal() as journal:
        r = await Loop(
            FallbackModel(primary, backup), journal=journal, retry=retry, clock=FakeClock()
        ).resume("p")
    # Attempt 2 was lost in the crash (not a failure): attempt 3 asks the primary, whose
    # failure ends the step; the backup is never asked, the answer in view stays the primary's.
    assert r.stop_reason == StopReason.llm_error and len(primary.requests) == 1
    assert backup.requests == []
