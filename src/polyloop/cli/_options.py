"""The options of the commands that start runs, defined once: ``polyloop run`` and
``polyloop batch`` take the same flags, with the same defaults, parsed into one
:class:`RunOptions` and turned into one stored config (:meth:`RunOptions.config`).

A command opts in with :func:`run_options`: its parameter ``options: RunOptions`` is replaced,
in the signature typer reads, by a parameter per field of ``RunOptions`` (its annotated type and
default: typer builds a command from its function's signature, ``inspect.signature``; the
wrapper's ``__signature__`` is the standard way to give a function another one). Adding a run
option is one field of ``RunOptions`` and its use in ``config``: both commands get it.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar, get_type_hints

import typer

from ._approval import shell_policy_config
from ._setup import BadInput, FailureGuardArgs, finite, mcp_config, pricing_config, run_config

F = TypeVar("F", bound=Callable[..., Any])
_FLAG = inspect.Parameter.POSITIONAL_OR_KEYWORD

MCP_TOOL_ERROR = "MCPToolError"
"""The error type of an MCP tool's error result: a known failure of every run with ``--mcp``
and the guard on (``Limits.known_failures`` matches a tool's error by its type)."""

ModelOpt = Annotated[
    str, typer.Option("--model", help="Model as provider:name, e.g. openai:gpt-4o-mini.")
]
WorkspaceOpt = Annotated[
    Path, typer.Option("--workspace", help="Folder the tools work in (must exist).")
]
ToolsOpt = Annotated[str, typer.Option("--tools", help="Comma-separated tool sets: files, shell.")]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="The provider's server: any OpenAI-compatible one for openai:MODEL (a local "
        "llama.cpp, vLLM, Ollama), or a proxy of Anthropic's or Google's API.",
    ),
]
MaxStepsOpt = Annotated[
    int, typer.Option("--max-steps", help="Steps the run may take (step_budget).")
]
MaxActionsOpt = Annotated[
    int | None,
    typer.Option("--max-actions", help="Actions the run may execute (action_budget)."),
]
MaxPromptCharsOpt = Annotated[
    int | None,
    typer.Option(
        "--max-prompt-chars",
        help="Characters the prompt may hold; a longer one ends the run context_overflow.",
    ),
]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", help="Input + output tokens the run may use (token_budget)."),
]
MaxCostOpt = Annotated[
    float | None,
    typer.Option(
        "--max-cost",
        parser=finite,
        help="US dollars the run may spend (cost_budget): the provider's reported cost, else "
        "the tokens at --price-in/--price-out, else at the model's price in the genai-prices "
        "table. A run whose cost cannot be measured warns once and says so in its detail.",
    ),
]
PriceInOpt = Annotated[
    float | None,
    typer.Option(
        "--price-in",
        parser=finite,
        help="US dollars per million input tokens (with --price-out; overrides the price "
        "table). Stored with the run.",
    ),
]
PriceOutOpt = Annotated[
    float | None,
    typer.Option(
        "--price-out",
        parser=finite,
        help="US dollars per million output tokens (with --price-in). Stored with the run.",
    ),
]
MaxSecondsOpt = Annotated[
    float | None,
    typer.Option(
        "--max-seconds",
        parser=finite,
        help="Seconds the run may be active (time_budget). A model call or tool still running "
        "then is stopped 5 s later (the grace) and no retry starts after it, so the run ends "
        "at most 5 s past the budget, plus what cannot be interrupted (journal writes, a "
        "timed-out command's kill).",
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
        metavar="SERVER",
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
        metavar="'NAME: VALUE'",
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

SameFailureLimitOpt = Annotated[
    int,
    typer.Option(
        "--same-failure-limit",
        help="Stop repeated_failure when one failure comes back this many times (0: off).",
    ),
]
NoProgressRoundsOpt = Annotated[
    int,
    typer.Option(
        "--no-progress-rounds",
        help="Stop after this many rounds without fewer failing tests (0: off).",
    ),
]
SpreadingRoundsOpt = Annotated[
    int,
    typer.Option(
        "--spreading-rounds",
        help="Stop after this many rounds that each changed a new file (0: off).",
    ),
]
KnownFailureOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--known-failure",
        metavar="CHECK",
        help="A test failing before the run, unrelated to GOAL (repeatable): never counted.",
    ),
]
BaselineOpt = Annotated[
    bool,
    typer.Option(
        "--baseline/--no-baseline",
        help="Take the failures of the test runs before the first edit as known while no "
        "edit changes them (a test that was red before the run never counts unless it "
        "changes). On with the guard.",
    ),
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        parser=finite,
        help="Sampling temperature sent with every model call (default: the provider's). "
        "Stored with the run.",
    ),
]
MaxOutputTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-output-tokens",
        help="Tokens one reply may have (default: the provider's; Anthropic's adapter: 4096). "
        "Stored with the run.",
    ),
]
StreamOpt = Annotated[
    bool,
    typer.Option(
        "--stream",
        help="Stream each reply from the provider (run prints its text as it arrives; the "
        "journal still holds each whole reply). Stored with the run.",
    ),
]
MetadataOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--metadata",
        metavar="KEY=VALUE",
        help="Stored with each run in runs.metadata_json (a string value; repeatable), to "
        "find runs by with SQL. The key cli is the command's own.",
    ),
]

RESERVED_METADATA = ("cli",)
"""The metadata keys the command fills in itself: ``cli``, the run's stored config."""
WritablePathsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--writable-paths",
        metavar="GLOB",
        help="Where write_file and edit_file may write: a path or glob relative to the "
        "workspace ('src', 'docs/*.md', '**/*.py'; '!GLOB' excludes). Repeatable; default: "
        "anywhere. A write elsewhere is refused (the model is told; nothing is written). The "
        "shell cannot be confined: files a command changes outside them are named to the "
        "model and in the step's edits, not undone. Stored with the run.",
    ),
]
ReadOnlyOpt = Annotated[
    bool,
    typer.Option(
        "--read-only",
        help="No writes through write_file and edit_file (as --writable-paths with no path); "
        "files a shell command changes are reported, not prevented (use --tools files to "
        "leave the shell out). Stored with the run.",
    ),
]

AllowOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow",
        metavar="PATTERN",
        help="A shell command matching this regular expression (searched anywhere in the "
        "line; anchor with ^ and $) runs. Repeatable. When rules of --allow, --ask and "
        "--forbid match one command, the strictest wins. Stored with the run.",
    ),
]
AskOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--ask",
        metavar="PATTERN",
        help="A shell command matching PATTERN waits for a person: the run parks (run exits "
        "5 printing the polyloop pending/approve/deny commands; batch lists it and exits 7), "
        "and after a decision the command approve prints continues it. Repeatable.",
    ),
]
ForbidOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--forbid",
        metavar="PATTERN",
        help="A shell command matching PATTERN is refused (the model is told why). Repeatable.",
    ),
]
ShellDefaultOpt = Annotated[
    str | None,
    typer.Option(
        "--shell-default",
        metavar="allow|ask|forbid",
        help="What a shell command no rule matches does (default: the --policy file's, else "
        "allow; ask or forbid with --allow rules makes an allow-list).",
    ),
]
PolicyOpt = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        metavar="FILE",
        help='Shell rules in a TOML file: default = "allow"|"ask"|"forbid" and [[rule]] '
        'tables of pattern, decision ("allow", "ask", "forbid") and an optional reason; '
        "joined by the rule flags' rules. Read once: its rules are stored with the run.",
    ),
]
AskMcpOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--ask-mcp",
        metavar="NAME|destructive",
        help="An MCP tool (its server's name for it) whose calls wait for a person, as --ask; "
        "destructive: every tool whose annotations do not say readOnlyHint. Repeatable; "
        "stored with the run (resume applies it to the tools the servers list again).",
    ),
]


@dataclass(frozen=True)
class RunOptions:
    """The run options as given on the command line: one field per flag, in the order
    ``--help`` lists them, annotated with its ``typer.Option`` and with the flag's default."""

    workspace: WorkspaceOpt = Path(".")
    tools: ToolsOpt = "files,shell"
    base_url: BaseUrlOpt = None
    max_steps: MaxStepsOpt = 30
    max_actions: MaxActionsOpt = None
    max_prompt_chars: MaxPromptCharsOpt = None
    max_tokens: MaxTokensOpt = None
    max_cost: MaxCostOpt = None
    price_in: PriceInOpt = None
    price_out: PriceOutOpt = None
    max_seconds: MaxSecondsOpt = None
    timeout: TimeoutOpt = None
    mcp: McpOpt = None
    mcp_prefix: McpPrefixOpt = False
    mcp_header: McpHeaderOpt = None
    mcp_include: McpIncludeOpt = None
    mcp_exclude: McpExcludeOpt = None
    same_failure_limit: SameFailureLimitOpt = 2
    no_progress_rounds: NoProgressRoundsOpt = 0
    spreading_rounds: SpreadingRoundsOpt = 0
    known_failure: KnownFailureOpt = None
    baseline: BaselineOpt = True
    temperature: TemperatureOpt = None
    max_output_tokens: MaxOutputTokensOpt = None
    stream: StreamOpt = False
    metadata: MetadataOpt = None
    writable_paths: WritablePathsOpt = None
    read_only: ReadOnlyOpt = False
    allow: AllowOpt = None
    ask: AskOpt = None
    forbid: ForbidOpt = None
    shell_default: ShellDefaultOpt = None
    policy: PolicyOpt = None
    ask_mcp: AskMcpOpt = None

    def user_metadata(self) -> dict[str, str]:
        """``--metadata KEY=VALUE`` as a dict (a later KEY wins). Raises ``BadInput`` for an
        item without ``=``, an empty key, or a key the command fills in itself."""
        out: dict[str, str] = {}
        for item in self.metadata or ():
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise BadInput(f"--metadata takes KEY=VALUE, got {item!r}")
            if key in RESERVED_METADATA:
                raise BadInput(
                    f"--metadata {key}=...: the key {key!r} is the command's own (the run's "
                    "stored config); choose another key"
                )
            out[key] = value
        return out

    def config(self, model: str) -> dict[str, Any]:
        """The config stored with each run these options start (``resume`` and ``recover``
        rebuild the run from it). Raises ``BadInput`` or ``PolyLoopError`` for a bad value."""
        config = run_config(
            model=model,
            base_url=self.base_url,
            workspace=self.workspace,
            tools=self.tools,
            max_steps=self.max_steps,
            max_actions=self.max_actions,
            max_prompt_chars=self.max_prompt_chars,
            timeout_s=self.timeout,
            budgets=self._budgets(),
            guard=self._guard(),
            stream=self.stream,
            writable_paths=self._writable(),
            sampling={
                "temperature": self.temperature,
                "max_output_tokens": self.max_output_tokens,
            },
        )
        config.update(pricing_config(self.price_in, self.price_out))
        config.update(
            mcp_config(
                self.mcp or [],
                prefix=self.mcp_prefix,
                headers=self.mcp_header or [],
                include=self.mcp_include or [],
                exclude=self.mcp_exclude or [],
                ask=self.ask_mcp or [],
            )
        )
        config.update(
            shell_policy_config(
                allow=self.allow or [],
                ask=self.ask or [],
                forbid=self.forbid or [],
                default=self.shell_default,
                policy_file=self.policy,
                shell="shell" in config["tools"],
            )
        )
        return config

    LIMITS: ClassVar[frozenset[str]] = frozenset({
        "max_steps", "max_actions", "max_prompt_chars", "max_tokens", "max_cost", "max_seconds",
        "same_failure_limit", "no_progress_rounds", "spreading_rounds", "known_failure", "baseline",
    })  # fmt: skip
    """The fields :meth:`limits` reads (with ``batch --loop``, whose factory brings the model
    and the tools, the run options that apply, and ``--metadata``)."""

    def limits(self) -> dict[str, Any]:
        """The run's limits (``Limits.to_dict()``) these options set, without a model or
        tools (``batch --loop``: the factory's Loop brings those). Raises ``BadInput`` or
        ``ConfigError``."""
        from polyloop import Limits

        return Limits(
            max_steps=self.max_steps,
            max_actions=self.max_actions,
            max_prompt_chars=self.max_prompt_chars,
            **{k: v for k, v in self._budgets().items() if v is not None},
            **self._guard().limits(),
        ).to_dict()

    def _budgets(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "max_cost": self.max_cost,
            "max_seconds": self.max_seconds,
        }

    def _writable(self) -> list[str] | None:
        if self.read_only and self.writable_paths:
            raise BadInput(
                "--read-only and --writable-paths cannot be combined: --read-only allows no "
                "writes; pass one of them"
            )
        return [] if self.read_only else self.writable_paths

    def _guard(self) -> FailureGuardArgs:
        """The failure guard as these options set it. Defaults fit runs that are not test
        loops: the baseline is on with the guard, and an MCP tool's error (``MCPToolError``,
        which the model reads and can answer with another call) never counts."""
        on = bool(self.same_failure_limit or self.no_progress_rounds or self.spreading_rounds)
        known = tuple(self.known_failure or ())
        if on and self.mcp and MCP_TOOL_ERROR not in known:
            known += (MCP_TOOL_ERROR,)
        return FailureGuardArgs(
            self.same_failure_limit,
            self.no_progress_rounds,
            self.spreading_rounds,
            known,
            self.baseline and on,
        )

    def changed(self, besides: Collection[str] = ()) -> list[str]:
        """The flags given with a value other than their default, but for the fields
        ``besides`` (for a command that uses only those, to refuse the others by name)."""
        return [
            "--" + f.name.replace("_", "-")
            for f in fields(self)
            if f.name not in besides and getattr(self, f.name) != f.default
        ]


def in_cli_words(message: str) -> str:
    """A library error's message in the command line's words: ``Limits.max_tokens`` is
    ``--max-tokens`` (each run option named by its flag), and "use None for no limit" is
    "leave it out for no limit". The one place that translates (every failure line passes
    through it: :func:`._common.fail`)."""
    for f in fields(RunOptions):
        message = message.replace(f"Limits.{f.name}", "--" + f.name.replace("_", "-"))
    message = re.sub(
        r"has no API key: pass api_key= or set (\w+) \(only a base_url on this machine needs "
        r"none; base_url=[^)]*\)",
        r"has no API key: set \1, or pass --base-url for a server on this machine (which "
        r"needs none)",
        message,
    )
    message = message.replace(
        "use Loop.resume(run_id) to continue it", "continue it with polyloop resume RUN_ID"
    )
    return message.replace("; use None for ", "; leave it out for ")


def run_options(command: F) -> F:
    """``command`` with the run options: its parameter ``options: RunOptions`` becomes the
    flags of :class:`RunOptions`' fields (listed after the command's own parameters that come before
    ``options``, and before those after it), and the command receives them parsed."""
    own = inspect.signature(command, eval_str=True)
    hints = get_type_hints(RunOptions, include_extras=True)  # the Annotated[..., Option]s
    shared = [
        inspect.Parameter(f.name, _FLAG, default=f.default, annotation=hints[f.name])
        for f in fields(RunOptions)
    ]
    names = [p.name for p in shared]
    before: list[inspect.Parameter] = []
    after: list[inspect.Parameter] = []
    seen = False
    for p in own.parameters.values():
        if p.name == "options":
            seen = True
        else:
            (after if seen else before).append(p)
    merged = [*before, *shared, *after]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        options = RunOptions(**{name: kwargs.pop(name) for name in names})
        return command(options=options, **kwargs)

    wrapper.__signature__ = own.replace(parameters=merged)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in merged}
    return wrapper  # type: ignore[return-value]
