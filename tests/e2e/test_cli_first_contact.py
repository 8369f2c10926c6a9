"""End-to-end: what a new user meets first — ``polyloop`` alone, ``-h``, ``--version``, errors
in the command line's words, ``--metadata``, and where the demo's journal goes.

Every command runs as ``python -m polyloop.cli ...`` in a temporary directory (see
``test_cli.py``), judged by its output, exit code and the journal it wrote.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import polyloop
from tests.e2e.test_cli import CLI, assert_one_line_error
from tests.fakes.openai_server import FakeOpenAIServer, completion

pytest.importorskip("typer")
pytest.importorskip("openai")


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    (tmp_path / "ws").mkdir()
    return CLI(tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()


def metadata_of(journal: Path) -> dict[str, dict[str, object]]:
    with sqlite3.connect(journal) as conn:
        rows = conn.execute("SELECT run_id, metadata_json FROM runs").fetchall()
    return {run_id: json.loads(meta) for run_id, meta in rows}


# --- the root command ------------------------------------------------------------------------


def test_polyloop_alone_prints_the_help_and_exits_0(cli: CLI) -> None:
    done = cli()
    assert done.code == 0, done
    assert done.err == "", done
    assert done.out.startswith("Usage: polyloop"), done
    for verb in ("demo", "run", "batch", "show", "approve"):
        assert re.search(rf"^\s+{verb}\s", done.out, re.MULTILINE), done


def test_dash_h_is_help_on_every_command_and_version_prints_the_version(cli: CLI) -> None:
    short, long, run_short, run_long, version = cli.many(
        ["-h"], ["--help"], ["run", "-h"], ["run", "--help"], ["--version"]
    )
    assert short.code == long.code == run_short.code == run_long.code == 0, (short, run_short)
    assert short.out == long.out and run_short.out == run_long.out
    assert run_short.out.startswith("Usage: polyloop run"), run_short
    assert version.code == 0, version
    assert version.out == f"polyloop {polyloop.__version__}\n", version


# --- errors in the command line's words ------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-tokens", "0"), ("--max-cost", "-1"), ("--max-seconds", "0"), ("--max-actions", "0")],
)
def test_a_bad_budget_is_named_by_its_flag_not_by_the_library(
    cli: CLI, flag: str, value: str
) -> None:
    for command in (
        ["run", "g", "--model", "openai:m", "--workspace", "ws", flag, value],
        ["batch", "goals.jsonl", "--model", "openai:m", "--workspace", "ws", flag, value],
    ):
        (cli.cwd / "goals.jsonl").write_text('{"goal": "g"}\n', encoding="utf-8")
        done = cli(*command)
        assert_one_line_error(done)
        assert f"polyloop: {flag} must be > 0, got " in done.err, done
        assert "Limits." not in done.err and "None" not in done.err, done
        if flag != "--max-actions":  # a limit with no "no limit" default says how to have none
            assert "leave it out for no limit" in done.err, done
    assert not (cli.cwd / "polyloop.db").exists()


@pytest.mark.parametrize("model", ["gpt-4o", "mistral:large"])
def test_a_bad_model_lists_every_accepted_prefix(cli: CLI, model: str) -> None:
    done = cli("run", "g", "--model", model, "--workspace", "ws")
    assert_one_line_error(done)
    for prefix in ("openai:MODEL", "openai-responses:MODEL", "anthropic:MODEL", "gemini:MODEL"):
        assert prefix in done.err, done


# --- --metadata ------------------------------------------------------------------------------


def test_run_metadata_is_stored_beside_the_commands_own_key(
    cli: CLI, fake: FakeOpenAIServer
) -> None:
    fake.script(completion("done"))
    model = ("--model", "openai:m", "--base-url", fake.url, "--workspace", "ws")
    done = cli("run", "g", *model, "--metadata", "experiment=e7", "--metadata", "seed=3")
    assert done.code == 0, done
    (meta,) = metadata_of(cli.cwd / "polyloop.db").values()
    assert meta["experiment"] == "e7" and meta["seed"] == "3", meta
    assert isinstance(meta["cli"], dict) and meta["cli"]["model"] == "openai:m", meta


@pytest.mark.parametrize("item", ["cli=x", "novalue", "=x"])
def test_a_metadata_item_that_cannot_be_stored_as_given_is_refused(cli: CLI, item: str) -> None:
    done = cli("run", "g", "--model", "openai:m", "--workspace", "ws", "--metadata", item)
    assert_one_line_error(done)
    assert "--metadata" in done.err, done
    assert not (cli.cwd / "polyloop.db").exists()


def test_batch_metadata_tags_every_run_and_a_lines_own_key_wins(
    cli: CLI, fake: FakeOpenAIServer
) -> None:
    lines = [{"goal": "a"}, {"goal": "b", "metadata": {"split": "test"}}]
    (cli.cwd / "goals.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8"
    )
    fake.script(completion("one"), completion("two"))
    done = cli(
        "batch", "goals.jsonl", "--model", "openai:m", "--base-url", fake.url,
        "--workspace", "ws", "--journal", "j.db",
        "--metadata", "split=train", "--metadata", "experiment=e7",
    )  # fmt: skip
    assert done.code == 0, done
    metas = sorted(metadata_of(cli.cwd / "j.db").values(), key=lambda m: str(m["split"]))
    assert [m["split"] for m in metas] == ["test", "train"], metas
    assert all(m["experiment"] == "e7" and "cli" in m for m in metas), metas


# --- the demo's journal ----------------------------------------------------------------------


def test_the_demo_journal_is_in_the_current_folder_and_replaced_by_the_next_demo(
    cli: CLI, tmp_path: Path
) -> None:
    first = cli("demo")
    assert first.code == 0, first
    journal = cli.cwd / "polyloop-demo.db"
    assert f"journal: {journal}" in first.out, first
    assert f"polyloop runs --journal {journal}" in first.out, first
    listed = cli("runs", "--journal", "polyloop-demo.db")
    assert listed.code == 0 and listed.out.startswith("3 runs"), listed
    # the workspaces the demo worked on are gone; its journal stays
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("polyloop-demo-")]
    second = cli("demo")
    assert second.code == 0, second
    again = cli("runs", "--journal", "polyloop-demo.db")
    assert again.out.startswith("3 runs"), again  # replaced, not piled up
    assert not (cli.cwd / "polyloop.db").exists()  # never the default journal
