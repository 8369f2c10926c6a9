"""Text that is not valid Unicode never crashes a journal write (on every journal: memory,
SQLite, PostgreSQL). Wherever outside text enters a run — the model's reply, the decision the
interpreter decodes from it, a tool's output, a file name, an error message, guard feedback —
each lone surrogate becomes U+FFFD, the step counts it in ``replaced_chars``, and the run ends
as it would have; resume rebuilds the same steps and context. The caller's own goal, history
and metadata are refused instead (PolyLoop does not alter them silently)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from polyloop import (
    ActionStatus,
    ConfigError,
    EnvironmentFailure,
    Limits,
    Loop,
    ModelCallError,
    ModelReply,
    RunEndGuard,
    Steer,
    StepRecord,
    StopReason,
    ToolCall,
    ToolRegistry,
)
from polyloop.testing import FakeClock, FunctionModel
from polyloop.tools.builtin import workspace_tools
from polyloop.types import (
    Complete,
    GuardContext,
    ModelAttemptFailed,
    ModelFailure,
    ModelRequest,
    canonical_json,
)
from tests.conftest import Crash, call
from tests.contract.test_resume import comparable
from tests.durability.conftest import OpenJournal
from tests.durability.journals import recording, records_of

BAD = "\ud800"  # a lone surrogate, as json.loads makes it of the escape "\ud800"


def encodable(step: StepRecord) -> bool:
    """Every text of the step can be written (UTF-8), as a journal writes it."""
    step.to_json().encode("utf-8")
    return True


async def runs_in(journal: Any) -> int:
    """How many runs the journal holds."""
    if hasattr(journal, "list_runs"):
        return len(await journal.list_runs())
    return len(journal.run_ids())


async def stored_steps(journal: Any, run_id: str) -> list[StepRecord] | None:
    """The durable journals' ``steps`` table, read back (the memory journal has none)."""
    steps = getattr(journal, "steps", None)
    return None if steps is None else list(await steps(run_id))


# -- a reply, the decision decoded from it, a tool's output ----------------------------------

# Tool arguments as the model sent them: a JSON string whose "\ud800" escape is ASCII (it
# becomes a lone surrogate only when the interpreter decodes it), or a mapping holding one.
# Expected replaced_chars of the tool step: the reply's text, reasoning, call id and tool call
# id (4), then for the string the decoded argument and the action text built from it (2), for
# the mapping the argument itself in the reply (1); and the tool's own output (1).
ARGUMENTS = {
    "json_escape": ('{"text": "\\ud800!"}', 4 + 2 + 1),
    "mapping": ({"text": f"{BAD}!"}, 5 + 1),
}


def bad_replies(arguments: str | dict[str, Any]) -> FunctionModel:
    def reply(request: ModelRequest) -> ModelReply:
        if request.step_idx == 0:
            return ModelReply(
                text=f"look {BAD}",
                reasoning="think \udfff",
                tool_calls=(ToolCall("echo", arguments, "call_\udc00"),),
                call_id="chatcmpl-\udbff",
            )
        return ModelReply("done \udfff")

    return FunctionModel(reply)


def echo_tools() -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def echo(text: str) -> str:
        """Echo the text, and a lone surrogate of its own."""
        return f"echo {text} \udcff"

    return tools


def bad_loop(journal: Any, arguments: str | dict[str, Any]) -> Loop:
    return Loop(bad_replies(arguments), tools=echo_tools(), journal=journal, clock=FakeClock())


@pytest.mark.parametrize("form", list(ARGUMENTS))
async def test_a_reply_and_a_tool_output_with_lone_surrogates_are_replaced_and_counted(
    form: str, every_journal: OpenJournal
) -> None:
    arguments, in_tool_step = ARGUMENTS[form]
    async with every_journal() as journal:
        model = bad_replies(arguments)
        r = await Loop(model, tools=echo_tools(), journal=journal, clock=FakeClock()).run(
            "echo it", run_id="r"
        )
        assert await stored_steps(journal, "r") in (None, list(r.steps))
    assert r.stop_reason == StopReason.agent_finished
    assert r.final_answer == "done \ufffd"
    tool, final = r.steps
    assert all(encodable(s) for s in r.steps)
    assert tool.action_status == ActionStatus.executed and tool.tool_name == "echo"
    assert tool.tool_args_json == canonical_json({"text": "\ufffd!"})
    assert tool.action == 'echo({"text":"\ufffd!"})'
    assert tool.observation == "echo \ufffd! \ufffd"
    assert tool.llm_call_id == "chatcmpl-\ufffd"
    assert tool.raw_response.startswith("look \ufffd\n")
    assert json.loads(tool.raw_response.partition("\n")[2])[0]["id"] == "call_\ufffd"
    assert (tool.response_chars, tool.reasoning_chars) == (6, 7)  # lengths are unchanged
    assert (tool.replaced_chars, final.replaced_chars) == (in_tool_step, 1)
    # What the model was sent next is valid Unicode too.
    json.dumps(list(model.requests[1].messages), ensure_ascii=False).encode("utf-8")
    async with every_journal() as journal:  # ended: rebuilt from the journal as it ended
        again = await bad_loop(journal, arguments).resume("r")
    assert again.steps == r.steps and again.messages == r.messages


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
async def test_a_crash_around_any_write_resumes_to_the_same_steps_and_context(
    after: bool, every_journal: OpenJournal
) -> None:
    arguments, _ = ARGUMENTS["json_escape"]
    async with every_journal() as journal:
        counted = recording(journal)
        ref = await bad_loop(counted, arguments).run("echo it", run_id="ref")
    assert counted.count == 4  # the step written with the next step's model intent
    for n in range(1, counted.count + 1):
        run_id = f"r{n}"
        async with every_journal() as journal:
            with pytest.raises(Crash):
                await bad_loop(recording(journal, crash_at=n, crash_after=after), arguments).run(
                    "echo it", run_id=run_id
                )
        async with every_journal() as journal:  # a journal object that never saw the run
            r = await bad_loop(journal, arguments).resume(run_id)
        assert r.stop_reason == ref.stop_reason, n
        assert [comparable(s) for s in r.steps] == [comparable(s) for s in ref.steps], n
        assert [s.replaced_chars for s in r.steps] == [7, 1], n
        assert r.messages == ref.messages, n  # the context is rebuilt the same


# -- file names that are not UTF-8 -----------------------------------------------------------


def workspace_with_a_non_utf8_name(root: Path) -> Path:
    fd = os.open(os.path.join(os.fsencode(root), b"report_\xff.txt"), os.O_CREAT | os.O_WRONLY)
    try:
        os.write(fd, b"total: 42\n")
    finally:
        os.close(fd)
    (root / "notes.txt").write_text("see the report\n", encoding="utf-8")
    return root


async def test_list_files_and_grep_over_a_non_utf8_file_name_end_normally(
    every_journal: OpenJournal, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    root = workspace_with_a_non_utf8_name(tmp_path / "ws")
    script = [
        call("list_files", {}, "c0"),
        call("grep", {"pattern": "total"}, "c1"),
        ModelReply("the total is 42"),
    ]
    model = FunctionModel(lambda r: script[r.step_idx])
    async with every_journal() as journal:
        loop = Loop(model, tools=workspace_tools(root, shell=False), journal=journal)
        r = await loop.run("find the total", run_id="ws")
        assert await stored_steps(journal, "ws") in (None, list(r.steps))
        assert len(await records_of(journal, "ws")) > 0
    assert r.stop_reason == StopReason.agent_finished and r.steps_used == 3
    assert [s.action_status for s in r.steps[:2]] == [ActionStatus.executed] * 2
    assert all(encodable(s) for s in r.steps)


# -- error messages and guard feedback --------------------------------------------------------


async def test_model_error_messages_are_replaced_in_the_records_and_stop_detail(
    every_journal: OpenJournal,
) -> None:
    def fails(request: ModelRequest) -> ModelReply:
        if request.attempt == 1:
            raise ModelCallError(f"slow {BAD}", retryable=True, kind="rate\udfff")
        raise RuntimeError("gone \udcff")

    async with every_journal() as journal:
        loop = Loop(FunctionModel(fails), journal=journal, clock=FakeClock())
        r = await loop.run("g", run_id="m")
        records = await records_of(journal, "m")
    assert r.stop_reason == StopReason.llm_error
    assert r.stop_detail == "RuntimeError: gone \ufffd [kind=error, retryable=False, attempts=2]"
    errors = [x.error for x in records if isinstance(x, ModelAttemptFailed | ModelFailure)]
    assert [(e.message, e.kind) for e in errors] == [
        ("slow \ufffd", "rate\ufffd"),
        ("gone \ufffd", "error"),
    ]
    assert r.steps[0].replaced_chars == 3


async def test_environment_and_tool_errors_are_replaced_in_the_step_and_stop_detail(
    every_journal: OpenJournal,
) -> None:
    tools = ToolRegistry()

    @tools.tool
    def flaky() -> str:
        """Raises an ordinary error."""
        raise ValueError(f"bad {BAD} input")

    @tools.tool
    def broken() -> str:
        """The sandbox is gone."""
        raise EnvironmentFailure("sandbox \udcff gone")

    script = [call("flaky", {}, "c0"), call("broken", {}, "c1")]
    model = FunctionModel(lambda r: script[r.step_idx])
    async with every_journal() as journal:
        r = await Loop(model, tools=tools, journal=journal).run("g", run_id="e")
    assert r.stop_reason == StopReason.env_error
    assert r.stop_detail == "EnvironmentFailure: sandbox \ufffd gone"
    flaky_step, broken_step = r.steps
    assert flaky_step.observation is not None and "bad \ufffd input" in flaky_step.observation
    assert flaky_step.replaced_chars == 2  # the observation and the failure's message
    assert broken_step.replaced_chars == 2
    assert all(encodable(s) for s in r.steps)


async def test_a_failure_seen_twice_with_a_lone_surrogate_is_escalated(
    every_journal: OpenJournal,
) -> None:
    tools = ToolRegistry()

    @tools.tool
    def check() -> str:
        """Fails the same way every time."""
        raise AssertionError(f"expected {BAD}")

    model = FunctionModel(lambda r: call("check", {}, f"c{r.step_idx}"))
    async with every_journal() as journal:
        loop = Loop(model, tools=tools, journal=journal, limits=Limits(same_failure_limit=2))
        r = await loop.run("g", run_id="f")
    assert r.stop_reason == StopReason.repeated_failure and r.steps_used == 2
    assert r.report is not None and "expected \ufffd" in r.report.to_markdown()


async def test_guard_feedback_with_a_lone_surrogate_is_replaced_and_counted(
    every_journal: OpenJournal,
) -> None:
    def cite(ctx: GuardContext) -> Steer | Complete:
        return Steer(f"cite a source {BAD}") if ctx.steers == 0 else Complete()

    model = FunctionModel(lambda r: ModelReply(f"answer {r.step_idx}"))
    async with every_journal() as journal:
        loop = Loop(model, journal=journal, guards=[RunEndGuard(cite)])
        r = await loop.run("g", run_id="s")
    assert r.stop_reason == StopReason.agent_finished and r.steps_used == 2
    assert r.steps[0].observation == "cite a source \ufffd"
    assert [s.replaced_chars for s in r.steps] == [1, 0]


# -- the caller's own input -------------------------------------------------------------------

CALLER_INPUT = {
    "goal": ({"goal": f"do {BAD}"}, "goal (code point U+D800 at index 3)"),
    "history": (
        {"history": [{"role": "user", "content": "a\udcffb"}]},
        "history[0]['content'] (code point U+DCFF at index 1)",
    ),
    "metadata": ({"metadata": {"who": ["x", f"{BAD}"]}}, "metadata['who'][1]"),
    "run_id": ({"run_id": f"r{BAD}"}, "run_id (code point U+D800 at index 1)"),
}


@pytest.mark.parametrize("name", list(CALLER_INPUT))
async def test_the_callers_own_text_that_is_not_valid_unicode_is_refused_unwritten(
    name: str, every_journal: OpenJournal
) -> None:
    kwargs, where = CALLER_INPUT[name]
    kwargs = {"goal": "g", **kwargs}
    model = FunctionModel(lambda r: ModelReply("never"))
    async with every_journal() as journal:
        with pytest.raises(ConfigError) as info:
            await Loop(model, journal=journal).run(**kwargs)
        assert await runs_in(journal) == 0
    message = str(info.value)
    assert where in message and "not valid Unicode" in message and "\n" not in message
    assert model.requests == []
