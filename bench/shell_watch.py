"""What the ``shell`` tool's watch of the workspace costs per command, by number of test
files. Standalone; not run in CI.

    python -m bench.shell_watch                    # 100, 1,000, 10,000 test files
    python -m bench.shell_watch --tests 100,1000 --reps 9

Each workspace holds N test files (``tests/pkg_<i>/test_<j>.py``, 1.5 KB each, 50 per
folder) and as many other files (``src/``), and, for the second column, ``writable_paths``
set to ``["src/a*"]`` so that almost every other file is watched too. Measured, median of
``--reps``, on a warm page cache, wall ms with CPU ms in parentheses:

- ``first``: the first command's ``snapshot`` (every test file is read once);
- ``per command``: ``snapshot`` + ``changes`` around a command that changed nothing (the
  steady state: two stat walks, no file read);
- ``shell true``: the whole ``shell`` tool call of ``true`` with the watch (it includes
  starting bash and the supervisor), next to the same call with ``test_paths=[]`` (no watch).

Prints a Markdown table and writes it to ``bench/results/shell_watch.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from polyloop.tools import ToolEnvironment
from polyloop.tools.builtin import workspace_tools
from polyloop.tools.builtin._paths import Workspace
from polyloop.tools.builtin._test_edits import DEFAULT_TEST_PATHS, TestPaths
from polyloop.tools.builtin._texts import DEFAULT_BUILTIN_TEXTS
from polyloop.tools.builtin._watch import ShellWatch
from polyloop.types import Action, ToolContext

_BODY = "def test_x():\n    assert 1 == 1\n" * 50
_PER_DIR = 50


def _workspace(root: Path, n: int) -> None:
    for i in range(n):
        for top, name in (("tests", f"test_{i}.py"), ("src", f"m_{i}.py")):
            folder = root / top / f"pkg_{i // _PER_DIR}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(_BODY)


def _median_ms(fn: Callable[[], Any], reps: int) -> str:
    """Median wall ms (CPU ms): on a shared machine the wall time grows with the load."""
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return f"{statistics.median(wall):.1f} ({statistics.median(cpu):.1f})"


def _watch(root: Path, writable: list[str] | None) -> ShellWatch:
    ws = Workspace(root, writable, DEFAULT_BUILTIN_TEXTS)
    return ShellWatch(ws, TestPaths(DEFAULT_TEST_PATHS))


async def _shell_ms(root: Path, reps: int, **kw: Any) -> float:
    env = ToolEnvironment(workspace_tools(root, **kw))
    ctx = ToolContext("bench", 0, "op")
    action = Action("true", "shell", {"command": "true"})
    await env.execute(action, ctx)  # the first command reads the test files
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await env.execute(action, ctx)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="100,1000,10000")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    rows = [
        "| test files (+ as many others) | first snapshot ms | per command ms "
        "| per command ms, writable_paths | shell `true` ms (watch) | shell `true` ms "
        "(no watch) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in (int(x) for x in args.tests.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            _workspace(root, n)
            first = _median_ms(lambda r=root: _watch(r, None).snapshot(), args.reps)
            steady = _watch(root, None)
            steady.snapshot()
            per = _median_ms(lambda w=steady: w.changes(w.snapshot()), args.reps)
            outside = _watch(root, ["src/a*"])
            outside.snapshot()
            per_out = _median_ms(lambda w=outside: w.changes(w.snapshot()), args.reps)
            with_watch = asyncio.run(_shell_ms(root, args.reps))
            without = asyncio.run(_shell_ms(root, args.reps, test_paths=[]))
        rows.append(f"| {n:,} | {first} | {per} | {per_out} | {with_watch:.1f} | {without:.1f} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows) + "\n"
    print(table)
    out = Path(__file__).parent / "results" / "shell_watch.md"
    out.write_text(
        "# The shell tool's watch of the workspace, per command\n\n"
        f"`python -m bench.shell_watch --tests {args.tests} --reps {args.reps}`, median wall "
        f"ms (CPU ms), on {os.cpu_count()} cores at load average "
        f"{os.getloadavg()[0]:.1f} (a shared machine: the CPU time is the cost).\n\n" + table
    )


if __name__ == "__main__":
    main()
