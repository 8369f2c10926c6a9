"""``inspect eval`` of the task of tests/integrations, with PolyLoop's agent on the real model
behind llama.cpp's server, reached through Inspect's own ``openai-api`` provider (so
``--model`` chooses it). What is asserted is the protocol and the records: the sample's run is
journaled beside the log, every attempt is the Inspect model's, and the sample's metadata is
the run's; never what the model chose to do."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from inspect_ai.log import read_eval_log

from polyloop import StopReason
from polyloop.integrations.inspect import sample_run_id
from polyloop.testing.real_model import MODEL_ALIAS, LlamaServer

pytestmark = pytest.mark.real_model

TASK_DIR = Path(__file__).parents[1] / "integrations"


def test_inspect_eval_drives_the_real_model_through_inspects_openai_api_provider(
    tool_server: LlamaServer, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    (tmp_path / "slow").touch()  # the task's slow() returns at once
    env = {
        **os.environ,
        "LLAMA_BASE_URL": tool_server.base_url,
        "LLAMA_API_KEY": "x",
        "INSPECT_TASK_CALLS": str(tmp_path / "calls"),
        "INSPECT_TASK_SLOW": str(tmp_path / "slow"),
    }
    env.pop("POLYLOOP_INSPECT_JOURNAL", None)
    command = [
        str(Path(sys.executable).with_name("inspect")), "eval", "inspect_task.py",
        "--model", f"openai-api/llama/{MODEL_ALIAS}", "--message-limit", "8",
        "--max-retries", "1", "--log-dir", str(logs), "--display", "none",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=TASK_DIR, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr

    (path,) = logs.glob("*.eval")
    log = read_eval_log(str(path))
    (sample,) = log.samples or []
    assert sample.error is None
    summary = sample.metadata["polyloop"]
    run_id = sample_run_id(log.eval.task_id, 1, 1)
    assert summary["run_id"] == run_id
    assert summary["stop_reason"] in {s.value for s in StopReason}
    with sqlite3.connect(logs / "polyloop.sqlite") as db:
        runs = db.execute("SELECT run_id, stop_reason, steps_used FROM runs").fetchall()
        models = db.execute("SELECT DISTINCT model FROM model_calls").fetchall()
        tokens = db.execute("SELECT SUM(input_tokens) + SUM(output_tokens) FROM model_calls")
        (used,) = tokens.fetchone()
    assert runs == [(run_id, summary["stop_reason"], summary["steps_used"])]
    assert 1 <= summary["steps_used"] <= (8 - 2) // 2  # message_limit 8 → max_steps 3
    assert models == [(f"inspect:openai-api/llama/{MODEL_ALIAS}",)]
    assert used == summary["tokens"] > 0  # the server's reported usage, as Inspect read it
    if summary["stop_reason"] == "agent_finished":
        assert sample.output.completion == sample.messages[-1].text != ""
