"""Which actions of a run started by the command wait for a person: the shell rules
(``--allow``, ``--ask``, ``--forbid``, ``--shell-default``, ``--policy FILE``) and the MCP tools
that ask first (``--ask-mcp NAME|destructive``), checked once into the run's stored config and
rebuilt from it by every execution (``resume``, ``recover``, a batch's workers); and what a
person who decided on a parked action runs next to continue it.

Stored config (only the keys given, so a run without these flags keeps the config, and a batch
the run ids, it had before them)::

    "shell_policy": {"default": "allow"|"ask"|"forbid",
                     "rules": [{"pattern": ..., "decision": "allow"|"ask"|"forbid",
                                "reason"?: ...}, ...]}
    "mcp_ask": ["destructive", "NAME", ...]
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from polyloop import ConfigError

from ._badinput import BadInput

__all__ = [
    "DECISIONS",
    "DESTRUCTIVE",
    "command_policy",
    "continue_hint",
    "mcp_ask_names",
    "shell_policy_config",
]

DECISIONS = ("allow", "ask", "forbid")
"""The shell rules' decisions, in the command's words (the library's ``prompt`` is ``ask``)."""
DESTRUCTIVE = "destructive"
"""``--ask-mcp destructive``: every MCP tool whose annotations do not say read-only."""
_LIBRARY = {"allow": "allow", "ask": "prompt", "forbid": "forbid"}


def shell_policy_config(
    *,
    allow: Sequence[str],
    ask: Sequence[str],
    forbid: Sequence[str],
    default: str | None,
    policy_file: Path | None,
    shell: bool,
) -> dict[str, Any]:
    """The ``shell_policy`` config of the flags (``{}`` when none is given): the file's rules
    first, then ``--allow``, ``--ask``, ``--forbid``; ``--shell-default``, else the file's
    ``default``, else ``allow``. The file is read here, once: what is stored is its rules, so a
    resume applies the rules the run started with. Raises ``BadInput`` for an unreadable file,
    a bad rule or pattern, or rules without the shell tool."""
    rules: list[dict[str, Any]] = []
    file_default: str | None = None
    if policy_file is not None:
        file_default, rules = _read_policy(policy_file)
    for decision, patterns in (("allow", allow), ("ask", ask), ("forbid", forbid)):
        rules.extend({"pattern": p, "decision": decision} for p in patterns)
    if default is not None and default not in DECISIONS:
        raise BadInput(f"--shell-default takes allow, ask or forbid, got {default!r}")
    if not rules and default is None and file_default is None:
        return {}
    if not shell:
        raise BadInput(
            "--allow, --ask, --forbid, --shell-default and --policy are rules for the shell "
            "tool: pass --tools files,shell"
        )
    config = {"default": default or file_default or "allow", "rules": rules}
    command_policy(config)  # every pattern compiles: checked before anything is written
    return {"shell_policy": config}


def _read_policy(path: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """``--policy FILE`` (TOML): ``default = "ask"`` and ``[[rule]]`` tables of ``pattern``,
    ``decision`` and an optional ``reason``."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BadInput(f"--policy {path}: cannot read it: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadInput(f"--policy {path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - {"default", "rule"})
    if unknown:
        raise BadInput(f"--policy {path}: unknown keys {unknown} (it takes default and [[rule]])")
    default = data.get("default")
    if default is not None and default not in DECISIONS:
        raise BadInput(f"--policy {path}: default must be allow, ask or forbid, got {default!r}")
    tables = data.get("rule", [])
    if not isinstance(tables, list):
        raise BadInput(f"--policy {path}: write each rule as a [[rule]] table")
    rules = []
    for n, table in enumerate(tables, 1):
        where = f"--policy {path}: rule {n}"
        if not isinstance(table, dict) or set(table) - {"pattern", "decision", "reason"}:
            raise BadInput(f"{where}: takes pattern, decision and reason, got {table!r}")
        pattern, decision, reason = table.get("pattern"), table.get("decision"), table.get("reason")
        if not isinstance(pattern, str) or decision not in DECISIONS:
            raise BadInput(
                f"{where}: needs pattern = a regular expression and decision = allow, ask or "
                f"forbid, got {table!r}"
            )
        if reason is not None and not isinstance(reason, str):
            raise BadInput(f"{where}: reason must be text, got {reason!r}")
        rule: dict[str, Any] = {"pattern": pattern, "decision": decision}
        if reason:
            rule["reason"] = reason
        rules.append(rule)
    return default, rules


def command_policy(config: Mapping[str, Any] | None) -> Any:
    """The ``CommandPolicy`` of a stored ``shell_policy`` (None: the tools' default, which
    allows every command). Raises ``BadInput`` for a pattern that is not a regular
    expression."""
    if config is None:
        return None
    from polyloop.tools.builtin import CommandPolicy, Rule

    rules = []
    for r in config["rules"]:
        try:
            rules.append(Rule(r["pattern"], _LIBRARY[r["decision"]], r.get("reason")))  # type: ignore[arg-type]
        except ConfigError as exc:
            why = str(exc).partition("): ")[2] or str(exc)
            raise BadInput(f"--{r['decision']} {r['pattern']!r} (or --policy): {why}") from None
    return CommandPolicy(rules, default=_LIBRARY[config["default"]])  # type: ignore[arg-type]


def mcp_ask_names(asked: Sequence[str], listed: Iterable[Any]) -> list[str]:
    """The names (the server's own) of the ``listed`` tools (``MCPTool``) whose calls wait for
    a person by ``--ask-mcp``: those named, and with ``destructive`` every tool whose
    annotations do not say read-only."""
    from polyloop.tools.mcp import approval_from_annotations

    return [
        t.name
        for t in listed
        if t.name in asked or (DESTRUCTIVE in asked and approval_from_annotations(t.annotations))
    ]


def continue_hint(run_id: str, metadata: Mapping[str, Any] | None, journal: str) -> str:
    """What continues ``run_id`` once a person decided, by who started it: ``polyloop
    resume`` for a run of ``polyloop run`` or ``batch --model`` on a SQLite journal; ``polyloop
    recover`` (or the batch again) for ``batch --loop`` or a PostgreSQL journal; the code's
    ``Loop.resume`` for a run started from Python (no ``cli`` metadata)."""
    from polyloop.batch._journals import is_postgres_spec

    cli = (metadata or {}).get("cli")
    where = f" --journal {journal}"
    recover = f"polyloop recover{where} --older-than 0"
    if not isinstance(cli, dict):
        return (
            f"continue it from the code that started it, with the same tools: "
            f"await loop.resume({run_id!r}) (or loop.resume_sync({run_id!r}))"
        )
    if "loop" in cli:
        return (
            f"continue it: re-run the polyloop batch --loop {cli['loop']} command that started "
            f"it, or {recover} (which resumes every run nobody is advancing)"
        )
    if is_postgres_spec(journal):
        return f"continue it: {recover} (which resumes every run nobody is advancing)"
    return f"continue it: polyloop resume {run_id}{where}"
