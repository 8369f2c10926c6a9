"""What the stdio transport holds of a server's line: a line longer than ``max_line_bytes`` is
dropped as it arrives (only its ends kept) and fails its call at once as executed."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from polyloop import ActionStatus, ConfigError, StopReason
from polyloop.journal import MemoryJournal
from polyloop.tools.mcp import MCPServer
from polyloop.tools.mcp._lines import KEPT_BYTES, LineSplitter, TooLong
from tests.conftest import call

from .conftest import faulty_argv, read_log
from .test_mcp_output import big_server
from .test_mcp_servers import outcomes, run
from .test_mcp_transport import raw_answers

_MAX_LINE = 1 << 20


def _assert_malformed_executed(result: Any, why: str) -> None:
    step = result.steps[0]
    assert step.action_status == ActionStatus.executed  # the server ran it: it may have acted
    assert "malformed" in step.observation and why in step.observation, step.observation
    assert "did not answer" not in step.observation
    assert result.stop_reason == StopReason.task_completed


async def test_a_line_over_max_line_bytes_fails_its_call_at_once_holding_little(
    faulty_log: Path,
) -> None:
    journal = MemoryJournal()
    async with big_server(faulty_log, max_line_bytes=_MAX_LINE, timeout_s=60) as (_, tools):
        tracemalloc.start()
        try:
            result = await run(tools, call("big", {"chars": 10_000_000}), journal=journal)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    _assert_malformed_executed(result, f"longer than {_MAX_LINE} bytes")
    failure = (await outcomes(journal, result.run_id))[0].failure
    assert failure is not None and failure.error_type == "MCPError"
    # a 20 MB line (the text and its structuredContent copy), never held whole
    assert peak < 8 * _MAX_LINE, peak


async def test_a_long_line_with_its_id_last_fails_its_call_too(faulty_log: Path) -> None:
    async with raw_answers(faulty_log, max_line_bytes=_MAX_LINE) as tools:
        result = await run(tools, call("answer_raw", {"kind": "long_id_last"}))
    _assert_malformed_executed(result, f"longer than {_MAX_LINE} bytes")
    assert [e["kind"] for e in read_log(faulty_log)] == ["long_id_last"]


async def test_lines_within_max_line_bytes_still_arrive_whole(faulty_log: Path) -> None:
    options: dict[str, Any] = {"max_line_bytes": _MAX_LINE, "max_output_chars": None}
    async with big_server(faulty_log, **options) as (_, tools):
        result = await run(tools, call("big", {"chars": 400_000}), call("lookup", {"key": "k"}))
    assert len(result.steps[0].observation) == 400_000
    assert result.steps[1].observation == "value of k"
    assert result.stop_reason == StopReason.task_completed


@pytest.mark.parametrize("bad", [0, 65_535, True, 1_048_576.0, float("nan"), "1000000", -1])
def test_max_line_bytes_must_be_an_int_of_at_least_64_kib(bad: Any) -> None:
    with pytest.raises(ConfigError, match="max_line_bytes must be an int >= 65536"):
        MCPServer.stdio(faulty_argv(), max_line_bytes=bad)


def test_the_splitter_gives_lines_whole_up_to_the_limit_and_only_the_ends_of_longer_ones() -> None:
    limit = 100_000
    short, fits = b"s" * 10, b"f" * limit
    long = b"<" * KEPT_BYTES + b"x" * 300_000 + b">" * KEPT_BYTES
    data = b"\n".join([short, fits, long, short, b""]) + b"\n"
    for size in (1, 7, 65_536, len(data)):  # how the pipe happens to cut it
        splitter = LineSplitter(limit)
        lines = [
            line
            for start in range(0, len(data), size)
            for line in splitter.feed(data[start : start + size])
        ]
        assert lines[:2] == [short, fits] and lines[3:] == [short, b""]
        assert lines[2] == TooLong(b"<" * KEPT_BYTES, b">" * KEPT_BYTES, len(long))
