"""``polyloop report``: one self-contained HTML file; no content leaves by default."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from polyloop import RunNotFound
from polyloop.cli.view import build_report
from polyloop.journal import SQLiteJournal
from tests.viewer.journal_factory import ALL_REASONS, MARKERS

typer_testing = pytest.importorskip("typer.testing")


def report(journal_path: Path, run_id: str, **kw: object) -> str:
    async def go() -> str:
        async with SQLiteJournal(journal_path) as journal:
            return await build_report(journal, run_id, **kw)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_a_report_is_self_contained(journal_path: Path) -> None:
    html = report(journal_path, "run-task_completed")
    assert html.startswith("<!doctype html>")
    assert "<style>" in html and "<script>" in html
    assert not re.search(r'(src|href)="(/|https?:)', html), "no request may leave the file"
    for i in range(4):
        assert f'id="step-{i}"' in html


def test_by_default_no_content_is_in_a_report(journal_path: Path) -> None:
    html = report(journal_path, "run-task_completed")
    for name, marker in MARKERS.items():
        assert marker not in html, name
    assert "Find the thing" not in html  # the goal
    assert "Your reply was empty" not in html  # the parse error fed back to the model
    # What it does carry: ids, tool names, statuses, counters, lengths and hashes.
    assert "run-task_completed" in html and "lookup" in html and "submit" in html
    assert "executed" in html and "sha256:" in html and "withheld" in html
    assert 'data-reason="task_completed"' in html


@pytest.mark.parametrize("reason", ALL_REASONS)
def test_no_report_of_any_stop_reason_carries_details_by_default(
    journal_path: Path, reason: str
) -> None:
    html = report(journal_path, f"run-{reason}")
    for text in ("sandbox is gone", "the provider said no", '{"amount":5}', "the same failure"):
        assert text not in html


def test_with_content_the_report_is_scrubbed(journal_path: Path) -> None:
    html = report(journal_path, "run-task_completed", include_content=True)
    for name in ("goal", "text", "reasoning", "argument", "observation"):
        assert MARKERS[name] in html, name
    assert MARKERS["secret"] not in html and MARKERS["email"] not in html
    assert "[REDACTED:api_key]" in html and "[REDACTED:email]" in html


def test_a_report_of_a_huge_observation_is_capped(journal_path: Path) -> None:
    html = report(journal_path, "run-bigobs", include_content=True)
    assert len(html) < 400_000 and "more not included here" in html


def test_a_report_of_a_missing_run_raises(journal_path: Path) -> None:
    with pytest.raises(RunNotFound):
        report(journal_path, "nope")


# --- the commands ----------------------------------------------------------------------------


def cli(*args: str) -> tuple[int, str, str]:
    from polyloop.cli.app import app

    result = typer_testing.CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_report_command_writes_the_file(journal_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    code, _, err = cli(
        "report", "run-task_completed", "-o", str(out), "--journal", str(journal_path)
    )
    assert code == 0, err
    assert f"wrote {out}" in err
    html = out.read_text(encoding="utf-8")
    assert MARKERS["goal"] not in html and "run-task_completed" in html


def test_report_command_include_content(journal_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "run.html"
    code, _, err = cli(
        "report", "run-task_completed", "-o", str(out), "--journal", str(journal_path),
        "--include-content",
    )  # fmt: skip
    assert code == 0, err
    html = out.read_text(encoding="utf-8")
    assert MARKERS["goal"] in html and MARKERS["secret"] not in html


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["report", "nope"], "no run 'nope' in"),
        (["report", "x", "--journal", "/nonexistent/j.db"], "no journal at /nonexistent/j.db"),
        (["report", "run-task_completed", "-o", "/nonexistent/dir/r.html"], "cannot write"),
        (["view", "--journal", "/nonexistent/j.db"], "no journal at /nonexistent/j.db"),
        (["view", "--port", "70000"], "--port takes 0 to 65535"),
        (["view", "--host", "203.0.113.1", "--port", "0"], "cannot serve"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(
    journal_path: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYLOOP_JOURNAL", str(journal_path))
    code, out, err = cli(*args)
    assert code == 1, (out, err)
    assert message in err and err.count("\n") == 1 and err.startswith("polyloop: ")
