"""Many runs: ``polyloop batch`` and ``polyloop recover`` (callers of :mod:`polyloop.batch`),
with their live progress and the Loops they build from a run's stored config."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from polyloop import PolyLoopError

from . import _render
from ._common import (
    EXIT_INTERRUPTED,
    EXIT_NOT_ALL_ENDED,
    RequestJournalOpt,
    T,
    call,
    fail,
    journal_spec,
)
from ._options import RESERVED_METADATA, RunOptions, run_options
from ._setup import BadInput, add_mcp_tools, build_loop, finite, mcp_store, run_config


def batch_loop(config: dict[str, Any], journal: Any, *, tools: Any = None) -> Any:
    """The Loop of a batch started by the command, from its stored config (module-level, so
    Ray workers can import it). ``tools``: a registry already holding the batch's MCP tools
    (:func:`_mcp_tools`); None: the workspace tools of ``config``."""
    from polyloop import Limits, Loop

    from ._setup import _model, workspace_tools_of

    if tools is None:
        tools = workspace_tools_of(config)
    limits = Limits.from_dict(config["limits"])
    return Loop(_model(config), tools=tools, journal=journal, limits=limits)


def factory_loop(config: dict[str, Any], journal: Any) -> Any:
    """The Loop of a batch started with ``--loop module:function``: that factory's Loop (the
    run's limits are the command's, stored with it; module-level, so Ray workers can import
    it)."""
    from polyloop.batch import resolve_factory

    return resolve_factory(config["loop"])(journal)


async def _mcp_tools(servers: contextlib.AsyncExitStack, config: dict[str, Any]) -> Any:
    """The workspace tools of a batch with ``--mcp``, and its MCP servers' tools: each server
    is connected once (closed with ``servers``, when the batch ends or is interrupted) and
    shared by every run of the batch, as the workspace is; its calls go out side by side."""
    from polyloop.tools.builtin import workspace_tools

    workspace = Path(config["workspace"])
    tools = workspace_tools(workspace, shell="shell" in config["tools"])
    await add_mcp_tools(servers, tools, config, workspace, new_run=True)
    return tools


_NOT_IDENTITY = ("timeout_s", "stream", "mcp_headers", "mcp_store")
"""Stored config keys that say how a run is carried out, not which run it is."""


def run_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What a batch run's derived id depends on, of the command's ``config``: the model and
    server, workspace, tools, MCP servers and the tools chosen of them, sampling and budgets.
    Not the failure guard, ``--timeout``, ``--stream`` or ``--mcp-header``: they say how the
    run is watched and reached, and re-running the command with other ones continues the same
    runs (each with the settings stored when it was made). For the options batch had before
    the run options were shared, this is the config it stored, so ids derived then are found
    again."""
    from dataclasses import replace

    from polyloop import Limits

    limits = replace(
        Limits.from_dict(config["limits"]),
        same_failure_limit=None,
        no_progress_rounds=None,
        spreading_rounds=None,
        known_failures=(),
        baseline=False,
    )
    identity = {k: v for k, v in config.items() if k not in _NOT_IDENTITY}
    identity["limits"] = limits.to_dict()
    return identity


def _loop_config(loop: str, options: RunOptions) -> dict[str, Any]:
    """The stored config of a batch whose Loop comes from a ``module:function`` factory
    (checked here: a bad path is one line, before anything is written): the run options'
    limits; the options that build a model or tools belong to the factory and are refused."""
    from polyloop.batch import resolve_factory

    other = options.changed(besides=RunOptions.LIMITS | {"metadata"})
    if other:
        raise BadInput(
            f"{', '.join(other)}: not with --loop (the factory's Loop has its own model and "
            "tools; only the budgets, the failure guard's options and --metadata apply)"
        )
    resolve_factory(loop)
    return {"loop": loop, "limits": options.limits()}


def _dry_run_state(s: Any) -> str:
    """A found run's state in the words of ``polyloop runs``, and what ``recover`` does."""
    if s.state == "running":
        return "running (held by a live execution: left alone)"
    return f"{s.state} (would be resumed)"


def _built_loop(loop: Any, journal: Any) -> Any:
    """A Loop factory handing out a Loop already built on that journal."""
    return loop


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
        return f"done {p.done}/{p.total}  running {p.running}{extra}{_BatchProgress.pace(p)}" + (
            f"  | {reasons}" if reasons else ""
        )

    @staticmethod
    def pace(p: Any, now: float | None = None) -> str:
        """Runs per minute and tokens over the runs this batch advanced, and the time left
        at that pace ("" before the first run is back)."""
        handled = p.done - p.skipped + p.leased + p.detached + p.errors
        elapsed = (time.monotonic() if now is None else now) - p.started_at
        if handled <= 0 or elapsed <= 0:
            return ""
        per_min = handled / elapsed * 60
        left = (p.pending + p.running) / per_min * 60
        eta = f"  left ~{left / 60:.0f} min" if left >= 90 else f"  left ~{left:.0f} s"
        tokens = f"  tokens {p.tokens:,}" if p.tokens else ""
        return f"  {per_min:.1f} runs/min{tokens}" + (eta if p.pending + p.running else "")

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
        return call(main)
    except (KeyboardInterrupt, asyncio.CancelledError):
        progress.close()
        print("interrupted: re-run the same command to continue", flush=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (ImportError, ValueError) as exc:  # a missing extra (ray, psycopg), a bad option
        progress.close()
        raise fail(str(exc).splitlines()[0]) from None
    finally:
        progress.close()


def _print_batch_result(result: Any) -> None:
    print(result.summary(), flush=True)
    left = result.not_ended
    for outcome in left[:10]:
        print(f"  {outcome.run_id}  {outcome.status}: {outcome.detail or ''}", flush=True)
    if len(left) > 10:
        print(f"  … and {len(left) - 10} more", flush=True)


@run_options
def batch(
    file: Annotated[
        Path, typer.Argument(help='JSONL: one {"goal": ..., "run_id"?, "metadata"?} a line.')
    ],
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model as provider:name, e.g. openai:gpt-4o-mini."),
    ] = None,
    options: RunOptions = ...,  # type: ignore[assignment]  # the run options (run_options)
    journal: RequestJournalOpt = None,
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
    the same command skips the runs that ended and finishes the rest. --metadata tags every
    run; a goal line's own metadata wins for a key both give.

    Exit codes: 0 every run ended (whatever its stop reason), 7 some did not (listed; re-run to
    continue), 130 interrupted (runs detached, resumable), 1 bad input, 2 usage error.

    The run options are run's, with its defaults (the failure guard included). With --mcp,
    each server is started (or connected to) once and shared by the batch's runs, as the
    workspace is, and stopped when the batch ends; --backend local only. The run id depends
    on the goal, the model and server, workspace, tools, MCP servers, sampling and budgets,
    not on the failure guard, --timeout, --stream or --mcp-header.

    Example: polyloop batch goals.jsonl --model openai:gpt-4o-mini --workspace . --concurrency 16
    """
    from polyloop import Limits
    from polyloop.batch import Goal, GoalFileError, goal_run_id, load_goals, run_batch

    if concurrency < 1:
        raise fail(f"--concurrency must be at least 1, got {concurrency}")
    if (model is None) == (loop is None):
        raise fail("pass --model (with --workspace, --tools) or --loop module:function")
    try:
        if loop is not None:
            config = _loop_config(loop, options)
        else:
            assert model is not None
            if options.mcp and backend == "ray":
                raise BadInput(
                    "--mcp works with --backend local only: a Ray worker builds its Loop in a "
                    "plain function and has no end at which to stop the servers it would start"
                )
            config = options.config(model)
        tags = options.user_metadata()
        goals = load_goals(file, reserved=RESERVED_METADATA)
    except GoalFileError as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc.strerror or exc}") from None
    except (BadInput, PolyLoopError) as exc:
        raise fail(str(exc)) from None
    spec = journal_spec(journal, must_exist=False)
    if config.get("mcp"):
        config["mcp_store"] = mcp_store(spec)
    # The command's config is stored with each run; what of it defines the run is part of
    # its derived id (run_identity).
    identity = run_identity(config)
    goals = [
        Goal(
            g.goal,
            run_id=g.run_id
            or goal_run_id(
                Goal(
                    g.goal,
                    metadata={**tags, **(g.metadata or {}), "cli": identity},
                    source=g.source,
                )
            ),
            metadata={**tags, **(g.metadata or {}), "cli": config},
            source=g.source,
        )
        for g in goals
    ]
    progress = _BatchProgress()
    print(f"batch {file}: {len(goals)} goals  backend {backend}  journal {spec}", flush=True)

    async def go() -> Any:
        import functools

        async with contextlib.AsyncExitStack() as servers:  # MCP servers: stopped at the end
            make_loop = functools.partial(factory_loop if loop is not None else batch_loop, config)
            if config.get("mcp"):
                tools = await _mcp_tools(servers, config)
                make_loop = functools.partial(batch_loop, config, tools=tools)
            return await run_batch(
                spec,
                goals,
                make_loop,
                concurrency=concurrency,
                backend=backend,
                limits=Limits.from_dict(config["limits"]),
                on_progress=progress,
            )

    result = _drive_batch(go, progress)
    _print_batch_result(result)
    parked = [o for o in result.not_ended if (o.detail or "").startswith("awaiting approval")]
    if parked:
        where = f" --journal {spec}"
        print(
            f"{len(parked)} runs await a person's decision: polyloop pending{where} lists them; "
            f"polyloop approve RUN_ID OP_ID{where} or polyloop deny RUN_ID OP_ID --reason "
            f"TEXT{where} decides, and prints the command that continues the run",
            flush=True,
        )
    raise typer.Exit(0 if result.complete else EXIT_NOT_ALL_ENDED)


def recover(
    journal: RequestJournalOpt = None,
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
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="With --model: the provider's server.")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Runs advancing at once.")] = 8,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Only list the runs found, each with its state as polyloop runs says it "
            "(stale, detached: would be resumed; running: a live lease, left alone).",
        ),
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
        raise fail(f"--concurrency must be at least 1, got {concurrency}")
    fallback: dict[str, Any] | None = None
    if model is not None or workspace is not None:
        if model is None or workspace is None:
            raise fail("--model and --workspace go together (for runs not started by polyloop)")
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
            raise fail(str(exc)) from None
    spec = journal_spec(journal, must_exist=True)
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
                    async with contextlib.AsyncExitStack() as servers:
                        if "loop" in config:  # started by `polyloop batch --loop`
                            make = functools.partial(factory_loop, config)
                        else:
                            loop, _, _ = await build_loop(
                                OpenJournal(j, Path(spec)),
                                config,
                                None,
                                lambda _event: None,
                                servers=servers,
                            )
                            make = functools.partial(_built_loop, loop)
                        result = await execute(
                            j, ids, make, concurrency=concurrency, on_progress=progress
                        )
                    outcomes.extend(result.outcomes)
            return stalled, skipped, BatchResult(tuple(outcomes))
        finally:
            await j.aclose()

    stalled, skipped, result = _drive_batch(go, progress)
    kinds = ", ".join(
        f"{n} {state}"
        for state in ("stale", "detached", "running")
        if (n := sum(s.state == state for s in stalled))
    )
    print(f"found {len(stalled)} runs not ended" + (f" ({kinds})" if kinds else ""), flush=True)
    if parked:
        print(
            f"left alone: {len(parked)} runs awaiting approval (polyloop pending lists them)",
            flush=True,
        )
    if dry_run:
        for s in stalled:
            print(f"  {s.run_id}  {_dry_run_state(s)}  {s.steps_used} steps", flush=True)
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
