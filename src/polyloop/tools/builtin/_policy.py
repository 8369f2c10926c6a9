"""Which shell commands may run: rules that allow, ask for approval, or forbid.

A rule's pattern is a regular expression searched for anywhere in the command line
(``re.search``; anchor it with ``^`` and ``$`` to match the whole line). When several rules
match, the strictest wins (``forbid`` > ``prompt`` > ``allow``; between equals, the first
listed); when none matches, the policy's ``default`` applies. ``CommandPolicy()`` allows
everything; :meth:`CommandPolicy.strict` asks for approval of every command no rule allows.

A policy over command *text* guards against mistakes, not against an adversary: a shell offers
endless ways to spell a command (``r''m``, ``$(printf rm)``, a script written by ``write_file``
and then run). Run untrusted agents in an operating-system sandbox as well.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from polyloop.types import ConfigError

__all__ = ["Approver", "CommandPolicy", "PolicyDecision", "Rule", "Verdict"]

PolicyDecision: TypeAlias = Literal["allow", "prompt", "forbid"]
"""``allow``: run it; ``prompt``: run it only if the approval callback says yes;
``forbid``: never run it."""

Approver: TypeAlias = Callable[[str], bool | Awaitable[bool]]
"""``approve(command) -> bool`` (sync or async): may this command run? Only ``True`` approves.
A sync callback runs in a worker thread, so it may block (e.g. ask on a terminal)."""

_RANK: dict[str, int] = {"allow": 0, "prompt": 1, "forbid": 2}


def _check_decision(where: str, decision: object) -> PolicyDecision:
    if decision == "allow" or decision == "prompt" or decision == "forbid":
        return decision
    raise ConfigError(f"{where}: decision must be 'allow', 'prompt' or 'forbid', got {decision!r}")


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule of a :class:`CommandPolicy`.

    Args:
        pattern: a regular expression, searched for anywhere in the command line.
        decision: ``"allow"``, ``"prompt"`` or ``"forbid"``.
        reason: optional words shown to the model when this rule stops a command (e.g. "use
            the deploy script instead").

    Raises:
        ConfigError: the pattern is not a valid regular expression, or the decision unknown.
    """

    pattern: str
    decision: PolicyDecision
    reason: str | None = None
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"Rule({self.pattern!r})"
        _check_decision(where, self.decision)
        if not isinstance(self.pattern, str):
            raise ConfigError(f"{where}: pattern must be a str (a regular expression)")
        try:
            regex = re.compile(self.pattern)
        except re.error as exc:
            raise ConfigError(f"{where}: not a valid regular expression: {exc}") from exc
        object.__setattr__(self, "_regex", regex)

    def matches(self, command: str) -> bool:
        """Whether the pattern occurs anywhere in ``command``."""
        return self._regex.search(command) is not None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a :class:`CommandPolicy` decided for one command, and why.

    Attributes:
        decision: the decision that applies.
        rule: the rule that decided it; None when no rule matched and the default applied.
    """

    decision: PolicyDecision
    rule: Rule | None = None


@dataclass(frozen=True, slots=True)
class CommandPolicy:
    """Rules deciding whether a shell command runs (see the module docstring).

    Args:
        rules: the rules, in order (a list is accepted and kept as a tuple).
        default: the decision when no rule matches; ``"allow"`` unless you say otherwise.
            ``"forbid"`` with ``allow`` rules makes an allow-list.

    Raises:
        ConfigError: a rule is not a :class:`Rule`, or the default is unknown.
    """

    rules: Sequence[Rule] = ()
    default: PolicyDecision = "allow"

    def __post_init__(self) -> None:
        rules = tuple(self.rules)
        for rule in rules:
            if not isinstance(rule, Rule):
                raise ConfigError(
                    f"CommandPolicy: rules must be Rule(pattern, decision) objects, got {rule!r}"
                )
        object.__setattr__(self, "rules", rules)
        _check_decision("CommandPolicy default", self.default)

    @classmethod
    def strict(cls, rules: Iterable[Rule] = ()) -> CommandPolicy:
        """A policy that asks for approval of every command no rule allows or forbids."""
        return cls(tuple(rules), default="prompt")

    def decide(self, command: str) -> Verdict:
        """The verdict for ``command``: the strictest matching rule, else the default."""
        chosen: Rule | None = None
        for rule in self.rules:
            if rule.matches(command) and (
                chosen is None or _RANK[rule.decision] > _RANK[chosen.decision]
            ):
                chosen = rule
        if chosen is None:
            return Verdict(self.default)
        return Verdict(chosen.decision, chosen)
