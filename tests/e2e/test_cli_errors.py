"""End-to-end: the ``polyloop`` command's own error handling, with the typer this environment
resolves (an unexpected exception, the end of input at a prompt, a run id that is not text).

Every command runs as ``python -m polyloop.cli ...`` in a temporary directory (see
``test_cli.py``), judged by its output and exit code only.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_cli import CLI, TIMEOUT_S, Done, assert_one_line_error

pytest.importorskip("typer")


@pytest.fixture
def cli(tmp_path: Path) -> CLI:
    return CLI(tmp_path)


def run_bytes(cli: CLI, *args: str | bytes, stdin: int | None = subprocess.DEVNULL) -> Done:
    """``polyloop ARGS`` with arguments given as bytes where they are not UTF-8, stdin closed."""
    proc = subprocess.run(
        [os.fsencode(a) for a in cli.argv([])] + [os.fsencode(a) for a in args],
        cwd=cli.cwd,
        env=cli.env,
        stdin=stdin,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    return Done(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def batch_with_factory(cli: CLI, source: str) -> Done:
    """``polyloop batch`` whose ``--loop`` factory module (in the working folder) is ``source``."""
    (cli.cwd / "factory.py").write_text(source, encoding="utf-8")
    (cli.cwd / "goals.jsonl").write_text('{"goal": "g"}\n', encoding="utf-8")
    return run_bytes(cli, "batch", "goals.jsonl", "--loop", "factory:make", "--journal", "j.db")


def test_an_unexpected_exception_in_a_command_is_one_line_naming_it(cli: CLI) -> None:
    done = batch_with_factory(cli, 'raise RuntimeError("the factory has a bug")\n')
    assert_one_line_error(done)
    assert "RuntimeError: the factory has a bug" in done.err, done
    assert "AttributeError" not in done.err, done


def test_the_end_of_input_at_a_prompt_is_one_line(cli: CLI) -> None:
    done = batch_with_factory(cli, 'KEY = input("API key: ")\n')
    assert_one_line_error(done)
    assert "aborted" in done.err, done
    assert "AttributeError" not in done.err, done


def test_a_run_id_that_is_not_unicode_is_a_one_line_refusal_for_every_verb(cli: CLI) -> None:
    from tests.durability.test_sqlite_damage import write_runs

    asyncio.run(write_runs(cli.cwd / "j.db", 1))
    bad = b"id\xff"
    j = ("--journal", "j.db")
    commands: dict[str, tuple[str | bytes, ...]] = {
        "show": ("show", bad, *j),
        "resume": ("resume", bad, *j),
        "stop": ("stop", bad, "--reason", "x", *j),
        "cancel": ("cancel", bad, *j),
        "approve": ("approve", bad, "op", *j),
        "deny": ("deny", bad, "op", "--reason", "x", *j),
        "approve OP_ID": ("approve", "run-000", bad, *j),
        "deny OP_ID": ("deny", "run-000", bad, "--reason", "x", *j),
        "report": ("report", bad, *j, "-o", "r.html"),
    }
    for name, args in commands.items():
        done = run_bytes(cli, *args)
        try:
            assert_one_line_error(done)
            assert "U+DCFF" in done.err and "not valid Unicode" in done.err
        except AssertionError:
            raise AssertionError(f"{name}: {done}") from None
    assert not (cli.cwd / "r.html").exists()
