"""The scale soak (bench/scale_soak.py) at 500 runs: ``polyloop batch --loop … --backend ray`` on
PostgreSQL, a Ray worker and then the driver SIGKILLed mid-way, ``polyloop recover`` and the
same batch command again; every run ended exactly once, with its undisturbed trajectory (or
``resume_state_unknown`` right before an interrupted never-replay ``charge``), no never-replay
tool twice. Real processes throughout: the CLI, Ray, PostgreSQL. Never asserts a timing.

Skipped, saying so, without Ray or PostgreSQL (tests/durability/pg.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import scale_soak
from tests.durability import pg

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]')")


@pytest.fixture(scope="module")
def pg_dsn() -> Iterator[str]:
    with pg.server() as dsn:
        yield dsn


def test_500_runs_survive_a_killed_worker_and_a_killed_driver(pg_dsn: str) -> None:
    result = scale_soak.soak(pg_dsn, runs=500, concurrency=64, latency=0.02, log=lambda _: None)
    assert result["checked_runs"] == 500
    reasons = result["by_stop_reason"]
    unknown = reasons.pop("resume_state_unknown", 0)
    assert unknown == result["resume_state_unknown"]
    # the mix: 50 talk, 50 loop, 400 task of which only a charge in flight may end unknown
    assert reasons == {"agent_finished": 50, "step_budget": 50, "task_completed": 400 - unknown}
    assert result["effects"]["charge"] == 400 - unknown + result["unknown_with_charge_effect"]
    assert result["effects"]["ship"] == 400 - unknown
    assert result["recovered_by_recover"] > 0, "the driver's runs in flight went to recover"
    assert result["finished_by_rerun"] > 0, "the undispatched runs went to the re-run"
