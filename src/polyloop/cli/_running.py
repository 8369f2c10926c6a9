"""Running: ``polyloop run``, ``resume``, ``demo`` and ``tools`` (one run in this process,
journaled; Ctrl-C detaches it, twice cancels it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from polyloop import ApprovalRequired, Limits, Loop, PolyLoopError, RunDetached, RunResult

from . import _render
from ._common import EXIT_INTERRUPTED, JournalOpt, call, fail
from ._errors import valid_text
from ._exit import ExitCode, exit_code
from ._options import (
    MaxCostOpt,
    MaxSecondsOpt,
    MaxTokensOpt,
    McpHeaderOpt,
    McpOpt,
    ModelOpt,
    RunOptions,
    run_options,
)
from ._setup import (
    BadInput,
    add_mcp_tools,
    build_loop,
    finite,
    loop_parts,
    mcp_config,
    mcp_server,
    mcp_store,
    model_overrides,
    open_journal,
)


def demo(
    real: Annotated[
        bool,
        typer.Option(
            "--real",
            help="Instead, one short run with a real local model (Gemma 3 270M behind "
            "llama.cpp's server), offline; install it with bash .ci/real_model.sh.",
        ),
    ] = False,
) -> None:
    """Run the offline demo: a scripted model fixes a bug through the real tools, then a run
    is killed mid-step and resumed from its journal. No network, no API key.

    With --real: a short run with a real local model instead; the exit code follows its stop
    reason, and a missing model is one line saying how to install it (exit 1).

    Example: polyloop demo
    """
    if real:
        from ..testing.real_model import RealModelMissing, locate
        from .demo_real import run_real_demo

        try:
            model = locate()
        except RealModelMissing as exc:
            raise fail(f"demo --real: {exc}") from None
        try:
            result = run_real_demo(model, call)
        except RuntimeError as exc:  # the server did not start: its log is named
            raise fail(f"demo --real: {exc}") from None
        raise typer.Exit(exit_code(result.stop_reason))
    from .demo import run_demo

    raise typer.Exit(asyncio.run(run_demo()))


@run_options
def run(
    goal: Annotated[str, typer.Argument(help="What the run is for.")],
    model: ModelOpt,
    options: RunOptions,
    run_id: Annotated[
        str | None,
        typer.Option(
            "--run-id", help="The new run's id (default: random); an id in use is refused."
        ),
    ] = None,
    journal: JournalOpt = None,
) -> None:
    """Run an agent on GOAL with the general workspace tools, journaled for resume.

    The first Ctrl-C detaches the run (it stays resumable); a second one cancels it.
    With --mcp, the tools of MCP servers join the workspace tools (replay policies from the
    servers' annotations: polyloop tools --mcp ... lists them); the servers are stored with
    the run, and polyloop resume connects to them again. --mcp-include or --mcp-exclude
    choose among their tools; a tool whose name model APIs refuse is skipped, with one line
    on stderr saying so. Images and binary resources their tools return are saved beside
    the journal, in JOURNAL.mcp-files; an answer longer than 20,000 characters is cut (its
    first and last halves kept).

    --ask, --forbid and --allow (or --policy FILE) are rules for the shell tool's commands,
    --ask-mcp makes MCP tools ask first: a run whose next action needs a person parks, prints
    the polyloop pending/approve/deny commands and exits 5; after the decision, polyloop
    resume executes or refuses the action and goes on, under the rules stored with the run.

    The failure guard is on: a failing test run whose first failure has come back
    --same-failure-limit times (2 by default) ends the run repeated_failure (exit 5) with an
    escalation report (polyloop show). Failures known before the run never count, nor does a
    test failing before the first edit while no edit changes it (--no-baseline counts it),
    nor, with --mcp, an MCP tool's error (the model reads it and can call again).

    Example: polyloop run "make the tests pass" --model openai:gpt-4o-mini --workspace .
    """
    try:
        config = options.config(model)
        metadata = options.user_metadata()
    except (BadInput, PolyLoopError) as exc:
        raise fail(str(exc)) from None
    if config.get("mcp"):
        from ._setup import journal_path as resolve

        config["mcp_store"] = mcp_store(str(resolve(journal)))
    drive(journal, config, goal=goal, run_id=run_id, metadata=metadata)


def resume(
    run_id: Annotated[str, typer.Argument(help="The run to continue.", callback=valid_text)],
    journal: JournalOpt = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Override the stored step budget.")
    ] = None,
    max_tokens: MaxTokensOpt = None,
    max_cost: MaxCostOpt = None,
    max_seconds: MaxSecondsOpt = None,
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="Send the model calls to this OpenAI-compatible server instead of the one "
            "the run was started with (this execution only).",
        ),
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            parser=finite,
            help="Seconds one model call may take, instead of the run's (this execution only).",
        ),
    ] = None,
) -> None:
    """Continue a run from its journal, with the model and tools it was started with.
    An ended run is shown as it ended, with no model or tool call.

    --base-url and --timeout apply to this execution only: the run keeps the options it was
    started with, and a later resume without them uses those again. --max-steps, --max-tokens,
    --max-cost and --max-seconds are journaled with the run (they stand for later resumes too).

    Example: polyloop resume 3f2a… --journal polyloop.db --base-url http://127.0.0.1:8000/v1
    """
    try:
        overrides = model_overrides(base_url=base_url, timeout_s=timeout)
    except BadInput as exc:
        raise fail(str(exc)) from None
    limits = {
        "max_steps": max_steps,
        "max_tokens": max_tokens,
        "max_cost": max_cost,
        "max_seconds": max_seconds,
    }
    drive(journal, None, run_id=run_id, limit_overrides=limits, overrides=overrides)


def tools(
    mcp: McpOpt = None,
    mcp_header: McpHeaderOpt = None,
    workspace: Annotated[
        Path, typer.Option("--workspace", help="Folder the stdio servers start in.")
    ] = Path("."),
) -> None:
    """List the tools MCP servers offer, with the replay policy PolyLoop derives from each
    tool's annotations (idempotent: readOnlyHint or idempotentHint is true; never: anything
    else) and the hints it read. Each server is started or connected to, listed, and stopped.

    Example: polyloop tools --mcp 'python -m mcp_server_time'
    """
    try:
        config = mcp_config(mcp or [], prefix=False, headers=mcp_header or [])
    except BadInput as exc:
        raise fail(str(exc)) from None
    if not config:
        raise fail("polyloop tools lists the tools of MCP servers: pass --mcp SERVER")
    if not workspace.is_dir():
        raise fail(f"the workspace {workspace} does not exist or is not a folder")

    async def go() -> list[tuple[str, str, tuple[Any, ...]]]:
        listed = []
        for spec in config["mcp"]:
            if sys.stderr.isatty():  # a server can take seconds to start: say which
                print(f"listing the tools of {spec} …", file=sys.stderr, flush=True)
            async with mcp_server(spec, config, cwd=workspace.resolve()) as server:
                name = server.server_name or ""
                listed.append((spec, name, await server.list_tools()))
        return listed

    for spec, name, offered in call(go):
        print(f"{spec}  ({name}, {len(offered)} tools)")
        width = max((len(t.name) for t in offered), default=0)
        for t in offered:
            print("  " + _render.mcp_tool_line(t, width))


def drive(
    journal_path: Path | None,
    config: dict[str, Any] | None,
    *,
    run_id: str | None,
    goal: str | None = None,
    limit_overrides: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> None:
    """Run or resume one run in this process and exit with its stop reason's code. A new run
    (``config`` given) is stored with ``metadata`` beside the command's own ``cli`` key."""
    printer = _render.Progress()
    rid = run_id or new_run_id()
    parts: tuple[Any, Any] | None = None

    async def go() -> RunResult:
        limits: Limits | None
        async with (
            open_journal(journal_path, must_exist=config is None) as journal,
            contextlib.AsyncExitStack() as servers,  # MCP servers: stopped when the run ends
        ):
            if config is not None and parts is not None:
                model, tools = parts
                await add_mcp_tools(servers, tools, config, Path(config["workspace"]), new_run=True)
                loop = Loop(model, tools=tools, journal=journal.journal, observers=[printer])
                cfg, limits = config, Limits.from_dict(config["limits"])
            else:
                loop, cfg, limits = await build_loop(
                    journal,
                    None,
                    rid,
                    printer,
                    limit_overrides=limit_overrides,
                    overrides=overrides,
                    servers=servers,
                )
            printer.header(rid, journal.path, cfg)
            if overrides:
                flags = {"base_url": "--base-url", "timeout_s": "--timeout"}
                shown = " ".join(f"{flags[k]} {v}" for k, v in overrides.items())
                printer.line(f"for this execution only: {shown}")
            if goal is not None:
                task = asyncio.ensure_future(
                    loop.run(
                        goal, run_id=rid, metadata={**(metadata or {}), "cli": cfg}, limits=limits
                    )
                )
            else:
                task = asyncio.ensure_future(loop.resume(rid, limits=limits))
            on_ctrl_c(loop, rid, task, printer)
            return await task

    try:
        if config is not None:  # a new run: what can fail is checked before the journal is made
            try:
                parts = loop_parts(config)
            except BadInput as exc:
                raise fail(str(exc)) from None
        try:
            result = call(go)
        finally:
            printer.close()  # the live line, before any last line
    except ApprovalRequired as exc:  # parked until a person decides
        printer.parked(exc, journal_path)
        raise typer.Exit(ExitCode.NEEDS_HUMAN) from None
    except RunDetached as exc:
        printer.detached(exc.run_id, journal_path)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        line, code = after_interrupt(journal_path, rid)
        printer.line(line)
        raise typer.Exit(code) from None
    printer.result(result)
    raise typer.Exit(exit_code(result.stop_reason))


def after_interrupt(journal_path: Path | None, run_id: str) -> tuple[str, int]:
    """What is true after Ctrl-C ended the command, and its exit code, from what the journal
    holds: the interrupt may have come before the run was created (or before the signal
    handler was installed), and a cancellation's end record may or may not have been written
    (its write has a timeout)."""
    from ._setup import journal_path as resolve

    async def read() -> list[dict[str, Any]]:
        async with open_journal(journal_path, must_exist=True) as j:
            return await j.journal.list_runs(run_id=run_id)

    interrupted = int(EXIT_INTERRUPTED)
    rows: list[dict[str, Any]] = []
    if resolve(journal_path).is_file():
        try:
            rows = asyncio.run(read())
        except (BadInput, PolyLoopError, OSError) as exc:
            return f"interrupted: cannot read the journal to tell what it holds: {exc}", interrupted
    if not rows:
        return f"interrupted before run {run_id} was created: nothing was written", interrupted
    if rows[0]["status"] == "ended":
        reason = rows[0]["stop_reason"]
        return f"{reason}: the journal's end record says {reason}", exit_code(reason)
    where = f" --journal {journal_path}" if journal_path else ""
    resume = f"polyloop resume {run_id}{where}"
    return f"interrupted: run {run_id} has no end record; it stays resumable: {resume}", interrupted


def new_run_id() -> str:
    return os.urandom(8).hex()


def on_ctrl_c(loop: Any, run_id: str, task: asyncio.Future[Any], printer: Any) -> None:
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
