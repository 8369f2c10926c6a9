"""End-to-end: ``polyloop run --max-seconds`` bounds time even when the model never answers: the
call in flight is stopped at what is left of the budget plus the grace (5 s), not at its own
request timeout (``--timeout``), and the run ends ``time_budget``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e import test_cli as base
from tests.e2e.test_cli import CLI, SlowableServer, run_args, run_id_of, sql
from tests.fakes.openai_server import hang

pytest.importorskip("typer")
pytest.importorskip("openai")

# The fixtures of the CLI tests.
cli, fake, workspace = base.cli, base.fake, base.workspace


def test_max_seconds_ends_a_run_whose_model_never_answers_time_budget(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(hang(), hang(), hang())  # the server accepts every request, answers none
    done = cli(*run_args(fake, workspace, "--max-seconds", "3", "--timeout", "60"))
    assert done.code == 3, done  # a budget stop
    run_id = run_id_of(done.out)
    assert f"run {run_id}: time_budget after 1 steps, 0 actions" in done.out, done
    # It ended long before the 60 s request timeout would have fired (the CLI harness gives
    # up at 60 s): at 3 s of budget plus the 5 s grace.
    # One attempt, recorded as a request timeout: no retry started after the budget.
    [(state, error)] = sql(cli.cwd / "j.db", "SELECT state, error FROM model_calls")
    assert state == "failed", error
    assert re.search(r"no answer within [0-9.]+ s: what was left of the time budget", error)
    seconds = float(re.search(r"within ([0-9.]+) s", error).group(1))  # type: ignore[union-attr]
    assert 5 < seconds <= 8  # 3 s left (less the run's start) + 5 s grace
    # The bound the README states: max_seconds + G + U (U: journal writes, the end record).
    [(active,)] = sql(cli.cwd / "j.db", "SELECT active_seconds FROM runs")
    assert active is not None and 3 <= active <= 3 + 5 + 2, active
