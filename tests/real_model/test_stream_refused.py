"""``polyloop run --stream`` with tools against llama.cpp's server (llama-cpp-python,
``chatml-function-calling``): a tool call chosen under ``tool_choice`` "auto" is a reply that
server cannot stream, and it answers the streamed request with an event stream that has no
event. The run takes that as the refusal it is: the attempt fails with kind
``stream_refused``, the same request goes out whole, the command says so once, and the run
ends as its budget says, not ``llm_error``. What is asserted is the protocol and the records,
never what the model chose to do with its tools."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from polyloop import StopReason
from polyloop.cli.app import exit_code
from polyloop.testing.real_model import MODEL_ALIAS, LlamaServer

from .support import model_calls, run_row, steps, table

pytestmark = pytest.mark.real_model

GOAL = "Call the read_file tool on notes.txt"
REFUSAL = "Automatic streaming tool choice is not supported"  # the server's log, not the wire


def test_run_stream_with_tools_goes_on_whole_when_the_server_refuses_to_stream(
    tool_server: LlamaServer, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("the launch code is 7731\n")
    db = tmp_path / "runs.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "POLYLOOP_"))}
    served, refused = tool_server.requests_served(), tool_server.log_tail(None).count(REFUSAL)
    model = ("--model", f"openai:{MODEL_ALIAS}", "--base-url", tool_server.base_url)
    where = ("--workspace", str(workspace), "--journal", str(db), "--tools", "files")
    bounds = ("--max-steps", "1", "--timeout", "600")
    done = subprocess.run(
        [sys.executable, "-m", "polyloop.cli", "run", GOAL, "--stream", *model, *where, *bounds],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    shown = f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, shown
    (run_id,) = [r["run_id"] for r in table(db, "SELECT run_id FROM runs")]
    run = run_row(db, run_id)
    assert run["stop_reason"] != StopReason.llm_error, shown
    assert done.returncode == exit_code(StopReason(run["stop_reason"])), shown
    # The server refused the streamed request (its log says why), then answered it whole.
    assert tool_server.log_tail(None).count(REFUSAL) > refused, shown
    assert tool_server.requests_served() == served + 2, shown
    first, second = model_calls(db, run_id)
    assert (first["step_idx"], first["attempt"], first["state"]) == (0, 1, "retried")
    assert "[kind=stream_refused, retryable=True]" in first["error"]
    assert first["llm_call_id"] is None and first["input_tokens"] is None
    assert (second["step_idx"], second["attempt"], second["state"]) == (0, 2, "ok")
    assert second["error"] is None and second["input_tokens"] > 0
    (step,) = steps(db, run_id)
    assert step["llm_call_id"] == second["llm_call_id"] is not None
    said = [line for line in done.stderr.splitlines() if "refused to stream" in line]
    assert len(said) == 1 and said[0].startswith("polyloop: warning: "), shown
