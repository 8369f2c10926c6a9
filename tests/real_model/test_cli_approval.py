"""``polyloop run --ask`` with the real model (Gemma 3 270M behind llama-cpp-python's server):
the run parks on the shell call the model makes (exit 5, the commands to decide printed), a
second process approves it, and ``polyloop resume`` executes it and finishes the run.

The command has no ``tool_choice`` option, so the requests go through a small forwarding
proxy on 127.0.0.1 that makes the first one name the ``shell`` function (the server then
generates the call under a grammar of its schema, narrowed here to one harmless command) and
the others ``tool_choice: none`` (a text answer). Only the protocol and the records are
asserted, never what the model says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from polyloop.testing.real_model import LlamaServer

from .support import forced, journal_kinds, model_calls, steps

pytestmark = pytest.mark.real_model

COMMAND = "touch approved.txt"


class ForcingProxy:
    """Forwards ``POST .../chat/completions`` to ``upstream``: one whose history has no tool
    result yet with the ``shell`` call forced (its ``command`` limited to :data:`COMMAND`), the
    others with no tool call allowed. ``sent``: the bodies forwarded."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.sent: list[dict[str, Any]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                proxy.rewrite(body)
                request = urllib.request.Request(
                    proxy.upstream + self.path.removeprefix("/v1"),
                    data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=300) as answer:
                    status, data = answer.status, answer.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rewrite(self, body: dict[str, Any]) -> None:
        if not any(m["role"] == "tool" for m in body["messages"]):
            body["tool_choice"] = forced("shell")
            for tool in body.get("tools", []):
                if tool["function"]["name"] == "shell":
                    command = tool["function"]["parameters"]["properties"]["command"]
                    command["enum"] = [COMMAND]
        else:
            body["tool_choice"] = "none"
        self.sent.append(body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(tool_server: LlamaServer) -> Iterator[ForcingProxy]:
    p = ForcingProxy(tool_server.base_url)
    try:
        yield p
    finally:
        p.close()


def polyloop(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "POLYLOOP_"))}
    return subprocess.run(
        [sys.executable, "-m", "polyloop.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_run_ask_parks_on_the_real_models_call_is_approved_elsewhere_and_resumed(
    proxy: ForcingProxy, tmp_path: Path
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    run = polyloop(
        tmp_path, "run", "Create the file approved.txt with the shell tool.",
        "--model", "openai:gemma-3-270m", "--base-url", proxy.url, "--workspace", str(ws),
        "--tools", "files,shell", "--ask", "^touch ", "--journal", "j.db", "--max-steps", "3",
        "--run-id", "real-ask", "--timeout", "600",
    )  # fmt: skip
    assert run.returncode == 5, (run.stdout, run.stderr)  # parked: needs a human
    assert "awaiting approval: run real-ask step 0 wants shell " in run.stdout, run.stdout
    match = re.search(r"approve: polyloop approve real-ask (\S+) --journal j\.db", run.stdout)
    assert match, run.stdout
    op_id = match.group(1)
    assert "pending: polyloop pending --journal j.db" in run.stdout
    assert not (ws / "approved.txt").exists()  # nothing executed while parked
    assert [b["tool_choice"] for b in proxy.sent] == [forced("shell")]

    approve = polyloop(tmp_path, "approve", "real-ask", op_id, "--by", "alice", "--journal", "j.db")
    assert approve.returncode == 0, approve.stderr
    assert "continue it: polyloop resume real-ask --journal j.db" in approve.stdout

    resume = polyloop(tmp_path, "resume", "real-ask", "--journal", "j.db")
    assert resume.returncode == 0, (resume.stdout, resume.stderr)
    assert "agent_finished" in resume.stdout, resume.stdout
    assert (ws / "approved.txt").exists()  # the approved command ran, once, on resume
    assert [b["tool_choice"] for b in proxy.sent] == [forced("shell"), "none"]

    db = tmp_path / "j.db"
    kinds = journal_kinds(db, "real-ask")
    assert kinds.count("approval_requested") == 1 and kinds.count("approval_decided") == 1
    assert kinds.index("approval_decided") < kinds.index("approved_action_started")
    step0 = steps(db, "real-ask")[0]
    assert step0["tool_name"] == "shell" and step0["action_status"] == "executed"
    assert json.loads(step0["tool_args_json"]) == {"command": COMMAND}
    calls = model_calls(db, "real-ask")
    assert [(c["step_idx"], c["state"]) for c in calls] == [(0, "ok"), (1, "ok")]
