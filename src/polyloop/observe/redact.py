"""Redaction of what leaves the owner's hands: safe summaries, and a scrubber for content.

The journal and ``polyloop export`` are the owner's data and keep everything. What is meant to
be shared or shipped elsewhere (OpenTelemetry spans, ``polyloop report`` files) carries by
default only *safe data*: lengths, sha256 hashes of arguments and content, tool names,
statuses, ids, counters and timings. Content (prompts, model text, arguments, observations,
goals, details) is included only when the caller opts in (``include_content=True``,
``--include-content``), and then every piece of it goes through a :class:`Scrubber` first.

The scrubber is a best-effort net for the secrets that most often end up in agent
trajectories, not a guarantee: opting in to content means trusting the destination. Its
default patterns know some fifty formats (the README's table lists them): keys and tokens that
announce themselves by a prefix or a shape, and secrets that only a name next to them gives
away (``DB_PASSWORD=...``, ``"api_key": ...``, ``Authorization: Basic ...``, a password in a
URL). A bare 40-character AWS secret access key has no prefix: it is redacted only where its
characters rule out the usual look-alikes (see ``aws_secret_key``), which about 69% of keys
do; the others where named or next to their key id. Stripe publishable keys (``pk_live_...``)
are public by design and kept.
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

_RULES: Final[tuple[tuple[str, str], ...]] = (
    # A private key block, whole: PEM (RSA, EC, DSA, OPENSSH, PKCS#8, ENCRYPTED) and PGP, also
    # inside JSON (a GCP service-account file). A block cut off before its END line (a capped
    # output) goes as far as the characters a key block can hold. Neither crosses a "-----", so
    # that each character is looked at by one block only.
    (
        "private_key",
        r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?:[^-]|-(?!----)){0,65536}?-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=\s\\:,]|-(?!----)){0,65536})",
    ),
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...), Anthropic (sk-ant-api03-...), DeepSeek,
    # OpenRouter (sk-or-v1-...) and the other sk- keys.
    ("api_key", r"\bsk-[A-Za-z0-9_-]{20,400}"),
    # Stripe secret and restricted keys and webhook signing secrets. Publishable keys (pk_...)
    # are public by design: kept.
    (
        "stripe_key",
        r"\b(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,250}|whsec_[A-Za-z0-9]{24,250})",
    ),
    (
        "github_token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{30,255})",
    ),
    (
        "gitlab_token",
        r"\b(?:gl(?:pat|dt|rt|ptt|ft|soat|imt|oas|agent|ffct|cbt)-[A-Za-z0-9_.-]{20,300}"
        r"|GR1348941[A-Za-z0-9_-]{20,100})",
    ),
    # Atlassian API tokens (Jira, Confluence), Bitbucket app passwords and access tokens.
    (
        "atlassian_token",
        r"\bAT(?:ATT|BB|CTT)[A-Za-z0-9_=-]{24,300}",
    ),
    (
        "slack_token",
        r"\b(?:xox[abposre]-[A-Za-z0-9-]{10,250}|xapp-\d-[A-Za-z0-9-]{10,250})",
    ),
    # Incoming webhooks: whoever has the URL can post.
    (
        "webhook_url",
        r"https://(?:hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_-]{20,200}"
        r"|(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/\d{5,30}/[A-Za-z0-9_-]{20,200})",
    ),
    # Discord bot token: the bot's id in base64 (digits encode to M|N|O, D|T|j|z, ...), a
    # timestamp, an HMAC.
    (
        "discord_token",
        r"(?<![A-Za-z0-9_-])[MNO][DTjz][AEIMQUYcgk][w-z0-5][A-Za-z0-9_-]{20,24}"
        r"\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}(?![A-Za-z0-9_-])",
    ),
    # bot id:secret, also inside https://api.telegram.org/bot<token>/...
    (
        "telegram_token",
        r"(?<![0-9])[0-9]{5,16}:A[A-Za-z0-9_-]{34}(?![A-Za-z0-9_-])",
    ),
    # Twilio API key SIDs and account SIDs. The auth token has no shape of its own: it goes
    # where it is named (auth_token=...).
    ("twilio_key", r"\b(?:AC|SK)[0-9a-f]{32}\b"),
    (
        "sendgrid_key",
        r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])",
    ),
    ("mailgun_key", r"(?<![\w-])key-[0-9a-f]{32}\b"),
    ("shopify_token", r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b"),
    ("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b"),
    ("pypi_token", r"\bpypi-AgE[A-Za-z0-9_-]{50,1000}"),
    ("docker_token", r"\bdckr_(?:pat|oat)_[A-Za-z0-9_-]{20,100}"),
    ("huggingface_token", r"\b(?:hf|api_org)_[A-Za-z0-9]{34}\b"),
    ("groq_key", r"\bgsk_[A-Za-z0-9]{52}\b"),
    ("replicate_token", r"\br8_[A-Za-z0-9]{37}\b"),
    ("xai_key", r"\bxai-[A-Za-z0-9]{80}\b"),
    ("perplexity_key", r"\bpplx-[A-Za-z0-9]{48}\b"),
    # Google Cloud and Gemini API keys.
    ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    (
        "google_oauth",
        r"\b(?:GOCSPX-[A-Za-z0-9_-]{28}|ya29\.[A-Za-z0-9_-]{20,2000})",
    ),
    # Azure storage and Service Bus keys in connection strings, and SAS signatures in URLs.
    (
        "azure_key",
        r"(?:(?ai:AccountKey|SharedAccessKey)\s{0,4}=\s{0,4}|[?&]sig=)"
        r"(?P<secret>[A-Za-z0-9%+/]{20,200}={0,2})",
    ),
    # Azure AD (Entra) application client secrets: three characters, a digit, Q~, the rest.
    (
        "azure_client_secret",
        r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
    ),
    (
        "digitalocean_token",
        r"\bdo[opr]_v1_[a-f0-9]{64}\b",
    ),
    ("vault_token", r"\bhv[sbr]\.[A-Za-z0-9_-]{24,400}"),
    (
        "jwt",
        r"\beyJ[A-Za-z0-9_-]{8,10000}\.eyJ[A-Za-z0-9_-]{8,10000}\.[A-Za-z0-9_-]{0,10000}",
    ),
    (
        "bearer",
        r"(?ai)\bbearer\s{1,8}(?P<secret>[A-Za-z0-9._~+/=-]{8,4096})",
    ),
    # Authorization headers with another scheme (Basic, Token) or none.
    (
        "authorization",
        r"(?ai)\bauthorization[\"']?\s{0,4}[:=]\s{0,4}[\"']?(?:(?:basic|token)\s{1,8})?"
        r"(?P<secret>[A-Za-z0-9._~+/=-]{8,4096})",
    ),
    # scheme://user:password@host (the user may be empty: redis://:password@host).
    ("basic_auth_url", r"://[^\s/:@]{0,256}:(?P<secret>[^\s/@]{1,256})@"),
    # The 40-character secret access key: where it is named, right after its key id, or bare.
    # Bare, it must stand alone (no [A-Za-z0-9/+] next to it, nor = after it) and hold a small
    # letter, a capital, a digit and a / or + but at most two / (about 69% of keys): hex digests
    # (git SHAs), UUIDs, paths and the base64 of text fail one of these, and the other keys are
    # caught where named or next to their id. Before aws_access_key, which would hide the id.
    (
        "aws_secret_key",
        r"(?:(?ai:aws_?secret_?(?:access_?)?key|secret_?access_?key)[\"']?\s{0,4}[:=]\s{0,4}[\"']?"
        r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}[\s,;:|\"'=]{1,8}"
        r"|(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{0,39}[/+])(?=[A-Za-z0-9/+]{0,39}[a-z])"
        r"(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[0-9])"
        r"(?![A-Za-z0-9+]{0,39}/[A-Za-z0-9+]{0,39}/[A-Za-z0-9+]{0,39}/))"
        r"(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    ),
    (
        "aws_access_key",
        r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b",
    ),
    # key = value assignments whose name says secret, in env files, YAML, JSON, code and
    # headers (DB_PASSWORD=..., "api_key": "...", X-Api-Key: ...); Cohere, Mistral and other
    # keys with no shape of their own are caught this way.
    (
        "assigned_secret",
        r"(?ai)(?<![A-Za-z0-9])(?:(?:api|access|auth|refresh|session)[_-]?token|api[_-]?key"
        r"|secret(?:[_-]?access)?[_-]?key|client[_-]?secret|password|passwd|passphrase)"
        r"[\"']?\s{0,4}[:=]\s{0,4}[\"']?(?P<secret>[^\s\"',;]{4,1024})",
    ),
    (
        "email",
        r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}"
        r"\.[A-Za-z]{2,24}\b",
    ),
)

DEFAULT_PATTERNS: Final[Mapping[str, str]] = dict(_RULES)
"""The default scrubber's patterns, by name, in the order they run (the README lists the
formats they cover). A pattern with a group named ``secret`` has only that group replaced
(``Bearer [REDACTED:bearer]``); otherwise the whole match is. Every quantifier is bounded, so
that a scan stays linear whatever the text."""

_TOKEN_START: Final = "[REDACTED:"

_Rule: TypeAlias = tuple[str, re.Pattern[str], Callable[[re.Match[str]], str]]


class Scrubber:
    """Replaces what matches any of ``patterns`` with ``[REDACTED:<name>]``.

    Args:
        patterns: name → regular expression (a string or a compiled pattern). Default:
            :data:`DEFAULT_PATTERNS` (about fifty credential formats: cloud, version control,
            chat, payment, package registry and model provider keys, JWTs, private keys,
            credentials in URLs and headers, secrets in assignments; and email addresses).
        extra: more patterns, added to ``patterns`` (a name already there is replaced).

    Patterns run in order, each over the output of the previous one; what an earlier one has
    redacted is not redacted again (``password=[REDACTED:api_key]`` keeps the name that says
    what it was). A scrubber is a plain callable ``str -> str``; any such callable can stand in
    for it where one is accepted.

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
        rules: list[_Rule] = []
        for name, pattern in chosen.items():
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"scrubber pattern {name!r} does not compile: {exc}") from None
            rules.append((name, compiled, _replacer(name, compiled)))
        self._rules = tuple(rules)

    @property
    def names(self) -> tuple[str, ...]:
        """The pattern names, in the order they run."""
        return tuple(name for name, *_ in self._rules)

    def __repr__(self) -> str:
        return f"Scrubber({list(self.names)!r})"

    def __call__(self, text: str) -> str:
        for _, pattern, replace in self._rules:
            text = pattern.sub(replace, text)
        return text

    def scrub_all(self, texts: Iterable[str]) -> list[str]:
        """Each of ``texts``, scrubbed."""
        return [self(t) for t in texts]


def _replacer(name: str, pattern: re.Pattern[str]) -> Callable[[re.Match[str]], str]:
    token = f"[REDACTED:{name}]"
    has_secret = "secret" in pattern.groupindex

    def replace(match: re.Match[str]) -> str:
        start, end = match.span("secret") if has_secret else (-1, -1)
        if start < 0:  # no such group, or it took no part in the match
            start, end = match.span()
        if match.string.startswith(_TOKEN_START, start):
            return match.group(0)
        whole = match.start()
        text = match.group(0)
        return text[: start - whole] + token + text[end - whole :]

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
