"""``--writable-paths`` and ``--read-only`` on ``polyloop run`` and ``polyloop batch``, and a
test edited through the shell reported as one edited through ``edit_file``: the command as a
subprocess, the model's tool calls scripted by the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from tests.batch.test_cli_batch import write_goals
from tests.e2e.test_cli import (
    CLI,
    Live,
    SlowableServer,
    assert_one_line_error,
    cli,
    fake,
    live,
    run_id_of,
    slow,
    sql,
)
from tests.fakes.openai_server import FakeOpenAIServer, Reply, completion, tool_call

__all__ = ["cli", "fake", "live"]  # the fixtures, shared with test_cli.py

SOURCE = "def cancel(order_id):\n    return order_id\n"
TESTS = "def test_cancel():\n    assert cancel('o1') == 'o1'\n"


def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "src" / "shop.py").write_text(SOURCE)
    (root / "tests" / "test_shop.py").write_text(TESTS)
    return root


def calls(name: str, args: dict[str, str], n: int) -> Reply:
    return completion(
        tool_calls=[tool_call(name, json.dumps(args), id=f"call_{n}")], id=f"chatcmpl-{n}"
    )


def run_args(fake: FakeOpenAIServer, root: Path, *extra: str, tools: str = "files") -> list[str]:
    model = ["--model", "openai:test-model", "--base-url", fake.url]
    where = ["--workspace", str(root), "--journal", "j.db", "--tools", tools]
    return ["run", "fix the shop", *model, *where, *extra]


def steps(journal: Path) -> list[tuple[str, str, str]]:
    return [
        (str(name), str(status), str(obs))
        for name, status, obs in sql(
            journal,
            "SELECT tool_name, action_status, observation FROM steps WHERE tool_name IS NOT NULL "
            "ORDER BY step_idx",
        )
    ]


def test_a_write_outside_writable_paths_is_refused_and_the_file_unchanged(
    cli: CLI, fake: SlowableServer, tmp_path: Path
) -> None:
    root = ws(tmp_path)
    fake.script(
        calls("write_file", {"path": "src/shop.py", "content": "Write a file."}, 1),
        calls("write_file", {"path": "<path>", "content": "x"}, 2),
        calls("edit_file", {"path": "tests/test_shop.py", "old": "'o1' ==", "new": "1 =="}, 3),
        completion("done", id="chatcmpl-4"),
    )
    done = cli(*run_args(fake, root, "--writable-paths", "docs", "--writable-paths", "*.md"))
    assert done.code == 0, done
    assert (root / "src" / "shop.py").read_text() == SOURCE
    assert (root / "tests" / "test_shop.py").read_text() == TESTS
    assert sorted(p.name for p in root.iterdir()) == ["src", "tests"]  # no file named <path>
    recorded = steps(tmp_path / "j.db")
    assert [(name, status) for name, status, _ in recorded] == [
        ("write_file", "not_executed"),
        ("write_file", "not_executed"),
        ("edit_file", "not_executed"),
    ]
    assert recorded[0][2] == (
        "Error: writing to 'src/shop.py' is not allowed; nothing was done. Only these paths "
        "may be written: docs, *.md. Keep your changes inside them."
    )
    # the model saw the refusal, and the write tools' descriptions named the writable paths
    seen = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert seen[0]["content"] == recorded[0][2]
    specs = {t["function"]["name"]: t["function"] for t in fake.requests[0].body["tools"]}
    assert "Only these paths may be written: docs, *.md." in specs["write_file"]["description"]
    (stored,) = sql(tmp_path / "j.db", "SELECT metadata_json FROM runs")
    assert json.loads(stored[0])["cli"]["writable_paths"] == ["docs", "*.md"]


def test_read_only_refuses_every_write_also_after_resume(
    cli: CLI, fake: SlowableServer, tmp_path: Path, live: list[Live]
) -> None:
    root = ws(tmp_path)
    fake.script(
        calls("write_file", {"path": "src/shop.py", "content": "x"}, 1),
        slow(calls("read_file", {"path": "src/shop.py"}, 2), 1.0),
    )
    proc = Live(cli, *run_args(fake, root, "--read-only"))
    live.append(proc)
    proc.wait_for(r"^step +0 ")
    proc.interrupt()  # detach: the resumed run rebuilds its tools from the stored config
    detached = proc.finish()
    assert detached.code == 130, detached
    resume = re.search(r"polyloop (resume \S+ --journal \S+)$", detached.out, re.MULTILINE)
    assert resume, detached
    fake.script(
        calls("write_file", {"path": "new.txt", "content": "x"}, 3), completion("done", id="c4")
    )
    resumed = cli(*shlex.split(resume.group(1)))
    assert resumed.code == 0, resumed
    assert run_id_of(detached.out) in resumed.out
    recorded = steps(tmp_path / "j.db")
    assert [(name, status) for name, status, _ in recorded] == [
        ("write_file", "not_executed"),
        ("read_file", "executed"),
        ("write_file", "not_executed"),
    ]
    assert "may be written: none (the workspace is read-only)" in recorded[2][2]
    assert not (root / "new.txt").exists()
    assert (root / "src" / "shop.py").read_text() == SOURCE


def test_shell_writes_outside_writable_paths_are_reported_to_the_model(
    cli: CLI, fake: SlowableServer, tmp_path: Path
) -> None:
    root = ws(tmp_path)
    fake.script(
        calls("shell", {"command": "echo broken > src/shop.py"}, 1), completion("done", id="c2")
    )
    done = cli(*run_args(fake, root, "--writable-paths", "docs", tools="files,shell"))
    assert done.code == 0, done
    ((name, status, observation),) = steps(tmp_path / "j.db")
    assert (name, status) == ("shell", "executed")
    assert (
        "Note: this command changed files outside the paths that may be written (docs): "
        "src/shop.py. They were not undone." in observation
    )


def test_a_sed_on_a_test_file_is_reported_like_the_same_edit_through_edit_file(
    cli: CLI, fake: SlowableServer, tmp_path: Path
) -> None:
    reports = []
    for n, first in enumerate(
        [
            ("edit_file", {"path": "tests/test_shop.py", "old": "== 'o1'", "new": "is not None"}),
            ("shell", {"command": "sed -i \"s/== 'o1'/is not None/\" tests/test_shop.py"}),
        ]
    ):
        here = tmp_path / f"try{n}"
        here.mkdir()
        root = ws(here)
        fake.script(calls(*first, 1), completion("done", id="c2"))
        done = CLI(here)(*run_args(fake, root, tools="files,shell"))
        assert done.code == 0, done
        assert "is not None" in (root / "tests" / "test_shop.py").read_text()
        edits = sql(here / "j.db", "SELECT body FROM journal WHERE kind = 'test_edit'")
        said = done.out[done.out.index("test files edited:") :]
        reports.append(([json.loads(b) for (b,) in edits], said))
    by_tool, by_shell = reports
    assert by_shell == by_tool
    assert by_shell[0] == [
        {
            "kind": "test_edit",
            "step_idx": 0,
            "path": "tests/test_shop.py",
            "tampering": ["assertion_changed"],
        }
    ]
    assert by_shell[1].splitlines()[:2] == [
        "test files edited:",
        "  tests/test_shop.py (assertion_changed) at step 0",
    ]


def test_batch_takes_writable_paths_and_read_only(
    cli: CLI, fake: SlowableServer, tmp_path: Path
) -> None:
    root = ws(tmp_path)
    write_goals(tmp_path / "goals.jsonl", "fix a")
    fake.script(calls("write_file", {"path": "src/shop.py", "content": "x"}, 1), completion("done"))
    model = ["--model", "openai:test-model", "--base-url", fake.url]
    batch = ["batch", "goals.jsonl", *model, "--workspace", str(root), "--tools", "files"]
    done = cli(*batch, "--journal", "j.db", "--read-only")
    assert done.code == 0, done
    assert (root / "src" / "shop.py").read_text() == SOURCE
    assert [s[:2] for s in steps(tmp_path / "j.db")] == [("write_file", "not_executed")]
    fake.script(calls("write_file", {"path": "src/shop.py", "content": "x"}, 1), completion("done"))
    allowed = cli(*batch, "--journal", "k.db", "--writable-paths", "src")
    assert allowed.code == 0, allowed
    assert (root / "src" / "shop.py").read_text() == "x"
    both = cli(*batch, "--journal", "l.db", "--read-only", "--writable-paths", "src")
    assert_one_line_error(both)
    assert "--read-only and --writable-paths cannot be combined" in both.err
    outside = cli(*run_args(fake, root, "--writable-paths", "../elsewhere"))
    assert_one_line_error(outside)
    assert "--writable-paths '../elsewhere' lies outside the workspace" in outside.err
    assert not (tmp_path / "l.db").exists()
