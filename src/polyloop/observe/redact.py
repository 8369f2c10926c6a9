"""Redaction of what leaves the owner's hands: safe summaries, and a scrubber for content.

The journal and ``polyloop export`` are the owner's data and keep everything. What is meant to
be shared or shipped elsewhere (OpenTelemetry spans, ``polyloop report`` files) carries by
default only *safe data*: lengths, sha256 hashes of arguments and content, tool names,
statuses, ids, counters and timings. Content (prompts, model text, arguments, observations,
goals, details) is included only when the caller opts in (``include_content=True``,
``--include-content``), and then every piece of it goes through a :class:`Scrubber` first.

The scrubber is a best-effort net for the secrets that most often end up in agent
trajectories, not a guarantee: opting in to content means trusting the destination.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, TypeAlias

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_SCRUBBER",
    "HASH_CHARS",
    "ContentSummary",
    "ScrubFn",
    "Scrubber",
    "digest",
    "summarize",
]

HASH_CHARS: Final = 16
"""Hex digits of sha256 kept in a summary: enough to tell contents apart and to match a value
you already have, too few to be worth storing as an index."""

ScrubFn: TypeAlias = Callable[[str], str]
"""Anything that maps exported text to the text to export."""

DEFAULT_PATTERNS: Final[Mapping[str, str]] = {
    # A private key block, whole.
    "private_key": (
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----"
    ),
    # OpenAI / Anthropic style keys: sk-..., sk-proj-..., sk-ant-...
    "api_key": r"\bsk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{16,}",
    "github_token": r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})",
    "slack_token": r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    "google_api_key": r"\bAIza[0-9A-Za-z_-]{35}",
    "aws_access_key": r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b",
    # The 40-character secret only where it is named, so that ordinary base64 survives.
    "aws_secret_key": (
        r"(?i)aws_?secret_?(?:access_?)?key[\"']?\s*[:=]\s*[\"']?(?P<secret>[A-Za-z0-9/+=]{40})"
    ),
    "jwt": r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    "bearer": r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/=-]{8,})",
    "basic_auth_url": r"(?i)\b[a-z][a-z0-9+.-]*://[^\s/:@]+:(?P<secret>[^\s/@]+)@",
    # key = value assignments whose name says secret.
    "assigned_secret": (
        r"(?i)\b(?:api[_-]?key|access[_-]?token|auth[_-]?token|secret[_-]?key|client[_-]?secret"
        r"|password|passwd)[\"']?\s*[:=]\s*[\"']?(?P<secret>[^\s\"',;]{4,})"
    ),
    "email": r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b",
}
"""The default scrubber's patterns, by name. A pattern with a group named ``secret`` has only
that group replaced (``Bearer [REDACTED:bearer]``); otherwise the whole match is."""


class Scrubber:
    """Replaces what matches any of ``patterns`` with ``[REDACTED:<name>]``.

    Args:
        patterns: name → regular expression (a string or a compiled pattern). Default:
            :data:`DEFAULT_PATTERNS` (API keys, bearer and other tokens, AWS keys, private
            keys, passwords in assignments, credentials in URLs, email addresses).
        extra: more patterns, added to ``patterns`` (a name already there is replaced).

    Patterns run in order, each over the output of the previous one. A scrubber is a plain
    callable ``str -> str``; any such callable can stand in for it where one is accepted.

    Example::

        Scrubber(extra={"ticket": r"\\bTCK-\\d{6}\\b"})      # the defaults plus one
        Scrubber({"only_keys": r"\\bsk-[A-Za-z0-9]{20,}"})  # just this one

    Raises:
        ValueError: a pattern does not compile (the message names it).
    """

    def __init__(
        self,
        patterns: Mapping[str, str | re.Pattern[str]] | None = None,
        *,
        extra: Mapping[str, str | re.Pattern[str]] | None = None,
    ) -> None:
        chosen = dict(DEFAULT_PATTERNS if patterns is None else patterns)
        chosen.update(extra or {})
        compiled: list[tuple[str, re.Pattern[str]]] = []
        for name, pattern in chosen.items():
            try:
                compiled.append((name, re.compile(pattern)))
            except re.error as exc:
                raise ValueError(f"scrubber pattern {name!r} does not compile: {exc}") from None
        self._patterns = tuple(compiled)

    @property
    def names(self) -> tuple[str, ...]:
        """The pattern names, in the order they run."""
        return tuple(name for name, _ in self._patterns)

    def __repr__(self) -> str:
        return f"Scrubber({list(self.names)!r})"

    def __call__(self, text: str) -> str:
        for name, pattern in self._patterns:
            text = pattern.sub(_replacer(name), text)
        return text

    def scrub_all(self, texts: Iterable[str]) -> list[str]:
        """Each of ``texts``, scrubbed."""
        return [self(t) for t in texts]


def _replacer(name: str) -> Callable[[re.Match[str]], str]:
    token = f"[REDACTED:{name}]"

    def replace(match: re.Match[str]) -> str:
        if "secret" in match.re.groupindex and match.group("secret") is not None:
            start, end = match.span("secret")
            whole_start = match.start()
            text = match.group(0)
            return text[: start - whole_start] + token + text[end - whole_start :]
        return token

    return replace


DEFAULT_SCRUBBER: Final = Scrubber()
"""A :class:`Scrubber` with :data:`DEFAULT_PATTERNS`."""


def digest(text: str) -> str:
    """``sha256:`` and the first :data:`HASH_CHARS` hex digits of the UTF-8 text's sha256."""
    return (
        "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    )


@dataclass(frozen=True, slots=True)
class ContentSummary:
    """What may be shared about a piece of content instead of the content itself."""

    chars: int
    """Its length in code points."""
    sha256: str
    """:func:`digest` of it."""

    def __str__(self) -> str:
        return f"{self.chars} chars, {self.sha256}"


def summarize(text: str) -> ContentSummary:
    """The safe summary of ``text``: its length and hash."""
    return ContentSummary(len(text), digest(text))
