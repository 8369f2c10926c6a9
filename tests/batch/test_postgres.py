"""The batch and the sweeper on the PostgreSQL journal (local backend): the killed-driver test
of test_local.py, with the journal opened from a spec string in the child and the sweeper.

Skipped, saying how to run them, when PostgreSQL cannot be started (tests/durability/pg.py).
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop.batch import find_stalled, goal_run_id, open_journal, recover, run_batch
from tests.batch import world
from tests.batch.checks import check_rows
from tests.durability import pg

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    with pg.server() as dsn:
        yield dsn


@pytest.fixture
def db(pg_dsn: str) -> Iterator[pg.Db]:
    schema = pg.Db(pg_dsn)
    try:
        yield schema
    finally:
        schema.drop()


def spec_of(db: pg.Db) -> str:
    return f"{db.dsn}#schema={db.schema}"


def count(db: pg.Db, query: str) -> int:
    try:
        return int(db.sql(query)[0][0])
    except Exception:  # the child has not created the tables yet
        return 0


def test_a_killed_driver_on_postgres_is_finished_by_the_sweeper(db: pg.Db, tmp_path: Path) -> None:
    effects, spec = tmp_path / "effects", spec_of(db)
    n, stall_from, concurrency = 12, 4, 4
    goals = [f"task {i}" for i in range(n)]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [spec, str(effects), str(n), "0.02", str(concurrency), str(stall_from)]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.batch.driver_child", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    mid_run = (
        "SELECT count(*) FROM runs WHERE status = 'running' AND owner IS NOT NULL "
        "AND EXISTS (SELECT 1 FROM journal WHERE journal.run_id = runs.run_id)"
    )
    try:
        world.wait_for(
            lambda: (
                child.poll() is not None
                or (
                    count(db, "SELECT count(*) FROM runs WHERE status = 'ended'") == stall_from
                    and count(db, mid_run) == concurrency
                )
            ),
            what="the child to reach its stall",
        )
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGKILL)
    finally:
        child.wait()

    make_loop = functools.partial(world.make_loop, effects=str(effects), latency_s=0.01)

    async def sweep() -> dict[str, Any]:
        j = open_journal(spec)
        try:
            stalled = await find_stalled(j, older_than_s=0)
            why = Counter(s.why for s in stalled)
            assert why == {"leased": concurrency, "unowned": n - stall_from - concurrency}
            result = await recover(j, make_loop, older_than_s=0)
            assert result.complete and len(result.outcomes) == n - stall_from, result.summary()
            again = await run_batch(j, goals, make_loop, limits=world.LIMITS)
            assert again.by_status == {"already_ended": n}
            return {goal_run_id(g): await j.steps(goal_run_id(g)) for g in goals}
        finally:
            await j.aclose()

    stored = asyncio.run(sweep())
    check_rows(db.sql, stored, effects, goals, tmp_path)
