"""What the commands share: checking arguments, opening the journal, building a Loop."""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from polyloop import ConfigError, Limits, Loop, Pricing, RunNotFound, ToolRegistry
from polyloop.journal import SQLiteJournal
from polyloop.types import check_number

from ._approval import command_policy, continue_hint, mcp_ask_names
from ._badinput import BadInput as BadInput  # re-exported: where the commands import it
from ._check import refuse_damaged

if TYPE_CHECKING:
    from polyloop.journal import PostgresJournal

DEFAULT_JOURNAL = "polyloop.db"
JOURNAL_ENV = "POLYLOOP_JOURNAL"
TOOL_SETS = ("files", "shell")
_PROVIDERS = (
    "openai:MODEL (any OpenAI-compatible server via --base-url), openai-responses:MODEL, "
    "anthropic:MODEL or gemini:MODEL"
)


def finite(text: str) -> float:
    """A float option's value (``--max-seconds``, ``--timeout``...): a finite number, else a
    usage error (exit 2); the range is the setting's to check."""
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise typer.BadParameter(f"{text} is not a finite number")
    return value


class OpenJournal:
    """A SQLiteJournal and the path it was opened from."""

    def __init__(self, journal: SQLiteJournal, path: Path) -> None:
        self.journal = journal
        self.path = path


@dataclass(frozen=True)
class Reader:
    """The journal a reading command reads (a SQLiteJournal opened read-only, or a
    PostgresJournal) and what its messages call it: the file's path, or the server and
    schema (never the DSN's password)."""

    journal: SQLiteJournal | PostgresJournal
    where: str


def journal_path(path: Path | None) -> Path:
    """``--journal``, else ``$POLYLOOP_JOURNAL``, else ``./polyloop.db``."""
    if path is not None:
        return path
    return Path(os.environ.get(JOURNAL_ENV) or DEFAULT_JOURNAL)


def no_journal(path: Path) -> str:
    """The one line for a journal file that is not there; for the default ``polyloop.db``
    while the demo's journal is in the current folder, where the demo's runs are."""
    from .demo import DEMO_JOURNAL

    line = f"no journal at {path} (pass --journal PATH or set ${JOURNAL_ENV})"
    if path == Path(DEFAULT_JOURNAL) and Path(DEMO_JOURNAL).is_file():
        line += f" (the demo's runs are in {DEMO_JOURNAL}: --journal {DEMO_JOURNAL})"
    return line


@asynccontextmanager
async def open_journal(
    path: Path | None, *, must_exist: bool = False, read_only: bool = False
) -> AsyncIterator[OpenJournal]:
    """The journal a command uses. ``read_only`` (the reading commands): opened read-only, so
    it needs no write access and is never created or written (implies ``must_exist``);
    otherwise a small existing file is checked first (:func:`._check.refuse_damaged`)."""
    resolved = journal_path(path)
    if (must_exist or read_only) and not resolved.exists():
        raise BadInput(no_journal(resolved))
    folder = resolved.parent
    if not resolved.exists() and not folder.is_dir():
        raise BadInput(
            f"cannot create the journal {resolved}: the folder {folder} does not exist "
            "(create it, or pass another --journal)"
        )
    if not read_only:
        refuse_damaged(resolved)
    journal = SQLiteJournal(resolved, read_only=read_only)
    try:
        yield OpenJournal(journal, resolved)
    finally:
        await journal.aclose()


@asynccontextmanager
async def open_reader(journal: str | None) -> AsyncIterator[Reader]:
    """The journal a reading command (``runs``, ``show``, ``stats``, ``export``) reads: a
    ``postgresql://`` URI (optionally ending ``#schema=NAME``) opens that PostgreSQL journal
    (which, like every PostgresJournal, creates the PolyLoop tables in an empty schema); else
    the SQLite file, read-only (:func:`open_journal`). Closed when the block ends.

    Raises:
        BadInput: no such file, or psycopg not installed.
    """
    from polyloop.batch._journals import is_postgres_spec
    from polyloop.batch._journals import open_journal as open_spec

    if journal is None or not is_postgres_spec(journal):
        async with open_journal(
            None if journal is None else Path(journal), read_only=True
        ) as sqlite:
            yield Reader(sqlite.journal, str(sqlite.path))
        return
    try:
        postgres = open_spec(journal)
    except ImportError as exc:  # the extra is missing: its message says how to install it
        raise BadInput(str(exc).splitlines()[0]) from None
    try:
        yield Reader(postgres, postgres.where)
    finally:
        await postgres.aclose()


def run_config(
    *,
    model: str,
    base_url: str | None,
    workspace: Path,
    tools: str,
    max_steps: int,
    max_actions: int | None,
    max_prompt_chars: int | None,
    timeout_s: float | None = None,
    budgets: dict[str, Any] | None = None,
    guard: FailureGuardArgs | None = None,
    stream: bool = False,
    writable_paths: Sequence[str] | None = None,
    sampling: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check the ``run`` arguments; the result is stored with the run (for ``resume``).
    ``timeout_s`` (the model call's request timeout) is stored only when given: a run
    without it uses ``OpenAIModel``'s default. ``budgets``: ``max_tokens``, ``max_cost``,
    ``max_seconds`` (None: unbounded). ``guard``: the failure guard's options
    (``run`` and ``batch`` pass the same ones; a batch's run ids do not depend on them).
    ``stream`` is stored only when True (a resumed run streams as it did).
    ``writable_paths`` (``--writable-paths``; ``[]`` for ``--read-only``) is checked here and
    stored only when given (None: the whole workspace is writable).
    ``sampling``: ``temperature`` and ``max_output_tokens`` (:func:`check_sampling`), each
    stored only when given (None: the provider's default)."""
    provider, sep, name = model.partition(":")
    if not sep or not name:
        raise BadInput(f"--model takes PROVIDER:MODEL, got {model!r}: use {_PROVIDERS}")
    if provider not in ("openai", "openai-responses", "anthropic", "gemini"):
        raise BadInput(f"unknown model provider {provider!r} in {model!r}: use {_PROVIDERS}")
    if not workspace.is_dir():
        raise BadInput(f"the workspace {workspace} does not exist or is not a folder")
    chosen = [t.strip() for t in tools.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in TOOL_SETS]
    if unknown or "files" not in chosen:
        raise BadInput(f"--tools takes files or files,shell; got {tools!r}")
    limits = Limits(
        max_steps=max_steps,
        max_actions=max_actions,
        max_prompt_chars=max_prompt_chars,
        **{k: v for k, v in (budgets or {}).items() if v is not None},
        **({} if guard is None else guard.limits()),
    )
    config: dict[str, Any] = {
        "model": model,
        "base_url": base_url,
        "workspace": str(workspace.resolve()),
        "tools": chosen,
        "limits": limits.to_dict(),
    }
    if timeout_s is not None:
        config["timeout_s"] = check_timeout(timeout_s)
    if stream:
        config["stream"] = True
    if writable_paths is not None:
        config["writable_paths"] = list(writable_paths)
        workspace_tools_of(config)  # a bad glob is one line now, before anything is written
    config.update(check_sampling(sampling or {}))
    return config


def check_sampling(sampling: dict[str, Any]) -> dict[str, Any]:
    """``--temperature`` (a number >= 0) and ``--max-output-tokens`` (an int > 0), those given.
    Raises ``BadInput``."""
    out: dict[str, Any] = {}
    temperature = sampling.get("temperature")
    if temperature is not None:
        try:
            check_number("--temperature", temperature)
        except ConfigError as exc:
            raise BadInput(str(exc)) from None
        out["temperature"] = float(temperature)
    tokens = sampling.get("max_output_tokens")
    if tokens is not None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise BadInput(f"--max-output-tokens must be > 0, got {tokens}")
        out["max_output_tokens"] = tokens
    return out


def pricing_config(price_in: float | None, price_out: float | None) -> dict[str, Any]:
    """``--price-in``/``--price-out`` (US dollars per million input/output tokens), stored
    with the run as its model's ``Pricing``, which overrides the price table; ``{}`` when
    neither is given. Raises ``BadInput``: only one given, or a price out of range."""
    if price_in is None and price_out is None:
        return {}
    if price_in is None or price_out is None:
        raise BadInput(
            "--price-in and --price-out go together: give both (US dollars per million input "
            "and output tokens)"
        )
    try:
        Pricing(price_in, price_out)
    except ConfigError as exc:
        said = str(exc).replace("Pricing.input_per_mtok", "--price-in")
        raise BadInput(said.replace("Pricing.output_per_mtok", "--price-out")) from None
    return {"pricing": {"input_per_mtok": price_in, "output_per_mtok": price_out}}


def mcp_config(
    specs: Sequence[str],
    *,
    prefix: bool,
    headers: Sequence[str],
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    ask: Sequence[str] = (),
) -> dict[str, Any]:
    """Check ``--mcp``, ``--mcp-prefix``, ``--mcp-header``, ``--mcp-include``,
    ``--mcp-exclude`` (each ``NAME,...``, repeatable) and ``--ask-mcp`` (``NAME`` or
    ``destructive``, repeatable); the result joins the run's stored config
    (so ``resume`` reconnects and registers the same tools), and is empty without ``--mcp``.
    Header values are stored as given: write secrets as ``${VAR}``, expanded from the
    environment at connect."""
    if not specs:
        if prefix or headers or include or exclude or ask:
            raise BadInput(
                "--mcp-prefix, --mcp-header, --mcp-include, --mcp-exclude and --ask-mcp go "
                "with --mcp"
            )
        return {}
    for spec in specs:
        if not spec.strip():
            raise BadInput("--mcp takes a command line or an http(s) URL, got ''")
    parsed: dict[str, str] = {}
    for header in headers:
        name, sep, value = header.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+", name.strip()):
            raise BadInput(f"--mcp-header takes 'Name: value', got {header!r}")
        parsed[name.strip()] = value.strip()
    config: dict[str, Any] = {"mcp": list(specs)}
    if prefix:
        config["mcp_prefix"] = True
    if parsed:
        config["mcp_headers"] = parsed
    if include and exclude:
        raise BadInput(
            "--mcp-include and --mcp-exclude cannot be combined: name the tools to keep, or "
            "those to leave out"
        )
    for option, given in (("include", include), ("exclude", exclude)):
        names = [n.strip() for value in given for n in value.split(",") if n.strip()]
        if given and not names:
            raise BadInput(f"--mcp-{option} takes tool names, NAME,..., got {given[0]!r}")
        if names:
            config[f"mcp_{option}"] = list(dict.fromkeys(names))
    asked = [a.strip() for a in ask]
    if any(not a for a in asked):
        raise BadInput("--ask-mcp takes a tool's name or destructive, got ''")
    if asked:
        config["mcp_ask"] = list(dict.fromkeys(asked))
    return config


def mcp_store(journal: str) -> str:
    """Where the images and binary resources MCP tools return are saved: beside a SQLite
    journal (``JOURNAL.mcp-files``), else in ``./polyloop.mcp-files``."""
    from polyloop.batch._journals import is_postgres_spec

    if is_postgres_spec(journal):
        return str(Path("polyloop.mcp-files").resolve())
    return str(Path(journal.removeprefix("sqlite:")).resolve()) + ".mcp-files"


def _mcp_module() -> Any:
    try:
        from polyloop.tools import mcp
    except ImportError as exc:
        raise BadInput(str(exc).splitlines()[0]) from None
    return mcp


def mcp_server(spec: str, config: dict[str, Any], *, cwd: Path | None = None) -> Any:
    """The ``MCPServer`` of one ``--mcp`` spec (a stdio server starts in ``cwd``: the run's
    workspace, so that relative paths in its command line mean the same on resume)."""
    mcp = _mcp_module()
    try:
        return mcp.MCPServer.from_spec(
            spec,
            headers=config.get("mcp_headers") if spec.startswith(("http://", "https://")) else None,
            cwd=cwd,
            store_dir=config.get("mcp_store"),
        )
    except ConfigError as exc:
        raise BadInput(f"--mcp {spec!r}: {exc}") from None


def mcp_prefix(server: Any) -> str:
    """``--mcp-prefix``: the server's own name (``serverInfo.name``) in the characters tool
    names allow, then ``_``: ``secure-filesystem-server_read_file``."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", server.server_name or "mcp")
    return name + "_"


async def add_mcp_tools(
    servers: AsyncExitStack,
    tools: ToolRegistry,
    config: dict[str, Any],
    workspace: Path,
    *,
    new_run: bool = False,
) -> None:
    """Connect the run's MCP servers (closed with ``servers``) and register their tools on
    ``tools``, beside the workspace tools: all of them, or those ``--mcp-include`` names, or
    all but those ``--mcp-exclude`` names (the servers' own names, before ``--mcp-prefix``; a
    name applies to every server offering it). A tool whose name model APIs refuse is left
    out with one line on stderr saying which and why (the user cannot pass the library's
    ``include=``). The tools ``--ask-mcp`` picks (:func:`._approval.mcp_ask_names`) wait for
    a person. Raises ``BadInput`` for a name clash, and, for a ``new_run``, for an include,
    exclude or ``--ask-mcp`` name no server offers (a resume goes on without a tool that
    vanished);
    the library's ``MCPServerError`` for a server that cannot be started or reached."""
    include = config.get("mcp_include")
    exclude = config.get("mcp_exclude") or []
    asked = config.get("mcp_ask") or []
    listed = []
    for spec in config.get("mcp") or ():
        server = mcp_server(spec, config, cwd=workspace)
        await servers.enter_async_context(server)
        listed.append((spec, server, await server.list_tools()))
    offered = {t.name for _, _, tools_of in listed for t in tools_of}
    for option, given in (
        ("--mcp-include" if include else "--mcp-exclude", include or exclude),
        ("--ask-mcp", [n for n in asked if n != "destructive"]),
    ):
        unknown = [n for n in given if n not in offered]
        if unknown and new_run:
            raise BadInput(
                f"{option} names {unknown}, which no --mcp server offers (they offer "
                f"{sorted(offered)})"
            )
    for spec, server, tools_of in listed:
        prefix = mcp_prefix(server) if config.get("mcp_prefix") else ""
        names = [t.name for t in tools_of]
        chosen = [n for n in names if (include is None or n in include) and n not in exclude]
        ask = [n for n in mcp_ask_names(asked, tools_of) if n in chosen]

        def skipped(name: str, why: str, spec: str = spec) -> None:
            print(f"polyloop: --mcp {spec!r}: skipped the tool {name!r}: {why}", file=sys.stderr)

        try:
            await server.register(
                tools, prefix=prefix, include=chosen, on_skipped=skipped, approval=ask
            )
        except ConfigError as exc:
            hint = "" if prefix else " (pass --mcp-prefix to name them SERVER_TOOL)"
            raise BadInput(f"--mcp {spec!r}: {exc}{hint}") from None


@dataclass(frozen=True)
class FailureGuardArgs:
    """``polyloop run``'s failure-guard options, as given: counts of 0 turn a signal off."""

    same_failure_limit: int
    no_progress_rounds: int
    spreading_rounds: int
    known_failures: tuple[str, ...] = ()
    baseline: bool = False

    def limits(self) -> dict[str, Any]:
        """The ``Limits`` fields they set. Raises ``BadInput`` for a negative count."""
        counts = {
            "same_failure_limit": self.same_failure_limit,
            "no_progress_rounds": self.no_progress_rounds,
            "spreading_rounds": self.spreading_rounds,
        }
        for name, n in counts.items():
            if n < 0:
                flag = "--" + name.replace("_", "-")
                raise BadInput(f"{flag} takes a count >= 0 (0 turns it off), got {n}")
        out: dict[str, Any] = {name: n or None for name, n in counts.items()}
        out["known_failures"] = self.known_failures
        out["baseline"] = self.baseline
        return out


def check_timeout(timeout_s: float) -> float:
    """``--timeout``: seconds > 0."""
    if not timeout_s > 0 or timeout_s == float("inf"):
        raise BadInput(f"--timeout takes seconds > 0, got {timeout_s}")
    return float(timeout_s)


def model_overrides(*, base_url: str | None, timeout_s: float | None) -> dict[str, Any]:
    """The model options ``resume`` was given (none given: ``{}``), for that execution only."""
    overrides: dict[str, Any] = {}
    if base_url is not None:
        overrides["base_url"] = base_url
    if timeout_s is not None:
        overrides["timeout_s"] = check_timeout(timeout_s)
    return overrides


def loop_parts(config: dict[str, Any]) -> tuple[Any, Any]:
    """The model and the tools of a new run's ``config``, built before its journal is opened
    (so that a run that cannot start leaves no journal file behind). Raises ``BadInput``."""

    workspace = Path(config["workspace"])
    if not workspace.is_dir():
        raise BadInput(f"the workspace {workspace} does not exist or is not a folder")
    return _model(config), workspace_tools_of(config)


def workspace_tools_of(config: dict[str, Any]) -> ToolRegistry:
    """The workspace tools of a run's stored ``config``, what every execution of the run
    builds (a new run, ``resume``, ``batch`` and ``recover``): its tool sets, its
    ``writable_paths`` and its shell rules (``shell_policy``), so a resume applies the rules
    it started with. Raises ``BadInput`` for a ``writable_paths`` entry the workspace
    refuses."""
    from polyloop.tools.builtin import workspace_tools

    try:
        return workspace_tools(
            config["workspace"],
            shell="shell" in config["tools"],
            writable_paths=config.get("writable_paths"),
            command_policy=command_policy(config.get("shell_policy")),
        )
    except ConfigError as exc:
        raise BadInput(
            str(exc).replace("workspace_tools: writable_paths entry", "--writable-paths")
        ) from None


def _model(config: dict[str, Any]) -> Any:
    options: dict[str, Any] = {"base_url": config.get("base_url")}
    if config.get("timeout_s") is not None:
        options["timeout_s"] = config["timeout_s"]
    if config.get("stream") is True:
        options["stream"] = True
    if config.get("pricing") is not None:
        options["pricing"] = Pricing(**config["pricing"])
    provider, _, name = config["model"].partition(":")
    if config.get("max_output_tokens") is not None:
        options["max_tokens"] = config["max_output_tokens"]
    if config.get("temperature") is not None:
        if provider == "anthropic":  # its create() takes sampling settings in the body only
            options["extra_body"] = {"temperature": config["temperature"]}
        else:
            options["temperature"] = config["temperature"]
    try:
        if provider == "anthropic":
            return _anthropic_model(name, options)
        if provider == "gemini":
            return _gemini_model(name, options)
        if provider == "openai-responses":
            return _openai_responses_model(name, options)
        from polyloop.models.openai import OpenAIModel

        return OpenAIModel(name, **options)
    except ImportError as exc:
        raise BadInput(str(exc).splitlines()[0]) from None
    except ConfigError as exc:
        raise BadInput(str(exc)) from None


def _anthropic_model(name: str, options: dict[str, Any]) -> Any:
    """``anthropic:MODEL``: an AnthropicModel; its key comes from ``ANTHROPIC_API_KEY`` and
    its base URL from ``--base-url``, else ``ANTHROPIC_BASE_URL``, else Anthropic's."""
    from polyloop.models.anthropic import AnthropicModel

    return AnthropicModel(name, **options)


def _gemini_model(name: str, options: dict[str, Any]) -> Any:
    """``gemini:MODEL``: a GeminiModel, its key from ``GOOGLE_API_KEY`` or ``GEMINI_API_KEY``
    (the SDK's order)."""
    from polyloop.models.gemini import GeminiModel

    return GeminiModel(name, **options)


def _openai_responses_model(name: str, options: dict[str, Any]) -> Any:
    """``openai-responses:MODEL``: an OpenAIResponsesModel (OpenAI's Responses API, for its
    reasoning models), configured as ``openai:MODEL`` is (``OPENAI_API_KEY``, ``--base-url``)."""
    from polyloop.models.openai_responses import OpenAIResponsesModel

    return OpenAIResponsesModel(name, **options)


async def build_loop(
    journal: OpenJournal,
    config: dict[str, Any] | None,
    run_id: str | None,
    observer: Callable[[Any], None],
    *,
    limit_overrides: dict[str, Any] | None = None,
    overrides: dict[str, Any] | None = None,
    servers: AsyncExitStack | None = None,
) -> tuple[Loop, dict[str, Any], Limits | None]:
    """The Loop for a new run (``config`` given) or for resuming ``run_id`` with the config
    stored with it, ``overrides`` (:func:`model_overrides`) replacing its model options for
    this execution and the limits in ``limit_overrides`` that are not None replacing the
    stored ones (journaled). The run's MCP servers are connected again and their tools listed again
    (a tool that vanished is treated as a vanished Python tool is); they stay connected until
    ``servers`` closes."""
    limits: Limits | None = None
    if config is None:
        assert run_id is not None
        try:
            spec, _ = await journal.journal.read(run_id)
        except RunNotFound:
            raise BadInput(f"no run {run_id!r} in {journal.path}") from None
        cli = (spec.metadata or {}).get("cli")
        if not isinstance(cli, dict):
            hint = continue_hint(run_id, spec.metadata, str(journal.path))
            raise BadInput(f"run {run_id!r} was not started by the polyloop command: {hint}")
        config = {**cli, **(overrides or {})}
        changed = {k: v for k, v in (limit_overrides or {}).items() if v is not None}
        if changed:
            limits = Limits.from_dict({**spec.limits.to_dict(), **changed})
    else:
        limits = Limits.from_dict(config["limits"])
    if "loop" in config:
        assert run_id is not None
        hint = continue_hint(run_id, {"cli": config}, str(journal.path))
        raise BadInput(f"run {run_id!r} was started by polyloop batch --loop: {hint}")
    workspace = Path(config["workspace"])
    if not await asyncio.to_thread(workspace.is_dir):
        raise BadInput(f"the run's workspace {workspace} no longer exists")
    tools = workspace_tools_of(config)
    model = _model(config)
    if config.get("mcp"):
        if servers is None:
            raise BadInput("this run uses MCP servers: continue it with polyloop resume")
        await add_mcp_tools(servers, tools, config, workspace)
    loop = Loop(model, tools=tools, journal=journal.journal, observers=[observer])
    return loop, config, limits
