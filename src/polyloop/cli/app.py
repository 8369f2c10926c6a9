"""The ``polyloop`` command: each command parses, makes one library call, and renders.

Exit codes: the table in :mod:`._exit` (``polyloop --help`` and the README list it). Help
texts are plain text, never Rich markup, so ``pip install 'polyloop[ray]'`` shows as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from typer.core import TyperGroup

from polyloop import (
    ApprovalRequired,
    EscalationReport,
    Limits,
    Loop,
    PolyLoopError,
    RunDetached,
    RunResult,
    StopReason,
)
from polyloop.types import RunEnd, TestEdit

from . import _render
from ._errors import end, valid_text
from ._exit import ExitCode, epilog, exit_code
from ._setup import (
    DEFAULT_JOURNAL,
    JOURNAL_ENV,
    BadInput,
    FailureGuardArgs,
    add_mcp_tools,
    build_loop,
    finite,
    loop_parts,
    mcp_config,
    mcp_server,
    model_overrides,
    open_journal,
    run_config,
)

T = TypeVar("T")


class _Group(TyperGroup):
    """The root command. Every error ends as one line on stderr and an exit code
    (:func:`._errors.end`); ``polyloop`` alone prints the help."""

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        code = end(
            lambda: super(_Group, self).main(
                args, prog_name, complete_var, standalone_mode=False, **extra
            )
        )
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="polyloop",
    help="Run, resume and inspect agent runs. New here? Run: polyloop demo",
    epilog=epilog(),
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: "[ray]" is text, not a Rich style
)

EXIT_UNKNOWN_REASON = ExitCode.UNKNOWN_REASON
EXIT_INTERRUPTED = ExitCode.INTERRUPTED
EXIT_BAD_INPUT = ExitCode.BAD_INPUT

JournalOpt = Annotated[
    Path | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file (default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]


# Options shared by the commands that start runs (run, batch).
ModelOpt = Annotated[
    str, typer.Option("--model", help="Model as provider:name, e.g. openai:gpt-4o-mini.")
]
WorkspaceOpt = Annotated[
    Path, typer.Option("--workspace", help="Folder the tools work in (must exist).")
]
ToolsOpt = Annotated[str, typer.Option("--tools", help="Comma-separated tool sets: files, shell.")]
BaseUrlOpt = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible server URL.")]
MaxStepsOpt = Annotated[int, typer.Option("--max-steps")]
MaxActionsOpt = Annotated[int | None, typer.Option("--max-actions")]
MaxPromptCharsOpt = Annotated[int | None, typer.Option("--max-prompt-chars")]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", help="Input + output tokens the run may use (token_budget)."),
]
MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        "--max-cost",
        parser=finite,
        help="US dollars the run may spend (cost_budget; priced from the provider's reported "
        "cost, else counted 0 and reported as usage missing).",
    ),
]
MaxSecondsOpt = Annotated[
    float | None,
    typer.Option(
        "--max-seconds", help="Seconds the run may be active (time_budget).", parser=finite
    ),
]
TimeoutOpt = Annotated[
    float | None,
    typer.Option(
        "--timeout",
        parser=finite,
        help="Seconds one model call may take (its request timeout; default: the OpenAI "
        "adapter's, 120). Stored with the run.",
    ),
]


McpOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mcp",
        help="An MCP server whose tools join the run: a command line (started in the "
        "workspace, stopped at the end) or an http(s):// URL (Streamable HTTP). Repeatable.",
    ),
]
McpPrefixOpt = Annotated[
    bool,
    typer.Option(
        "--mcp-prefix",
        help="Name each MCP tool SERVER_TOOL, SERVER being the server's own name (for tools "
        "whose names clash).",
    ),
]
McpHeaderOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mcp-header",
        help="'Name: value' sent to the HTTP MCP servers; ${VAR} in the value is read from the "
        "environment when connecting (stored as written, so keep secrets in variables). "
        "Repeatable.",
    ),
]


McpIncludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mcp-include",
        metavar="NAME,...",
        help="Register only these tools of the MCP servers (their own names, before "
        "--mcp-prefix). Stored with the run.",
    ),
]
McpExcludeOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--mcp-exclude",
        metavar="NAME,...",
        help="Register every tool of the MCP servers but these (their own names). Stored with "
        "the run.",
    ),
]


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
            raise _fail(f"demo --real: {exc}") from None
        try:
            result = run_real_demo(model, _call)
        except RuntimeError as exc:  # the server did not start: its log is named
            raise _fail(f"demo --real: {exc}") from None
        raise typer.Exit(exit_code(result.stop_reason))
    from .demo import run_demo

    raise typer.Exit(asyncio.run(run_demo()))


@app.command()
def run(
    goal: Annotated[str, typer.Argument(help="What the run is for.")],
    model: ModelOpt,
    workspace: WorkspaceOpt = Path("."),
    tools: ToolsOpt = "files,shell",
    base_url: BaseUrlOpt = None,
    max_steps: MaxStepsOpt = 30,
    max_actions: MaxActionsOpt = None,
    max_prompt_chars: MaxPromptCharsOpt = None,
    max_tokens: MaxTokensOpt = None,
    max_cost: MaxCostOpt = None,
    max_seconds: MaxSecondsOpt = None,
    timeout: TimeoutOpt = None,
    run_id: Annotated[str | None, typer.Option("--run-id")] = None,
    journal: JournalOpt = None,
    mcp: McpOpt = None,
    mcp_prefix: McpPrefixOpt = False,
    mcp_header: McpHeaderOpt = None,
    mcp_include: McpIncludeOpt = None,
    mcp_exclude: McpExcludeOpt = None,
    same_failure_limit: Annotated[
        int,
        typer.Option(
            "--same-failure-limit",
            help="Stop repeated_failure when one failure comes back this many times (0: off).",
        ),
    ] = 2,
    no_progress_rounds: Annotated[
        int,
        typer.Option(
            "--no-progress-rounds",
            help="Stop after this many rounds without fewer failing tests (0: off).",
        ),
    ] = 0,
    spreading_rounds: Annotated[
        int,
        typer.Option(
            "--spreading-rounds",
            help="Stop after this many rounds that each changed a new file (0: off).",
        ),
    ] = 0,
    known_failure: Annotated[
        list[str] | None,
        typer.Option(
            "--known-failure",
            metavar="CHECK",
            help="A test failing before the run, unrelated to GOAL (repeatable): never counted.",
        ),
    ] = None,
    baseline: Annotated[
        bool,
        typer.Option(
            "--baseline",
            help="Take the failures of the test runs before the first edit as known.",
        ),
    ] = False,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Stream each reply from the provider and print its text as it arrives "
            "(the journal still holds each whole reply). Stored with the run.",
        ),
    ] = False,
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

    The failure guard is on: a failing test run whose first failure has come back
    --same-failure-limit times (2 by default) ends the run repeated_failure (exit 5) with an
    escalation report (polyloop show). Failures known before the run never count.

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
            timeout_s=timeout,
            budgets={"max_tokens": max_tokens, "max_cost": max_cost, "max_seconds": max_seconds},
            guard=FailureGuardArgs(
                same_failure_limit,
                no_progress_rounds,
                spreading_rounds,
                tuple(known_failure or ()),
                baseline,
            ),
            stream=stream,
        )
        servers = mcp_config(
            mcp or [],
            prefix=mcp_prefix,
            headers=mcp_header or [],
            include=mcp_include or [],
            exclude=mcp_exclude or [],
        )
    except (BadInput, PolyLoopError) as exc:
        raise _fail(str(exc)) from None
    if servers:
        from ._setup import journal_path as resolve

        servers["mcp_store"] = str(resolve(journal).resolve()) + ".mcp-files"
        config.update(servers)
    _drive(journal, config, goal=goal, run_id=run_id)


@app.command()
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
        raise _fail(str(exc)) from None
    limits = {
        "max_steps": max_steps,
        "max_tokens": max_tokens,
        "max_cost": max_cost,
        "max_seconds": max_seconds,
    }
    _drive(journal, None, run_id=run_id, limit_overrides=limits, overrides=overrides)


@app.command()
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
        raise _fail(str(exc)) from None
    if not config:
        raise _fail("polyloop tools lists the tools of MCP servers: pass --mcp SERVER")
    if not workspace.is_dir():
        raise _fail(f"the workspace {workspace} does not exist or is not a folder")

    async def go() -> list[tuple[str, str, tuple[Any, ...]]]:
        listed = []
        for spec in config["mcp"]:
            async with mcp_server(spec, config, cwd=workspace.resolve()) as server:
                name = server.server_name or ""
                listed.append((spec, name, await server.list_tools()))
        return listed

    for spec, name, offered in _call(go):
        print(f"{spec}  ({name}, {len(offered)} tools)")
        width = max((len(t.name) for t in offered), default=0)
        for t in offered:
            print("  " + _render.mcp_tool_line(t, width))


def _drive(
    journal_path: Path | None,
    config: dict[str, Any] | None,
    *,
    run_id: str | None,
    goal: str | None = None,
    limit_overrides: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
) -> None:
    printer = _render.Progress()
    rid = run_id or _new_run_id()
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
                    loop.run(goal, run_id=rid, metadata={"cli": cfg}, limits=limits)
                )
            else:
                task = asyncio.ensure_future(loop.resume(rid, limits=limits))
            _on_ctrl_c(loop, rid, task, printer)
            return await task

    try:
        if config is not None:  # a new run: what can fail is checked before the journal is made
            try:
                parts = loop_parts(config)
            except BadInput as exc:
                raise _fail(str(exc)) from None
        result = _call(go)
    except ApprovalRequired as exc:  # parked until a person decides
        printer.parked(exc, journal_path)
        raise typer.Exit(ExitCode.NEEDS_HUMAN) from None
    except RunDetached as exc:
        printer.detached(exc.run_id, journal_path)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        line, code = _after_interrupt(journal_path, rid)
        printer.line(line)
        raise typer.Exit(code) from None
    printer.result(result)
    raise typer.Exit(exit_code(result.stop_reason))


def _after_interrupt(journal_path: Path | None, run_id: str) -> tuple[str, int]:
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


# -- ending a run from anywhere: `polyloop stop` and `polyloop cancel` ----------------------

RequestJournalOpt = Annotated[
    str | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file, or a postgresql:// URI (needs pip install "
        f"'polyloop[postgres]'; default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]
ByOpt = Annotated[
    str | None,
    typer.Option("--by", help="Who asks, stored as requested_by (default: user@host pid N)."),
]


class _NoModel:
    """The model of the Loop that ``stop`` and ``cancel`` use: ending a run calls none."""

    name = "none"

    async def complete(self, request: Any) -> Any:
        raise RuntimeError("polyloop stop and cancel never call a model")


def _on_journal(
    journal: str | None, run_id: str | None, act: Callable[[Loop], Coroutine[Any, Any, T]]
) -> T:
    """``act(loop)`` with a Loop on the journal that calls no model (for the commands that
    only write requests and decisions); library errors, a missing extra and no such run are
    one line and exit code 1."""
    from polyloop import RunNotFound
    from polyloop.batch import open_journal as open_spec

    spec = _journal_spec(journal, must_exist=True)

    async def go() -> T:
        j = open_spec(spec)
        try:
            try:
                return await act(Loop(_NoModel(), journal=j))
            except RunNotFound:
                raise BadInput(f"no run {run_id!r} in {spec}") from None
        finally:
            await j.aclose()

    try:
        return _call(go)
    except (ImportError, ValueError) as exc:  # a missing extra (psycopg), a bad value
        raise _fail(str(exc).splitlines()[0]) from None


def _request(
    journal: str | None, run_id: str, kind: str, reason: str | None, by: str | None
) -> None:
    """Store a request to end ``run_id`` and print what it did, in one line (exit 0 whatever
    it did; 1 for no such run or a journal that cannot be written)."""

    async def act(loop: Loop) -> Any:
        if kind == "stop":
            assert reason is not None
            return await loop.stop(run_id, reason, by=by)
        return await loop.cancel(run_id, reason=reason, by=by)

    answer = _on_journal(journal, run_id, act)
    print(answer.describe(), flush=True)
    raise typer.Exit(0)


@app.command()
def stop(
    run_id: Annotated[str, typer.Argument(help="The run to stop.", callback=valid_text)],
    reason: Annotated[
        str, typer.Option("--reason", help="Why; it becomes the run's stop_detail (required).")
    ],
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """End a run with stop reason `stopped`, wherever it runs (another process or host).

    The request is written to the journal. A run some process is advancing ends at the step
    boundary after that process's next heartbeat (lease_ttl_s/3, 10 s by default): the step in
    flight finishes and is recorded first. A run nobody is advancing (crashed, detached, never
    started) is ended now. One line says which; an ended run is left as it is. Exit code 0
    whatever happened to the run, 1 for no such run.

    Example: polyloop stop 3f2a… --reason "budget exhausted" --journal polyloop.db
    """
    if not reason.strip():
        raise _fail("stop --reason must not be empty (it becomes the run's stop_detail)")
    _request(journal, run_id, "stop", reason, by)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.", callback=valid_text)],
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why; the start of its stop_detail.")
    ] = None,
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """End a run with stop reason `cancelled`, wherever it runs (another process or host).

    As a local cancellation: the process advancing it cancels it at its next heartbeat, and an
    action in flight gets the cancellation grace to finish (else it is named in stop_detail,
    its outcome unknown). A pending stop is replaced; a run nobody is advancing is ended now.
    One line says what happened; exit code 0 whatever it was, 1 for no such run.

    Example: polyloop cancel 3f2a… --reason "wrong goal" --journal postgresql://host/db
    """
    _request(journal, run_id, "cancel", reason, by)


def _decide(
    journal: str | None, run_id: str, op_id: str, approved: bool, note: str | None, by: str | None
) -> None:
    """Journal a decision and print it in one line (exit 0; 1 when someone decided first,
    nothing awaits a decision, or no such run)."""
    from polyloop import AlreadyDecided

    async def act(loop: Loop) -> Any:
        try:
            if approved:
                return await loop.approve(run_id, op_id, note=note, by=by)
            assert note is not None
            return await loop.deny(run_id, op_id, reason=note, by=by)
        except AlreadyDecided as exc:
            raise BadInput(str(exc)) from None

    decision = _on_journal(journal, run_id, act)
    print(f"run {run_id}: {decision.describe()}; continue it: polyloop resume {run_id}", flush=True)
    raise typer.Exit(0)


@app.command()
def pending(journal: RequestJournalOpt = None) -> None:
    """List the actions awaiting a person's approval (runs parked with status
    `awaiting_approval`), oldest first: run, step, op_id, tool and arguments. Read-only.

    Example: polyloop pending --journal polyloop.db
    """

    async def act(loop: Loop) -> list[dict[str, Any]]:
        return await loop.pending_approvals()

    rows = _on_journal(journal, None, act)
    if not rows:
        print("no action awaits approval", flush=True)
    for row in rows:
        expires = "" if row["expires_at"] is None else f"  expires {_when(row['expires_at'])}"
        print(
            f"{row['run_id']}  step {row['step_idx']}  op_id {row['op_id']}  "
            f"{row['tool_name'] or row['action']} {row['args_json'] or ''}  "
            f"requested {_when(row['requested_at'])}{expires}",
            flush=True,
        )
    raise typer.Exit(0)


@app.command()
def approve(
    run_id: Annotated[str, typer.Argument(help="The parked run.", callback=valid_text)],
    op_id: Annotated[
        str, typer.Argument(help="The op_id of its pending action.", callback=valid_text)
    ],
    note: Annotated[str | None, typer.Option("--note", help="For the record.")] = None,
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """Approve the action a parked run awaits (`polyloop pending` lists them); then
    `polyloop resume RUN_ID` executes it. Exactly one decision per action: exit code 1 and one
    line naming who decided, when someone decided first.

    Example: polyloop approve 3f2a… 9b1c… --by alice --journal polyloop.db
    """
    _decide(journal, run_id, op_id, True, note, by)


@app.command()
def deny(
    run_id: Annotated[str, typer.Argument(help="The parked run.", callback=valid_text)],
    op_id: Annotated[
        str, typer.Argument(help="The op_id of its pending action.", callback=valid_text)
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why; the model is shown it (required).")],
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """Deny the action a parked run awaits: `polyloop resume RUN_ID` records it not executed,
    the model seeing the reason, and the run goes on. Exit code 1 when someone decided first.

    Example: polyloop deny 3f2a… 9b1c… --reason "not to customers" --journal polyloop.db
    """
    if not reason.strip():
        raise _fail("deny --reason must not be empty (the model is shown it)")
    _decide(journal, run_id, op_id, False, reason, by)


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


_STOP_REASON_HELP = "Only runs that stopped for this: " + ", ".join(StopReason) + "."


@app.command()
def runs(
    journal: JournalOpt = None,
    stop_reason: Annotated[
        StopReason | None,
        typer.Option("--stop-reason", metavar="REASON", help=_STOP_REASON_HELP),
    ] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only runs created on/after YYYY-MM-DD.")
    ] = None,
) -> None:
    """List the runs in a journal, oldest first.

    Example: polyloop runs --stop-reason step_budget --since 2026-11-01
    """

    async def go() -> list[dict[str, Any]]:
        async with open_journal(journal, read_only=True) as j:
            return await j.journal.list_runs()

    try:
        rows = _render.filter_runs(_call(go), stop_reason=stop_reason, since=since)
    except BadInput as exc:
        raise _fail(str(exc)) from None
    _render.runs_table(rows)


@app.command()
def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.", callback=valid_text)],
    journal: JournalOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Full step records as JSON.")] = False,
) -> None:
    """Show a run's steps as a table (or, with --json, its full records).

    Example: polyloop show 3f2a… --json
    """

    async def go() -> tuple[dict[str, Any], list[Any], EscalationReport | None, list[TestEdit]]:
        async with open_journal(journal, read_only=True) as j:
            rows = await j.journal.list_runs(run_id=run_id)
            if not rows:
                raise BadInput(f"no run {run_id!r} in {j.path}")
            _, records = await j.journal.read(run_id)
            end = records[-1] if records and isinstance(records[-1], RunEnd) else None
            edits = [r for r in records if isinstance(r, TestEdit)]
            return rows[0], await j.journal.steps(run_id), end.report if end else None, edits

    run_row, steps, report, edits = _call(go)
    if as_json:
        _render.show_json(run_row, steps, report, edits)
    else:
        _render.show_table(run_row, steps)
        for line in _render.test_edit_lines(edits, run_row["stop_reason"]):
            print(line)
        if report is not None:
            print()
            print(report.to_markdown())


@app.command()
def stats(journal: JournalOpt = None) -> None:
    """Stop-reason distribution and steps-per-run percentiles across the journal's runs.

    Example: polyloop stats --journal polyloop.db
    """

    async def go() -> list[dict[str, Any]]:
        async with open_journal(journal, read_only=True) as j:
            return await j.journal.list_runs()

    _render.stats(_call(go))


@app.command()
def export(
    journal: JournalOpt = None,
    fmt: Annotated[
        Literal["jsonl", "parquet"],
        typer.Option("--format", help="jsonl, or parquet (needs pip install 'polyloop[parquet]')."),
    ] = "jsonl",
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
    if fmt == "parquet" and output is None:
        raise _fail("parquet needs an output file: -o steps.parquet")

    async def go() -> list[dict[str, Any]]:
        async with open_journal(journal, read_only=True) as j:
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

    html = _call(go)
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    target = output if output is not None else Path(f"{safe_name}.html")
    try:
        target.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise _fail(f"cannot write {target}: {exc}") from None
    print(f"wrote {target} ({len(html) // 1024} KiB)", file=sys.stderr)


# -- many runs: `polyloop batch` and `polyloop recover` (a caller of polyloop.batch) ----------

EXIT_NOT_ALL_ENDED = ExitCode.NOT_ALL_ENDED

BatchJournalOpt = Annotated[
    str | None,
    typer.Option(
        "--journal",
        help=f"SQLite journal file, or a postgresql:// URI (needs pip install "
        f"'polyloop[postgres]'; default: ${JOURNAL_ENV} or ./{DEFAULT_JOURNAL}).",
    ),
]


def batch_loop(config: dict[str, Any], journal: Any) -> Any:
    """The Loop of a batch started by the command, from its stored config (module-level, so
    Ray workers can import it)."""
    from polyloop import Limits, Loop
    from polyloop.tools.builtin import workspace_tools

    from ._setup import _model

    tools = workspace_tools(Path(config["workspace"]), shell="shell" in config["tools"])
    limits = Limits.from_dict(config["limits"])
    return Loop(_model(config), tools=tools, journal=journal, limits=limits)


def factory_loop(config: dict[str, Any], journal: Any) -> Any:
    """The Loop of a batch started with ``--loop module:function``: that factory's Loop (the
    run's limits are the command's, stored with it; module-level, so Ray workers can import
    it)."""
    from polyloop.batch import resolve_factory

    return resolve_factory(config["loop"])(journal)


def _loop_config(
    loop: str, *, max_steps: int, max_actions: int | None, max_prompt_chars: int | None
) -> dict[str, Any]:
    """The stored config of a batch whose Loop comes from a ``module:function`` factory
    (checked here: a bad path is one line, before anything is written)."""
    from polyloop import Limits
    from polyloop.batch import resolve_factory

    resolve_factory(loop)
    limits = Limits(max_steps=max_steps, max_actions=max_actions, max_prompt_chars=max_prompt_chars)
    return {"loop": loop, "limits": limits.to_dict()}


def _built_loop(loop: Any, journal: Any) -> Any:
    """A Loop factory handing out a Loop already built on that journal."""
    return loop


def _journal_spec(journal: str | None, *, must_exist: bool) -> str:
    from polyloop.batch._journals import is_postgres_spec

    from ._check import refuse_damaged
    from ._setup import journal_path

    if journal is not None and is_postgres_spec(journal):
        return journal
    path = journal_path(None if journal is None else Path(journal))
    if must_exist and not path.is_file():
        raise _fail(f"no journal at {path} (pass --journal PATH or set ${JOURNAL_ENV})")
    refuse_damaged(path)  # the commands that use this one write
    return str(path)


class _BatchProgress:
    """Live progress of a batch: one updating line on a terminal, a line per finished run
    otherwise."""

    def __init__(self) -> None:
        self.live: Any = None
        self.finished = -1

    @staticmethod
    def text(p: Any) -> str:
        reasons = ", ".join(f"{k} {v}" for k, v in p.by_stop_reason.items())
        extra = "".join(
            f"  {name} {n}"
            for name, n in (("leased", p.leased), ("detached", p.detached), ("errors", p.errors))
            if n
        )
        return f"done {p.done}/{p.total}  running {p.running}{extra}" + (
            f"  | {reasons}" if reasons else ""
        )

    def __call__(self, p: Any) -> None:
        if sys.stdout.isatty():
            if self.live is None:
                from rich.live import Live

                self.live = Live(console=_render.console, auto_refresh=False, transient=False)
                self.live.start()
            self.live.update(self.text(p), refresh=True)
        else:
            finished = p.done + p.leased + p.detached + p.errors
            if finished != self.finished:
                self.finished = finished
                print(self.text(p), flush=True)

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


def _drive_batch(go: Callable[[], Coroutine[Any, Any, T]], progress: _BatchProgress) -> T:
    """Run a batch coroutine: the first Ctrl-C detaches the runs in flight (graceful: they stay
    resumable), a second one exits at once (their leases die with this process)."""

    async def main() -> T:
        task = asyncio.ensure_future(go())
        presses = 0

        def handler() -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                progress.close()
                print(
                    "Ctrl-C: detaching the runs in flight at their next step boundary "
                    "(Ctrl-C again to exit at once; every run stays resumable)",
                    flush=True,
                )
                task.cancel()
            else:
                print("Ctrl-C again: exiting now; the runs stay resumable", flush=True)
                os._exit(EXIT_INTERRUPTED)

        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, handler)
        return await task

    try:
        return _call(main)
    except (KeyboardInterrupt, asyncio.CancelledError):
        progress.close()
        print("interrupted: re-run the same command to continue", flush=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (ImportError, ValueError) as exc:  # a missing extra (ray, psycopg), a bad option
        progress.close()
        raise _fail(str(exc).splitlines()[0]) from None
    finally:
        progress.close()


def _print_batch_result(result: Any) -> None:
    print(result.summary(), flush=True)
    left = result.not_ended
    for outcome in left[:10]:
        print(f"  {outcome.run_id}  {outcome.status}: {outcome.detail or ''}", flush=True)
    if len(left) > 10:
        print(f"  … and {len(left) - 10} more", flush=True)


@app.command()
def batch(
    file: Annotated[
        Path, typer.Argument(help='JSONL: one {"goal": ..., "run_id"?, "metadata"?} a line.')
    ],
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model as provider:name, e.g. openai:gpt-4o-mini."),
    ] = None,
    workspace: WorkspaceOpt = Path("."),
    tools: ToolsOpt = "files,shell",
    base_url: BaseUrlOpt = None,
    max_steps: MaxStepsOpt = 30,
    max_actions: MaxActionsOpt = None,
    max_prompt_chars: MaxPromptCharsOpt = None,
    journal: BatchJournalOpt = None,
    loop: Annotated[
        str | None,
        typer.Option(
            "--loop",
            help="Instead of --model/--workspace/--tools: 'package.module:function', a "
            "make_loop(journal) -> Loop importable here and on the Ray workers (stored with "
            "each run, so recover rebuilds it).",
        ),
    ] = None,
    backend: Annotated[
        Literal["local", "ray"],
        typer.Option(
            "--backend", help="local (this process) or ray (pip install 'polyloop[ray]')."
        ),
    ] = "local",
    concurrency: Annotated[int, typer.Option("--concurrency", help="Runs advancing at once.")] = 8,
) -> None:
    """Run one agent run per line of FILE, CONCURRENCY at a time, journaled. Every goal becomes
    a run row first, with an id derived from the file, the line and these options: re-running
    the same command skips the runs that ended and finishes the rest.

    Exit codes: 0 every run ended (whatever its stop reason), 7 some did not (listed; re-run to
    continue), 130 interrupted (runs detached, resumable), 1 bad input, 2 usage error.

    Example: polyloop batch goals.jsonl --model openai:gpt-4o-mini --workspace . --concurrency 16
    """
    from polyloop import Limits
    from polyloop.batch import Goal, GoalFileError, load_goals, run_batch

    if concurrency < 1:
        raise _fail(f"--concurrency must be at least 1, got {concurrency}")
    if (model is None) == (loop is None):
        raise _fail("pass --model (with --workspace, --tools) or --loop module:function")
    try:
        if loop is not None:
            config = _loop_config(
                loop,
                max_steps=max_steps,
                max_actions=max_actions,
                max_prompt_chars=max_prompt_chars,
            )
        else:
            assert model is not None
            config = run_config(
                model=model,
                base_url=base_url,
                workspace=workspace,
                tools=tools,
                max_steps=max_steps,
                max_actions=max_actions,
                max_prompt_chars=max_prompt_chars,
            )
        goals = load_goals(file, reserved=("cli",))
    except GoalFileError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"cannot read {file}: {exc.strerror or exc}") from None
    except (BadInput, PolyLoopError) as exc:
        raise _fail(str(exc)) from None
    # The command's config is stored with each run (and is part of its derived id).
    goals = [
        Goal(
            g.goal, run_id=g.run_id, metadata={**(g.metadata or {}), "cli": config}, source=g.source
        )
        for g in goals
    ]
    spec = _journal_spec(journal, must_exist=False)
    progress = _BatchProgress()
    print(f"batch {file}: {len(goals)} goals  backend {backend}  journal {spec}", flush=True)

    async def go() -> Any:
        import functools

        return await run_batch(
            spec,
            goals,
            functools.partial(factory_loop if loop is not None else batch_loop, config),
            concurrency=concurrency,
            backend=backend,
            limits=Limits.from_dict(config["limits"]),
            on_progress=progress,
        )

    result = _drive_batch(go, progress)
    _print_batch_result(result)
    raise typer.Exit(0 if result.complete else EXIT_NOT_ALL_ENDED)


@app.command()
def recover(
    journal: BatchJournalOpt = None,
    older_than: Annotated[
        float,
        typer.Option(
            "--older-than",
            help="Seconds a run with no owner must have existed to be taken.",
            parser=finite,
        ),
    ] = 300.0,
    model: Annotated[
        str | None,
        typer.Option("--model", help="For runs not started by this command: provider:name."),
    ] = None,
    workspace: Annotated[
        Path | None, typer.Option("--workspace", help="For runs not started by this command.")
    ] = None,
    tools: Annotated[str, typer.Option("--tools", help="With --model: files, shell.")] = (
        "files,shell"
    ),
    base_url: Annotated[str | None, typer.Option("--base-url")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency")] = 8,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only list the runs that would be resumed.")
    ] = False,
) -> None:
    """Resume the runs that stopped advancing without ending: their driver or node died
    (lease expired, or its process is provably gone), or they were submitted and never
    dispatched. A run still held by a live execution is left alone. Runs started by `polyloop
    run`/`batch` are rebuilt from their stored model and tools; others use --model/--workspace.

    Exit codes: 0 every run found has ended or is live elsewhere, 7 some could not be resumed
    (listed), 1 bad input, 2 usage error.

    Example: polyloop recover --journal polyloop.db --older-than 60
    """
    import functools
    import json as _json

    from polyloop.batch import BatchResult, execute, find_stalled, open_journal
    from polyloop.batch.sweeper import deny_expired

    from ._setup import OpenJournal

    if concurrency < 1:
        raise _fail(f"--concurrency must be at least 1, got {concurrency}")
    fallback: dict[str, Any] | None = None
    if model is not None or workspace is not None:
        if model is None or workspace is None:
            raise _fail("--model and --workspace go together (for runs not started by polyloop)")
        try:
            fallback = run_config(
                model=model,
                base_url=base_url,
                workspace=workspace,
                tools=tools,
                max_steps=30,
                max_actions=None,
                max_prompt_chars=None,
            )
        except (BadInput, PolyLoopError) as exc:
            raise _fail(str(exc)) from None
    spec = _journal_spec(journal, must_exist=True)
    progress = _BatchProgress()

    parked: list[Any] = []

    async def go() -> tuple[list[Any], list[Any], Any]:
        j = open_journal(spec)
        try:
            # Approvals past their expiry are denied ("timed out"); those runs go on now.
            denied = set() if dry_run else set(await deny_expired(j))
            pending = getattr(j, "pending_approvals", None)
            if pending is not None:
                parked.extend(await pending())
            stalled = await find_stalled(j, older_than_s=older_than)
            if denied - {s.run_id for s in stalled}:
                stalled += [
                    s
                    for s in await find_stalled(j, older_than_s=0)
                    if s.run_id in denied and s.run_id not in {t.run_id for t in stalled}
                ]
            groups: dict[str, tuple[dict[str, Any], list[str]]] = {}
            skipped = []
            for s in stalled:
                cli = (s.metadata or {}).get("cli")
                config = cli if isinstance(cli, dict) else fallback
                if config is None:
                    skipped.append(s)
                    continue
                key = _json.dumps(config, sort_keys=True)
                groups.setdefault(key, (config, []))[1].append(s.run_id)
            outcomes: list[Any] = []
            if not dry_run:
                for config, ids in groups.values():
                    if "loop" in config:  # started by `polyloop batch --loop`
                        result = await execute(
                            j,
                            ids,
                            functools.partial(factory_loop, config),
                            concurrency=concurrency,
                            on_progress=progress,
                        )
                        outcomes.extend(result.outcomes)
                        continue
                    async with contextlib.AsyncExitStack() as servers:
                        loop, _, _ = await build_loop(
                            OpenJournal(j, Path(spec)),
                            config,
                            None,
                            lambda _event: None,
                            servers=servers,
                        )
                        result = await execute(
                            j,
                            ids,
                            functools.partial(_built_loop, loop),
                            concurrency=concurrency,
                            on_progress=progress,
                        )
                    outcomes.extend(result.outcomes)
            return stalled, skipped, BatchResult(tuple(outcomes))
        finally:
            await j.aclose()

    stalled, skipped, result = _drive_batch(go, progress)
    kinds = ", ".join(
        f"{n} {why}"
        for why in ("lease_expired", "unowned", "leased")
        if (n := sum(s.why == why for s in stalled))
    )
    print(f"found {len(stalled)} runs not ended" + (f" ({kinds})" if kinds else ""), flush=True)
    if parked:
        print(
            f"left alone: {len(parked)} runs awaiting approval (polyloop pending lists them)",
            flush=True,
        )
    if dry_run:
        for s in stalled:
            print(f"  {s.run_id}  {s.why}  {s.steps_used} steps", flush=True)
        raise typer.Exit(0)
    for s in skipped:
        print(
            f"  {s.run_id}  skipped: not started by the polyloop command (pass --model and "
            "--workspace, or resume it from the code that started it)",
            flush=True,
        )
    if result.outcomes:
        _print_batch_result(result)
    failed = [
        o
        for o in result.outcomes
        if o.status == "error"
        or (o.status == "detached" and not (o.detail or "").startswith("awaiting approval"))
    ]
    raise typer.Exit(EXIT_NOT_ALL_ENDED if failed or skipped else 0)


# -- the journal file: `polyloop check` -------------------------------------------------------


@app.command()
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
        raise _fail(
            "polyloop check reads SQLite journal files; a PostgreSQL journal is checked by the "
            "server's own tools (e.g. pg_amcheck)"
        )
    path = journal_path(None if journal is None else Path(journal))
    if not path.is_file():
        raise _fail(f"no journal at {path} (pass --journal PATH or set ${JOURNAL_ENV})")
    try:
        raise typer.Exit(check_file(path))
    except PolyLoopError as exc:
        raise _fail(str(exc)) from None
