"""Where a large observation is stored, and how many bytes it takes. Standalone; not run in CI.

    python -m bench.observation_once                 # 1 MB and 20 MB, SQLite and PostgreSQL
    python -m bench.observation_once --sizes 1 --no-postgres

One run through the real ``Loop``: a tool answers with ``--sizes`` MB of random base64 text
(incompressible, so PostgreSQL's TOAST compression does not hide the copies), then an unknown
tool call ends it at its step budget. Measured after the run, per journal: the characters of
the run's ``journal`` bodies and of ``steps.observation``, and the bytes on disk (SQLite: the
file after a WAL checkpoint and ``VACUUM``; PostgreSQL: ``pg_total_relation_size`` of ``journal``
and ``steps`` after ``VACUUM FULL``, on the DSN in ``POLYLOOP_TEST_PG_DSN``). "before" writes as
journal schema 1.x did (``_observations.SHARED_ABOVE`` raised past the observation: the result
and the step record hold a copy each, ``steps.observation`` a third), "after" as 2.0 does (the
result and its step are written in one append: ``steps.observation`` holds the only copy).
Prints a Markdown table and writes it to ``bench/results/observation_once.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import sqlite3
import tempfile
from pathlib import Path

from polyloop import Limits, Loop, ModelReply, ToolCall, ToolRegistry
from polyloop.journal import SQLiteJournal, _observations
from polyloop.testing import FakeClock, FunctionModel
from polyloop.types import ModelRequest

RESULTS = Path(__file__).parent / "results" / "observation_once.md"


def observation(n: int) -> str:
    return base64.b64encode(random.Random(n).randbytes(n)).decode()[:n]


def one_read(journal: object, n: int) -> Loop:
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def read(part: str) -> str:
        """Read a part."""
        return observation(n)

    def script(request: ModelRequest) -> ModelReply:
        name = "read" if request.step_idx == 0 else "nothing"
        return ModelReply(tool_calls=(ToolCall(name, {"part": "a"}),))

    return Loop(
        FunctionModel(script),
        tools=tools,
        journal=journal,  # type: ignore[arg-type]
        limits=Limits(max_steps=2),
        clock=FakeClock(),
    )


async def on_sqlite(folder: Path, n: int, label: str) -> tuple[int, int, int]:
    path = folder / f"{label}-{n}.db"
    async with SQLiteJournal(path) as journal:
        await one_read(journal, n).run("read", run_id="r")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        bodies = conn.execute("SELECT sum(length(body)) FROM journal").fetchone()[0]
        column = conn.execute("SELECT sum(length(observation)) FROM steps").fetchone()[0]
        conn.execute("VACUUM")
    finally:
        conn.close()
    return bodies, column, path.stat().st_size


async def on_postgres(dsn: str, n: int, label: str) -> tuple[int, int, int]:
    import psycopg

    from polyloop.journal.postgres import PostgresJournal

    schema = f"bench_obs_{label}_{n}_{os.getpid()}"
    async with PostgresJournal(dsn, schema=schema) as journal:
        await one_read(journal, n).run("read", run_id="r")
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute(f"SET search_path = {schema}")
            conn.execute("VACUUM FULL journal")
            conn.execute("VACUUM FULL steps")
            row = conn.execute(
                "SELECT (SELECT sum(length(body)) FROM journal), "
                "(SELECT sum(length(observation)) FROM steps), "
                "pg_total_relation_size('journal') + pg_total_relation_size('steps')"
            ).fetchone()
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def main(sizes: list[int], dsn: str | None) -> str:
    lines = [
        "| journal | observation | written as | journal bodies (chars) | steps.observation "
        "(chars) | on disk (bytes) |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sizes:
            n = mb * 1_000_000
            for label, above in (("before", 10**12), ("after", _observations.SHARED_ABOVE)):
                saved, _observations.SHARED_ABOVE = _observations.SHARED_ABOVE, above
                try:
                    cases = [("SQLite", on_sqlite(Path(tmp), n, label))]
                    if dsn:
                        cases.append(("PostgreSQL", on_postgres(dsn, n, label)))
                    for name, case in cases:
                        bodies, column, disk = await case
                        lines.append(
                            f"| {name} | {mb} MB | {label} | {bodies:,} | {column:,} | {disk:,} |"
                        )
                finally:
                    _observations.SHARED_ABOVE = saved
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,20", help="observation sizes in MB, comma-separated")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    dsn = None if args.no_postgres else os.environ.get("POLYLOOP_TEST_PG_DSN")
    table = asyncio.run(main([int(s) for s in args.sizes.split(",")], dsn))
    print(table, end="")
    RESULTS.write_text(table)
