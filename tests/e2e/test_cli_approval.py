"""Approval from the command line, as a user drives it: ``polyloop run``/``batch`` with shell
rules that park a run (``--ask``), refuse (``--forbid``) or come from a policy file; the
decision from another process and what continues the run, by who started it; and what
``show``, ``runs`` and ``recover --dry-run`` say of parked and crashed runs. Subprocesses
against the fake OpenAI-compatible server on 127.0.0.1 (tests/e2e/test_cli.py's harness)."""

# ruff: noqa: F811  (the harness's fixtures, imported, are test parameters)
from __future__ import annotations

import json
import re
import signal
import sqlite3
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from polyloop import ApprovalRequired, Loop
from polyloop.journal import SQLiteJournal
from polyloop.testing import FunctionModel
from tests.e2e.test_cli import (  # noqa: F401  (fixtures)
    CLI,
    Live,
    SlowableServer,
    assert_one_line_error,
    cli,
    fake,
    live,
    run_id_of,
    runs_rows,
    sql,
    workspace,
)
from tests.fakes.openai_server import FakeOpenAIServer, completion, tool_call

pytest.importorskip("typer")
pytest.importorskip("openai")


def shell_call(command: str, n: int) -> Any:
    return completion(
        tool_calls=[tool_call("shell", json.dumps({"command": command}), id=f"call_{n}")],
        id=f"chatcmpl-{n}",
    )


def shell_args(fake: FakeOpenAIServer, workspace: Path, *extra: str) -> tuple[str, ...]:
    model = ("--model", "openai:test-model", "--base-url", fake.url)
    where = ("--workspace", str(workspace), "--journal", "j.db", "--tools", "files,shell")
    return ("run", "make the files", *model, *where, *extra)


def parked_op(out: str) -> str:
    match = re.search(r"approve: polyloop approve \S+ (\S+) --journal j\.db", out)
    assert match, out
    return match.group(1)


def stored_cli(db: Path, run_id: str) -> dict[str, Any]:
    (body,) = sql(db, f"SELECT metadata_json FROM runs WHERE run_id = '{run_id}'")[0]
    return dict(json.loads(body)["cli"])


def intents(db: Path) -> list[Any]:
    """The action intents in the journal file, once it has its tables."""
    try:
        return sql(db, "SELECT 1 FROM journal WHERE kind = 'action_intent'") if db.exists() else []
    except sqlite3.OperationalError:  # created, its tables not yet
        return []


def tool_messages(fake: FakeOpenAIServer) -> list[str]:
    return [m["content"] for m in fake.requests[-1].body["messages"] if m["role"] == "tool"]


def test_ask_parks_with_the_commands_approve_elsewhere_and_resume_runs_it_under_the_same_rules(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(
        shell_call("touch first.txt", 1),
        shell_call("touch second.txt", 2),
        completion("made one, the other was refused", id="chatcmpl-3"),
    )
    done = cli(*shell_args(fake, workspace, "--ask", r"^touch "))
    assert done.code == 5, done  # ExitCode.NEEDS_HUMAN
    run_id = run_id_of(done.out)
    op = parked_op(done.out)
    assert f"awaiting approval: run {run_id} step 0 wants shell " in done.out, done
    assert f"deny: polyloop deny {run_id} {op} --reason TEXT --journal j.db" in done.out
    assert "pending: polyloop pending --journal j.db" in done.out
    assert f"then: polyloop resume {run_id} --journal j.db" in done.out
    assert not (workspace / "first.txt").exists()
    assert stored_cli(workspace.parent / "j.db", run_id)["shell_policy"] == {
        "default": "allow",
        "rules": [{"pattern": "^touch ", "decision": "ask"}],
    }

    listed = cli("pending", "--journal", "j.db")
    assert f"{run_id}  step 0  op_id {op}  shell " in listed.out, listed
    approved = cli("approve", run_id, op, "--by", "alice", "--journal", "j.db")
    assert approved.code == 0, approved
    assert approved.out.strip().endswith(f"continue it: polyloop resume {run_id} --journal j.db")

    # The resume executes the approved command, and rebuilds the rules: the next one parks.
    again = cli("resume", run_id, "--journal", "j.db")
    assert again.code == 5, again
    assert (workspace / "first.txt").exists() and not (workspace / "second.txt").exists()
    second = parked_op(again.out)
    assert second != op

    wrong = cli("approve", run_id, op, "--journal", "j.db")  # decided already
    assert wrong.code == 1 and "already approved by alice" in wrong.err, wrong
    denied = cli("deny", run_id, second, "--reason", "one file is enough", "--journal", "j.db")
    assert denied.code == 0 and f"polyloop resume {run_id} --journal j.db" in denied.out, denied
    # A wrong op_id while nothing awaits a decision: not "it awaits op_id <the denied one>".
    wrong = cli("approve", run_id, "0" * 32, "--journal", "j.db")
    assert_one_line_error(wrong)
    assert f"it awaits no approval: op_id {second} (step 1) was already denied" in wrong.err

    end = cli("resume", run_id, "--journal", "j.db")
    assert end.code == 0 and "agent_finished" in end.out, end
    assert not (workspace / "second.txt").exists()
    assert any("one file is enough" in m for m in tool_messages(fake))


def test_wrong_op_id_names_the_op_still_pending(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(
        shell_call("touch a.txt", 1),
        shell_call("touch b.txt", 2),
        completion("done", id="chatcmpl-3"),
    )
    done = cli(*shell_args(fake, workspace, "--ask", "touch"))
    run_id, first = run_id_of(done.out), parked_op(done.out)
    assert cli("deny", run_id, first, "--reason", "no", "--journal", "j.db").code == 0
    parked = cli("resume", run_id, "--journal", "j.db")
    assert parked.code == 5, parked
    pending = parked_op(parked.out)
    wrong = cli("approve", run_id, first[::-1], "--journal", "j.db")
    assert_one_line_error(wrong)
    assert f"it awaits approval of op_id {pending} (step 1)" in wrong.err, wrong
    assert first not in wrong.err.replace(first[::-1], "")


def test_forbid_refuses_the_command_and_the_run_goes_on(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(shell_call("rm notes.txt", 1), completion("could not delete it", id="chatcmpl-2"))
    done = cli(*shell_args(fake, workspace, "--forbid", r"\brm\b", "--allow", "^ls"))
    assert done.code == 0 and "agent_finished" in done.out, done
    assert (workspace / "notes.txt").exists()
    (refusal,) = tool_messages(fake)
    assert "not run" in refusal and r"\brm\b" in refusal, refusal


def test_a_policy_file_is_read_once_and_its_rules_stored(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(
        textwrap.dedent(
            """\
            default = "ask"
            [[rule]]
            pattern = "^echo "
            decision = "allow"
            [[rule]]
            pattern = "^git push"
            decision = "forbid"
            reason = "pushing is for people"
            """
        )
    )
    fake.script(
        shell_call("echo hello > said.txt", 1),
        shell_call("touch made.txt", 2),
        completion("done", id="chatcmpl-3"),
    )
    done = cli(*shell_args(fake, workspace, "--policy", str(policy)))
    assert done.code == 5, done  # echo allowed, touch: the file's default asks
    assert (workspace / "said.txt").exists() and not (workspace / "made.txt").exists()
    run_id = run_id_of(done.out)
    assert stored_cli(tmp_path / "j.db", run_id)["shell_policy"] == {
        "default": "ask",
        "rules": [
            {"pattern": "^echo ", "decision": "allow"},
            {"pattern": "^git push", "decision": "forbid", "reason": "pushing is for people"},
        ],
    }
    policy.unlink()  # the stored rules, not the file, stand for the resume
    assert cli("approve", run_id, parked_op(done.out), "--journal", "j.db").code == 0
    end = cli("resume", run_id, "--journal", "j.db")
    assert end.code == 0 and (workspace / "made.txt").exists(), end


def test_bad_rules_are_one_line_before_anything_is_written(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "bad.toml").write_text('default = "maybe"\n')
    (tmp_path / "typo.toml").write_text('[[rule]]\npattern = "x"\ndecison = "ask"\n')
    cases = {
        ("--ask", "("): "not a valid regular expression",
        ("--shell-default", "maybe"): "--shell-default takes allow, ask or forbid",
        ("--policy", "missing.toml"): "--policy missing.toml: cannot read it",
        ("--policy", "bad.toml"): "default must be allow, ask or forbid",
        ("--policy", "typo.toml"): "rule 1: takes pattern, decision and reason",
        ("--ask-mcp", "destructive"): "--ask-mcp go with --mcp",
    }
    for flags, message in cases.items():
        bad = cli(*shell_args(fake, workspace, *flags))
        assert_one_line_error(bad)
        assert message in bad.err, (flags, bad)
    files = ("run", "x", "--model", "openai:m", "--workspace", str(workspace), "--tools", "files")
    bad = cli(*files, "--ask", "touch", "--journal", "j.db")
    assert_one_line_error(bad)
    assert "rules for the shell tool: pass --tools files,shell" in bad.err
    assert not (tmp_path / "j.db").exists()
    assert fake.requests == []


# --- what continues a run, by who started it -----------------------------------------------


def test_batch_takes_the_rules_and_approve_names_the_command_that_continues_its_run(
    cli: CLI, fake: SlowableServer, workspace: Path, tmp_path: Path
) -> None:
    (tmp_path / "goals.jsonl").write_text(json.dumps({"goal": "make a file"}) + "\n")
    fake.script(shell_call("touch batch.txt", 1), completion("made it", id="chatcmpl-2"))
    model = ("--model", "openai:test-model", "--base-url", fake.url, "--tools", "files,shell")
    done = cli("batch", "goals.jsonl", *model, "--workspace", str(workspace), "--journal",
               "j.db", "--ask", "^touch")  # fmt: skip
    assert done.code == 7, done  # not every run ended: one awaits approval
    assert "awaiting approval: shell" in done.out, done
    assert "1 runs await a person's decision: polyloop pending --journal j.db" in done.out
    assert not (workspace / "batch.txt").exists()
    ((run_id,),) = sql(tmp_path / "j.db", "SELECT run_id FROM runs")
    ((op,),) = sql(tmp_path / "j.db", "SELECT json_extract(body, '$.op_id') FROM journal "
                   "WHERE kind = 'approval_requested'")  # fmt: skip
    approved = cli("approve", run_id, op, "--journal", "j.db")
    assert approved.code == 0, approved
    assert approved.out.strip().endswith(f"continue it: polyloop resume {run_id} --journal j.db")
    end = cli("resume", run_id, "--journal", "j.db")
    assert end.code == 0 and (workspace / "batch.txt").exists(), end


FACTORY = '''
from pathlib import Path
from polyloop import Loop, ModelReply, ToolCall, ToolRegistry
from polyloop.testing import FunctionModel

def make_loop(journal):
    tools = ToolRegistry()

    @tools.tool(approval=True)
    def launch(name: str) -> str:
        """Launch it."""
        Path(__file__).with_name("launched.txt").write_text(name)
        return "launched " + name

    def model(request):
        if request.step_idx == 0:
            return ModelReply(tool_calls=(ToolCall("launch", {"name": "probe"}),))
        return ModelReply("Launched.")

    return Loop(FunctionModel(model), tools=tools, journal=journal)
'''


def test_approve_of_a_batch_loop_run_names_recover_which_continues_it(
    cli: CLI, tmp_path: Path
) -> None:
    (tmp_path / "approval_factory.py").write_text(FACTORY)
    cli.env["PYTHONPATH"] = f"{tmp_path}:{cli.env.get('PYTHONPATH', '')}".rstrip(":")
    (tmp_path / "goals.jsonl").write_text(json.dumps({"goal": "launch"}) + "\n")
    done = cli("batch", "goals.jsonl", "--loop", "approval_factory:make_loop", "--journal", "j.db")
    assert done.code == 7 and "awaiting approval: launch" in done.out, done
    ((run_id,),) = sql(tmp_path / "j.db", "SELECT run_id FROM runs")
    pending = cli("pending", "--journal", "j.db")
    op = pending.out.split("op_id ")[1].split()[0]
    approved = cli("approve", run_id, op, "--journal", "j.db")
    assert approved.code == 0, approved
    assert "polyloop resume" not in approved.out, approved
    assert "re-run the polyloop batch --loop approval_factory:make_loop command" in approved.out
    hint = "polyloop recover --journal j.db --older-than 0"
    assert hint in approved.out, approved
    recovered = cli(*hint.split()[1:])
    assert recovered.code == 0, recovered
    assert (tmp_path / "launched.txt").read_text() == "probe"


async def test_approve_of_a_run_started_from_python_names_loop_resume(
    cli: CLI, tmp_path: Path
) -> None:
    from tests.contract.test_approval import Mailer, mail_then_answer

    db = tmp_path / "polyloop.db"
    world = Mailer()
    async with SQLiteJournal(db) as journal:
        loop = Loop(FunctionModel(mail_then_answer), tools=world.tools, journal=journal)
        with pytest.raises(ApprovalRequired) as info:
            await loop.run("mail", run_id="py-run")
    shown = cli("show", "py-run", "--journal", str(db))  # a parked run, whoever started it
    assert "awaiting approval since " in shown.out, shown
    assert f"op_id {info.value.op_id}  send_email " in shown.out, shown
    denied = cli("deny", "py-run", info.value.op_id, "--reason", "no", "--journal", str(db))
    assert denied.code == 0, denied
    assert "polyloop resume" not in denied.out, denied
    assert "continue it from the code that started it" in denied.out
    assert "loop.resume('py-run')" in denied.out and "resume_sync('py-run')" in denied.out
    refused = cli("resume", "py-run", "--journal", str(db))  # what the line no longer offers
    assert refused.code == 1 and "not started by the polyloop command" in refused.err


# --- reading parked and crashed runs -------------------------------------------------------


def test_show_of_a_parked_run_names_the_tool_arguments_op_id_and_since_when(
    cli: CLI, fake: SlowableServer, workspace: Path
) -> None:
    fake.script(shell_call("touch parked.txt", 1))
    done = cli(*shell_args(fake, workspace, "--ask", "touch"))
    run_id, op = run_id_of(done.out), parked_op(done.out)
    shown = cli("show", run_id, "--journal", "j.db")
    assert shown.code == 0, shown
    line = next(x for x in shown.out.splitlines() if x.startswith("awaiting approval since "))
    assert re.match(r"awaiting approval since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: step 0  ", line)
    assert f"op_id {op}  shell " in line and '"touch parked.txt"' in line, line
    assert f"polyloop approve {run_id} {op} --journal j.db" in shown.out
    as_json = json.loads(cli("show", run_id, "--journal", "j.db", "--json").out)
    action = as_json["open_action"]
    assert action["state"] == "awaiting_approval" and action["op_id"] == op
    assert action["tool_name"] == "shell" and json.loads(action["args_json"]) == {
        "command": "touch parked.txt"
    }
    assert action["requested_at"] <= time.time() and action["expires_at"] is None
    cli("approve", run_id, op, "--by", "bob", "--journal", "j.db")
    decided = cli("show", run_id, "--journal", "j.db")
    assert "approved by bob at " in decided.out and "not yet resumed" in decided.out, decided


def test_show_runs_and_recover_dry_run_of_a_run_killed_mid_action(
    cli: CLI, fake: SlowableServer, workspace: Path, live: list[Live]
) -> None:
    fake.script(shell_call("sleep 60", 1))
    proc = Live(cli, *shell_args(fake, workspace))
    live.append(proc)
    db = workspace.parent / "j.db"
    deadline = time.monotonic() + 30
    while not intents(db):
        assert time.monotonic() < deadline and proc.proc.poll() is None, proc.out()
        time.sleep(0.05)
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait()
    run_id = run_id_of(proc.out())
    ((op,),) = sql(db, "SELECT json_extract(body, '$.op_id') FROM journal "
                   "WHERE kind = 'action_intent'")  # fmt: skip

    shown = cli("show", run_id, "--journal", "j.db")
    assert shown.code == 0, shown
    assert "in flight, outcome not recorded (replay policy never: " in shown.out, shown
    assert f"step 0  op_id {op}  shell " in shown.out and '"sleep 60"' in shown.out, shown
    action = json.loads(cli("show", run_id, "--journal", "j.db", "--json").out)["open_action"]
    assert action["state"] == "in_flight" and action["replay_policy"] == "never"

    state = runs_rows(cli("runs", "--journal", "j.db").out)[run_id]["state"]
    dry = cli("recover", "--journal", "j.db", "--older-than", "0", "--dry-run")
    assert dry.code == 0, dry
    assert f"found 1 runs not ended (1 {state})" in dry.out, (state, dry)
    assert f"  {run_id}  {state} (would be resumed)  0 steps" in dry.out, dry
    assert state == "stale", state  # its owner is provably dead
    assert "leased" not in dry.out and "lease_expired" not in dry.out
