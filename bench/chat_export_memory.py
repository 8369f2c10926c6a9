"""Peak memory of ``polyloop export --format chat`` as the runs grow. Standalone; not run in CI.

    python -m bench.chat_export_memory                  # 1,000 and 10,000 runs
    python -m bench.chat_export_memory --runs 1000

Per size, a SQLite journal of that many runs made through the real ``Loop`` (three steps each:
two tool calls with a 2,000-character observation, then an answer), then ``polyloop export``
in a child process, its output to a file: ``--format chat`` (one record per run, written as the
run is read), ``chat-parquet`` (row groups of 64 runs) and ``jsonl`` (the step export, one line
per step, written as its run is read); every format lists the runs 500 at a time. Measured:
the child's peak resident set (``ru_maxrss`` from ``wait4``) and the output's size. The
journal is filled in a child process of its own: a child forked from a parent grown by the
filling would report the parent's size. Prints a Markdown table and writes it to
``bench/results/chat_export_memory.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from polyloop import Loop, ModelReply, ToolCall, ToolRegistry
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from polyloop.types import ModelRequest

RESULTS = Path(__file__).parent / "results" / "chat_export_memory.md"
CONCURRENT = 200


def tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(replay="idempotent")
    def read(part: int) -> str:
        """Read a part."""
        return f"part {part} " + "x" * 2_000

    return registry


def script(request: ModelRequest) -> ModelReply:
    if request.step_idx < 2:
        return ModelReply(tool_calls=(ToolCall("read", {"part": request.step_idx}),))
    return ModelReply("read both parts")


async def fill(path: Path, runs: int) -> None:
    async with SQLiteJournal(path) as journal:
        loop = Loop(FunctionModel(script), tools=tools(), journal=journal)
        for start in range(0, runs, CONCURRENT):
            batch = range(start, min(start + CONCURRENT, runs))
            await asyncio.gather(*(loop.run(f"goal {i}", run_id=f"r{i:06d}") for i in batch))


def peak_rss_mb(args: list[str]) -> float:
    """The child's peak resident set in MB (Linux reports ``ru_maxrss`` in KiB)."""
    proc = subprocess.Popen([sys.executable, "-m", "polyloop.cli", *args])
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"polyloop {' '.join(args)} exited {proc.returncode}")
    return usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--fill", type=Path, help=argparse.SUPPRESS)  # the filling child
    opts = parser.parse_args()
    if opts.fill is not None:
        asyncio.run(fill(opts.fill, opts.runs[0]))
        return
    lines = [
        "| runs | format | peak RSS (MB) | output (MB) |",
        "|---:|---|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for runs in opts.runs:
            path = Path(tmp) / f"j{runs}.db"
            filler = [sys.executable, "-m", "bench.chat_export_memory", "--fill", str(path)]
            subprocess.run([*filler, "--runs", str(runs)], check=True)
            for fmt in ("chat", "chat-parquet", "jsonl"):
                out = Path(tmp) / f"out-{runs}.{fmt}"
                rss = peak_rss_mb(
                    ["export", "--journal", str(path), "--format", fmt, "-o", str(out)]
                )
                size = out.stat().st_size / 1e6
                lines.append(f"| {runs:,} | {fmt} | {rss:.1f} | {size:.1f} |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
