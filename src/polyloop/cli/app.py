"""The ``polyloop`` command: each command parses, makes one library call, and renders.

Exit codes (documented in the README):

====  =====================================================================================
0     ``task_completed``, ``agent_finished``
3     a budget stop: ``step_budget``, ``action_budget``, ``context_overflow``
4     an error stop: ``llm_error``, ``env_error``, ``parse_failed_repeatedly``
5     needs a human, do not retry: ``resume_state_unknown`` (and ``repeated_failure``)
6     a stop reason this version does not know
130   cancelled or detached (Ctrl-C)
1     bad input (one line on stderr, never a traceback)
====  =====================================================================================
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from polyloop import EscalationReport, PolyLoopError, RunDetached, RunResult
from polyloop.types import RunEnd

from . import _render
from ._setup import DEFAULT_JOURNAL, JOURNAL_ENV, BadInput, build_loop, open_journal, run_config

T = TypeVar("T")

app = typer.Typer(
    name="polyloop",
    help="Run, resume and inspect agent runs. New here? Run: polyloop demo",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_BY_REASON = {
    "task_completed": 0,
    "agent_finished": 0,
    "step_budget": 3,
    "action_budget": 3,
    "context_overflow": 3,
    "llm_error": 4,
    "env_error": 4,
    "parse_failed_repeatedly": 4,
    "resume_state_unknown": 5,
    "repeated_failure": 5,
    "cancelled": 130,
}
EXIT_UNKNOWN_REASON = 6
EXIT_INTERRUPTED = 130
EXIT_BAD_INPUT = 1

JournalOpt = Annotated[
    Path | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file (default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]


def exit_code(stop_reason: str) -> int:
    """The process exit code for a stop reason."""
    return EXIT_BY_REASON.get(str(stop_reason), EXIT_UNKNOWN_REASON)


def _fail(message: str) -> typer.Exit:
    print(f"polyloop: {message}", file=sys.stderr)
    return typer.Exit(EXIT_BAD_INPUT)


def _call(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a library call; library errors become one line on stderr and exit code 1."""
    try:
        return asyncio.run(fn())
    except RunDetached:
        raise  # not an error: _drive prints the resume command and exits 130
    except (BadInput, PolyLoopError, OSError) as exc:
        raise _fail(str(exc)) from None


@app.callback()
def _root() -> None:
    """Run, resume and inspect agent runs."""


@app.command()
def demo() -> None:
    """Run the offline demo: a scripted model fixes a bug through the real tools, then a run
    is killed mid-step and resumed from its journal. No network, no API key.

    Example: polyloop demo
    """
    from .demo import run_demo

    raise typer.Exit(asyncio.run(run_demo()))


@app.command()
def run(
    goal: Annotated[str, typer.Argument(help="What the run is for.")],
    model: Annotated[
        str, typer.Option("--model", help="Model as provider:name, e.g. openai:gpt-4o-mini.")
    ],
    workspace: Annotated[
        Path, typer.Option("--workspace", help="Folder the tools work in (must exist).")
    ] = Path("."),
    tools: Annotated[
        str, typer.Option("--tools", help="Comma-separated tool sets: files, shell.")
    ] = "files,shell",
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="OpenAI-compatible server URL.")
    ] = None,
    max_steps: Annotated[int, typer.Option("--max-steps")] = 30,
    max_actions: Annotated[int | None, typer.Option("--max-actions")] = None,
    max_prompt_chars: Annotated[int | None, typer.Option("--max-prompt-chars")] = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    journal: JournalOpt = None,
) -> None:
    """Run an agent on GOAL with the general workspace tools, journaled for resume.

    The first Ctrl-C detaches the run (it stays resumable); a second one cancels it.

    Example: polyloop run "make the tests pass" --model openai:gpt-4o-mini --workspace .
    """
    try:
        config = run_config(
            model=model,
            base_url=base_url,
            workspace=workspace,
            tools=tools,
            max_steps=max_steps,
            max_actions=max_actions,
            max_prompt_chars=max_prompt_chars,
        )
    except (BadInput, PolyLoopError) as exc:
        raise _fail(str(exc)) from None
    _drive(journal, config, goal=goal, run_id=run_id)


@app.command()
def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.")],
    journal: JournalOpt = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Override the stored step budget.")
    ] = None,
) -> None:
    """Continue a run from its journal, with the model and tools it was started with.
    An ended run is shown as it ended, with no model or tool call.

    Example: polyloop resume 3f2a… --journal polyloop.db
    """
    _drive(journal, None, run_id=run_id, max_steps=max_steps)


def _drive(
    journal_path: Path | None,
    config: dict[str, Any] | None,
    *,
    run_id: str | None,
    goal: str | None = None,
    max_steps: int | None = None,
) -> None:
    printer = _render.Progress()

    async def go() -> RunResult:
        async with open_journal(journal_path, must_exist=config is None) as journal:
            loop, cfg, limits = await build_loop(
                journal, config, run_id, printer, max_steps=max_steps
            )
            rid = run_id or _new_run_id()
            printer.header(rid, journal.path, cfg)
            if goal is not None:
                task = asyncio.ensure_future(
                    loop.run(goal, run_id=rid, metadata={"cli": cfg}, limits=limits)
                )
            else:
                task = asyncio.ensure_future(loop.resume(rid, limits=limits))
            _on_ctrl_c(loop, rid, task, printer)
            return await task

    try:
        result = _call(go)
    except RunDetached as exc:
        printer.detached(exc.run_id, journal_path)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        printer.line("cancelled: the journal's end record says cancelled")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    printer.result(result)
    raise typer.Exit(exit_code(result.stop_reason))


def _new_run_id() -> str:
    return os.urandom(8).hex()


def _on_ctrl_c(loop: Any, run_id: str, task: asyncio.Future[Any], printer: Any) -> None:
    presses = 0

    def handler() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            loop.detach(run_id)
            printer.line("Ctrl-C: detaching at the end of this step (Ctrl-C again to cancel)")
        else:
            task.cancel()

    # Not the main thread, or no signal support here: Ctrl-C then simply interrupts.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGINT, handler)


@app.command()
def runs(
    journal: JournalOpt = None,
    stop_reason: Annotated[
        str | None, typer.Option("--stop-reason", help="Only runs that stopped for this.")
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only runs created on/after YYYY-MM-DD.")
    ] = None,
) -> None:
    """List the runs in a journal, oldest first.

    Example: polyloop runs --stop-reason step_budget --since 2026-11-01
    """

    async def go() -> list[dict[str, Any]]:
        async with open_journal(journal, must_exist=True) as j:
            return await j.journal.list_runs()

    try:
        rows = _render.filter_runs(_call(go), stop_reason=stop_reason, since=since)
    except BadInput as exc:
        raise _fail(str(exc)) from None
    _render.runs_table(rows)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.")],
    journal: JournalOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Full step records as JSON.")] = False,
) -> None:
    """Show a run's steps as a table (or, with --json, its full records).

    Example: polyloop show 3f2a… --json
    """

    async def go() -> tuple[dict[str, Any], list[Any], EscalationReport | None]:
        async with open_journal(journal, must_exist=True) as j:
            rows = [r for r in await j.journal.list_runs() if r["run_id"] == run_id]
            if not rows:
                raise BadInput(f"no run {run_id!r} in {j.path}")
            _, records = await j.journal.read(run_id)
            end = records[-1] if records and isinstance(records[-1], RunEnd) else None
            return rows[0], await j.journal.steps(run_id), end.report if end else None

    run_row, steps, report = _call(go)
    if as_json:
        _render.show_json(run_row, steps, report)
    else:
        _render.show_table(run_row, steps)
        if report is not None:
            print()
            print(report.to_markdown())


@app.command()
def stats(journal: JournalOpt = None) -> None:
    """Stop-reason distribution and steps-per-run percentiles across the journal's runs.

    Example: polyloop stats --journal polyloop.db
    """

    async def go() -> list[dict[str, Any]]:
        async with open_journal(journal, must_exist=True) as j:
            return await j.journal.list_runs()

    _render.stats(_call(go))


@app.command()
def export(
    journal: JournalOpt = None,
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File to write (default: stdout).")
    ] = None,
    redact: Annotated[
        bool,
        typer.Option("--redact", help="Strip prompts, observations and argument values."),
    ] = False,
) -> None:
    """Export every step of every run (one record per step, with its run's fields).

    Example: polyloop export --format jsonl -o steps.jsonl
    """
    if fmt not in ("jsonl", "parquet"):
        raise _fail(f"unknown format {fmt!r}: use jsonl or parquet")
    if fmt == "parquet" and output is None:
        raise _fail("parquet needs an output file: -o steps.parquet")

    async def go() -> list[dict[str, Any]]:
        async with open_journal(journal, must_exist=True) as j:
            rows = []
            for run_row in await j.journal.list_runs():
                for step in await j.journal.steps(run_row["run_id"]):
                    rows.append(_render.export_row(run_row, step, redact=redact))
            return rows

    rows = _call(go)
    try:
        _render.write_export(rows, fmt, output)
    except (BadInput, OSError) as exc:
        raise _fail(str(exc)) from None


@app.command()
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
        raise _fail(f"--port takes 0 to 65535, got {port}")
    path = journal_path(journal)
    if not path.is_file():
        raise _fail(f"no journal at {path} (pass --journal PATH or set ${JOURNAL_ENV})")
    try:
        server = serve(path, host=host, port=port)
    except (PolyLoopError, OSError) as exc:
        raise _fail(f"cannot serve {path} on {host}:{port}: {exc}") from None
    print(f"viewing {path} at {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="The run to write up.")],
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
        async with open_journal(journal, must_exist=True) as j:
            try:
                return await build_report(j.journal, run_id, include_content=include_content)
            except RunNotFound:
                raise BadInput(f"no run {run_id!r} in {j.path}") from None

    html = _call(go)
    target = output if output is not None else Path(f"{run_id}.html")
    try:
        target.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot write {target}: {exc}") from None
    print(f"wrote {target} ({len(html) // 1024} KiB)", file=sys.stderr)
