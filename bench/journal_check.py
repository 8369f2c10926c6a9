"""What checking a SQLite journal file costs, by its size. Standalone; not run in CI.

    python -m bench.journal_check                      # 1 MB, 10 MB, 100 MB, 1 GB
    python -m bench.journal_check --sizes 1,10 --reps 5

Each journal starts as 20 runs of three tool steps written through the real ``Loop`` (the
records, steps and model calls a run writes), then grows by copying its runs under new run
ids (``INSERT … SELECT`` on every table, doubling) until it holds at least the size asked for;
the files are kept in ``--dir`` and reused. Measured per file, on a warm page cache (one
untimed pass first), the median of ``--reps`` (one pass from 500 MB):

- ``quick_check``: ``PRAGMA quick_check`` on a read-only connection, what the writing commands
  of ``polyloop`` run before they open a file of at most ``QUICK_CHECK_MAX_BYTES``
  (``polyloop.cli._precheck``);
- ``integrity_check``: ``PRAGMA integrity_check``, the first half of ``polyloop check``;
- ``check``: all of ``check_integrity`` (``polyloop check``): the integrity check, then every
  run's row, records and steps decoded as ``show`` and ``resume`` decode them.

CPU time is printed next to wall time: on a shared machine the wall time grows with the load,
the CPU time much less. Prints a Markdown table and writes it to ``bench/results/journal_check.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from polyloop import Loop, ModelReply, ModelRequest, ToolCall
from polyloop.journal import SQLiteJournal
from polyloop.journal.sqlite import check_integrity
from polyloop.testing import FunctionModel
from polyloop.tools import ToolRegistry

_TABLES = ("runs", "journal", "steps", "model_calls")


def _tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool
    def noop() -> str:
        """Do nothing."""
        return "ok " * 40

    return registry


async def _seed(path: Path) -> None:
    def fn(req: ModelRequest) -> ModelReply:
        if req.step_idx < 3:
            return ModelReply(tool_calls=(ToolCall("noop", {}, None),))
        return ModelReply(f"done {req.run_id} " * 20)

    async with SQLiteJournal(path) as journal:
        loop = Loop(FunctionModel(fn), tools=_tools(), journal=journal)
        await asyncio.gather(*(loop.run("a goal " * 20, run_id=f"r{i:02}") for i in range(20)))


def _grow(path: Path, size: int) -> None:
    """Copy every run under new ids until the file holds at least ``size`` bytes."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        generation = 0
        while path.stat().st_size < size:
            generation += 1
            conn.execute("BEGIN")
            for table in _TABLES:
                cols = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
                chosen = ", ".join(
                    f"{c} || '-g{generation}'" if c in ("run_id", "intent_id") else c for c in cols
                )
                conn.execute(
                    f"INSERT INTO {table} ({', '.join(cols)}) SELECT {chosen} FROM {table}"
                )
            conn.execute("COMMIT")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def journal_of(folder: Path, mb: int) -> Path:
    path = folder / f"journal-{mb}mb.db"
    if not path.exists():
        partial = path.with_suffix(".partial")
        for leftover in folder.glob(f"{partial.name}*"):
            leftover.unlink()
        asyncio.run(_seed(partial))
        _grow(partial, mb * 1_000_000)
        partial.rename(path)
    return path


def _pragma(path: Path, pragma: str) -> Callable[[], None]:
    def run() -> None:
        with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
            assert conn.execute(f"PRAGMA {pragma}").fetchall() == [("ok",)]

    return run


def _whole_check(path: Path) -> Callable[[], None]:
    def run() -> None:
        assert check_integrity(path).sound

    return run


def _median_ms(fn: Callable[[], None], reps: int) -> tuple[float, float]:
    """The median wall time and the median CPU time of this process, in ms."""
    fn()  # warm the page cache
    wall, cpu = [], []
    for _ in range(reps):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - start_cpu) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,100,1000", help="MB, comma-separated")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/polyloop-journal-check"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = [
        "| file | runs | quick_check: wall (CPU) ms | integrity_check | polyloop check |",
        "|---:|---:|---:|---:|---:|",
    ]
    for mb in (int(s) for s in args.sizes.split(",")):
        path = journal_of(args.dir, mb)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            runs = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        reps = args.reps if mb < 500 else 1  # a GB takes a minute per check on 2 CPUs
        quick = _median_ms(_pragma(path, "quick_check"), reps)
        full = _median_ms(_pragma(path, "integrity_check"), reps)
        whole = _median_ms(_whole_check(path), reps)
        size = path.stat().st_size / 1e6
        cells = " | ".join(f"{w:,.0f} ({c:,.0f})" for w, c in (quick, full, whole))
        rows.append(f"| {size:,.1f} MB | {runs:,} | {cells} |")
        print(rows[-1], flush=True)
    load = os.getloadavg()[0]
    table = "\n".join(rows)
    note = (
        f"Median of {args.reps} (1 from 500 MB) after a warm-up pass, page cache warm; "
        f"{os.cpu_count()} CPUs, load average "
        f"{load:.1f} at the end (a shared machine).\n"
    )
    print(note)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "journal_check.md").write_text(f"{table}\n\n{note}", encoding="utf-8")


if __name__ == "__main__":
    main()
