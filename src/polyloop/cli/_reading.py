"""Reading: ``polyloop runs``, ``show``, ``stats``, ``export``, ``view``, ``report`` and
``check`` (read-only: the journal is opened read-only, never created or written)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, Literal

import typer

from polyloop import PolyLoopError, StopReason
from polyloop.types import RunEnd, TestEdit

from . import _render
from ._approval import continue_hint
from ._common import JournalOpt, ReadJournalOpt, call, fail
from ._errors import valid_text
from ._open_action import open_action, open_action_lines
from ._requests_lines import request_lines
from ._setup import (
    DEFAULT_JOURNAL,
    JOURNAL_ENV,
    BadInput,
    journal_path,
    no_journal,
    open_journal,
    open_reader,
)

_STOP_REASON_HELP = "Only runs that stopped for this: " + ", ".join(StopReason) + "."


def runs(
    journal: ReadJournalOpt = None,
    stop_reason: Annotated[
        StopReason | None,
        typer.Option("--stop-reason", metavar="REASON", help=_STOP_REASON_HELP),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only runs created on/after YYYY-MM-DD.")
    ] = None,
) -> None:
    """List the runs in a journal, oldest first, with their tokens, cost and active seconds.

    Example: polyloop runs --stop-reason step_budget --since 2026-11-01
    """

    async def go() -> list[dict[str, Any]]:
        async with open_reader(journal) as j:
            return await j.journal.list_runs()

    try:
        rows = _render.filter_runs(call(go), stop_reason=stop_reason, since=since)
    except BadInput as exc:
        raise fail(str(exc)) from None
    _render.runs_table(rows)


def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.", callback=valid_text)],
    journal: ReadJournalOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Full step records as JSON.")] = False,
) -> None:
    """Show a run's steps as a table (or, with --json, its full records), with what the run
    and each step spent: tokens (input, output, cached, reasoning), cost and active seconds,
    and the requests that changed its budgets (polyloop limits), applied or pending.

    Example: polyloop show 3f2a… --json
    """

    async def go() -> tuple[dict[str, Any], Any, list[Any], list[Any], dict[int, Any], Any]:
        async with open_reader(journal) as j:
            rows = await j.journal.list_runs(run_id=run_id)
            if not rows:
                raise BadInput(f"no run {run_id!r} in {j.where}")
            spec, records = await j.journal.read(run_id)
            steps, usage = await j.journal.steps(run_id), await j.journal.step_usage(run_id)
            requests = await j.journal.requests(run_id)
            return rows[0], spec, steps, list(records), usage, requests

    run_row, spec, steps, records, usage, requests = call(go)
    end = records[-1] if records and isinstance(records[-1], RunEnd) else None
    report = end.report if end else None
    edits = [r for r in records if isinstance(r, TestEdit)]
    action = open_action(records)
    if as_json:
        _render.show_json(run_row, steps, report, edits, usage, action, requests)
    else:
        _render.show_table(run_row, steps, usage)
        for line in request_lines(requests):
            print(line)
        where = f" --journal {journal}" if journal else ""
        from polyloop.batch._journals import is_postgres_spec  # not at start-up: 20 ms

        named = journal if journal and is_postgres_spec(journal) else None
        hint = continue_hint(
            run_id,
            spec.metadata,
            named or str(journal_path(None if journal is None else Path(journal))),
        )
        for line in open_action_lines(action, run_id, where, hint):
            print(line)
        for line in _render.test_edit_lines(edits, run_row["stop_reason"]):
            print(line)
        if report is not None:
            print()
            print(report.to_markdown())


def stats(journal: ReadJournalOpt = None) -> None:
    """Stop-reason distribution and steps-per-run percentiles across the journal's runs, and
    per stop reason the percentiles of tokens, cost and active seconds per run.

    Example: polyloop stats --journal polyloop.db
    """

    async def go() -> list[dict[str, Any]]:
        async with open_reader(journal) as j:
            return await j.journal.list_runs()

    _render.stats(call(go))


def export(
    journal: ReadJournalOpt = None,
    fmt: Annotated[
        Literal["jsonl", "parquet", "chat", "chat-parquet"],
        typer.Option(
            "--format",
            help="jsonl, or parquet (needs pip install 'polyloop[parquet]'). chat (JSON Lines) "
            "or chat-parquet: one record per run instead of one per step, its messages in the "
            "OpenAI chat shape.",
        ),
    ] = "jsonl",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File to write (default: stdout).")
    ] = None,
    redact: Annotated[
        bool,
        typer.Option("--redact", help="Strip prompts, observations and argument values."),
    ] = False,
) -> None:
    """Export every step of every run (one record per step, with its run's fields and
    totals, and the tokens and cost of the step's model calls; same fields in both formats),
    or with --format chat / chat-parquet every run as a conversation for training (one
    record per run, written as each run is read).

    Example: polyloop export --format jsonl -o steps.jsonl
    """
    if fmt in ("parquet", "chat-parquet") and output is None:
        raise fail(f"{fmt} needs an output file: -o {fmt.replace('-', '.')}")
    if fmt in ("chat", "chat-parquet"):
        _export_chat(journal, output, redact, parquet=fmt == "chat-parquet")
        return

    if fmt == "parquet":
        _needs_pyarrow("parquet export")
    from polyloop.observe.chat_export import listed_runs

    async def go() -> int:
        async with open_reader(journal) as j:

            async def rows() -> AsyncIterator[dict[str, Any]]:
                async for run_row in listed_runs(j.journal):
                    run_id = run_row["run_id"]
                    usage = await j.journal.step_usage(run_id)
                    for step in await j.journal.steps(run_id):
                        yield _render.export_row(
                            run_row, step, usage.get(step.step_idx), redact=redact
                        )

            with _written(output, binary=fmt == "parquet") as out:
                return await _render.write_export(rows(), fmt, out)

    n = call(go)
    if output is not None:
        print(f"wrote {n} steps to {output}", file=sys.stderr)


def _needs_pyarrow(what: str) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise fail(f"{what} needs pyarrow: pip install 'polyloop[parquet]'") from None


def _export_chat(journal: str | None, output: Path | None, redact: bool, *, parquet: bool) -> None:
    """``export --format chat``/``chat-parquet``: each run's record written as it is read."""
    import json

    from polyloop.observe.chat_export import chat_records

    if parquet:
        _needs_pyarrow("chat-parquet export")

    async def go() -> int:
        async with open_reader(journal) as j:
            records = chat_records(j.journal, redact=redact)
            with _written(output, binary=parquet) as out:
                if parquet:
                    from polyloop.observe.chat_parquet import write_chat_parquet

                    return await write_chat_parquet(records, out)
                n = 0
                async for record in records:
                    out.write(json.dumps(record, ensure_ascii=False) + "\n")
                    n += 1
                return n

    n = call(go)
    if output is not None:
        print(f"wrote {n} runs to {output}", file=sys.stderr)


@contextlib.contextmanager
def _written(output: Path | None, *, binary: bool) -> Iterator[IO[Any]]:
    """The file to export to (stdout when None), closed after; a file that cannot be opened
    is one line of bad input."""
    if output is None:
        yield sys.stdout
        return
    try:
        out = output.open("wb") if binary else output.open("w", encoding="utf-8")
    except OSError as exc:
        why = exc.strerror or exc
        raise BadInput(
            f"cannot write {output}: {why}; give -o a file in a writable folder"
        ) from None
    with out:
        yield out


def view(
    journal: JournalOpt = None,
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on (0: any free one).")
    ] = 8765,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (keep 127.0.0.1: runs hold content).")
    ] = "127.0.0.1",
) -> None:
    """Browse the journal's runs in a local web viewer: runs list, step timelines, stats.

    Example: polyloop view --journal polyloop.db --port 8765
    """
    from ._setup import journal_path
    from .view import serve

    if not 0 <= port <= 65535:
        raise fail(f"--port takes 0 to 65535, got {port}")
    path = journal_path(journal)
    if not path.is_file():
        raise fail(no_journal(path))
    try:
        server = serve(path, host=host, port=port)
    except (PolyLoopError, OSError) as exc:
        raise fail(f"cannot serve {path} on {host}:{port}: {exc}") from None
    print(f"viewing {path} at {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def report(
    run_id: Annotated[str, typer.Argument(help="The run to write up.", callback=valid_text)],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="HTML file to write (default: RUN_ID.html)."),
    ] = None,
    journal: JournalOpt = None,
    include_content: Annotated[
        bool,
        typer.Option(
            "--include-content",
            help="Include prompts, model text, arguments and observations (scrubbed of keys, "
            "tokens and emails). Default: lengths and hashes only.",
        ),
    ] = False,
) -> None:
    """Write one run as a self-contained HTML file to share (content withheld by default).

    Example: polyloop report 3f2a… -o run.html
    """
    from polyloop import RunNotFound

    from .view import build_report

    async def go() -> str:
        async with open_journal(journal, read_only=True) as j:
            try:
                return await build_report(j.journal, run_id, include_content=include_content)
            except RunNotFound:
                raise BadInput(f"no run {run_id!r} in {j.path}") from None

    html = call(go)
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    target = output if output is not None else Path(f"{safe_name}.html")
    try:
        target.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write {target}: {exc}") from None
    print(f"wrote {target} ({len(html) // 1024} KiB)", file=sys.stderr)


def check(
    journal: Annotated[
        str | None,
        typer.Option(
            "--journal",
            help=f"SQLite journal file (default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
        ),
    ] = None,
) -> None:
    """Check that a SQLite journal file is sound: SQLite's full integrity_check, then every
    run's records and steps read as show and resume read them; read-only (nothing is written
    or repaired; it reads the whole file: about a minute per GB).

    Exit codes: 0 sound, 8 damaged (stop using it; recover what SQLite can read with
    `sqlite3 PATH .recover | sqlite3 recovered.db`, or restore a copy; the runs it names
    cannot be read, the others can), 1 bad input (no such file, not a PolyLoop journal, a
    PostgreSQL URI).

    Example: polyloop check --journal polyloop.db
    """
    from polyloop.batch._journals import is_postgres_spec

    from ._check import check_file
    from ._setup import journal_path

    if journal is not None and is_postgres_spec(journal):
        raise fail(
            "polyloop check reads SQLite journal files; a PostgreSQL journal is checked by the "
            "server's own tools (e.g. pg_amcheck)"
        )
    path = journal_path(None if journal is None else Path(journal))
    if not path.is_file():
        raise fail(no_journal(path))
    try:
        raise typer.Exit(check_file(path))
    except PolyLoopError as exc:
        raise fail(str(exc)) from None
