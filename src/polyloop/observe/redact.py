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
import string
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import AnyStr, Final, TypeAlias

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

_Where: TypeAlias = Callable[[str, bytes], Iterable[int] | None]
"""Where the matches of a default pattern may start: ``(text, folded)`` -> positions (every
match starts at one of them; none, no match), or ``None``: scan the whole text. ``folded`` is
:func:`_fold` of the text. Python's engine tries every position of a text unless the pattern
starts with a literal; with these, a text without secrets, the common one, costs a few
substring searches per pattern, and one with secrets a match attempt per candidate."""


def _fold(text: str) -> bytes:
    """The text in one byte per character, its ASCII letters in lower case (every character
    outside Latin-1 becomes ``?``): positions in it are the text's."""
    return text.encode("latin-1", "replace").lower()


def _at(*literals: str, fold: bool = False) -> _Where:
    """Every match starts with one of ``literals``: in the text, or with ``fold`` (the literals
    in lower case) in the folded text, for the case-insensitive patterns.

    Folding is exact since those patterns match in ASCII mode (``(?a)``), where no character
    but an ASCII letter matches one (in Unicode mode the Kelvin sign matches ``k``).
    """
    if fold:
        needles = tuple(literal.encode("ascii") for literal in literals)
        return lambda text, folded: _find_all(folded, needles)
    return lambda text, folded: _find_all(text, literals)


def _find_all(hay: AnyStr, needles: tuple[AnyStr, ...]) -> list[int]:
    starts: list[int] = []
    for needle in needles:
        i = hay.find(needle)
        while i >= 0:
            starts.append(i)
            i = hay.find(needle, i + 1)
    return starts


def _if_found(*patterns: str) -> _Where:
    """The whole text is scanned when one of ``patterns`` matches, a part of every match that
    starts with a literal (and so is found at the speed of a substring search)."""
    searches = tuple(re.compile(p).search for p in patterns)

    def where(text: str, folded: bytes) -> Iterable[int] | None:
        return None if any(search(text) is not None for search in searches) else ()

    return where


_B64_CHARS: Final = frozenset(string.ascii_letters + string.digits + "/+")
_B64_TABLE: Final = bytes(int(chr(b) in _B64_CHARS) for b in range(256))


def _runs(n: int) -> _Where:
    """Where a run of exactly ``n`` characters of ``[A-Za-z0-9/+]`` starts (found in the
    folded text: folding keeps letters letters and positions)."""
    ones = b"\x01" * n

    def where(text: str, folded: bytes) -> Iterable[int] | None:
        mask = folded.translate(_B64_TABLE)
        starts: list[int] = []
        i = mask.find(ones)
        while i >= 0:
            end = mask.find(b"\x00", i + n)
            end = len(mask) if end < 0 else end
            if end - i == n:
                starts.append(i)
            i = mask.find(ones, end)
        return starts

    return where


def _union(*wheres: _Where) -> _Where:
    def where(text: str, folded: bytes) -> Iterable[int] | None:
        starts: list[int] = []
        for w in wheres:
            found = w(text, folded)
            if found is None:
                return None
            starts.extend(found)
        return starts

    return where


# How the names that assigned_secret knows start.
_SECRET_NAME_STARTS: Final = (
    "api",
    "access",
    "auth",
    "refresh",
    "session",
    "secret",
    "client",
    "passw",
    "passphrase",
)

_RULES: Final[tuple[tuple[str, str, _Where], ...]] = (
    # A private key block, whole: PEM (RSA, EC, DSA, OPENSSH, PKCS#8, ENCRYPTED) and PGP, also
    # inside JSON (a GCP service-account file). A block cut off before its END line (a capped
    # output) goes as far as the characters a key block can hold. Neither crosses a "-----", so
    # that each character is looked at by one block only.
    (
        "private_key",
        r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
        r"(?:(?:[^-]|-(?!----)){0,65536}?-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----"
        r"|(?:[A-Za-z0-9+/=\s\\:,]|-(?!----)){0,65536})",
        _at("-----BEGIN"),
    ),
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...), Anthropic (sk-ant-api03-...), DeepSeek,
    # OpenRouter (sk-or-v1-...) and the other sk- keys.
    ("api_key", r"\bsk-[A-Za-z0-9_-]{20,400}", _at("sk-")),
    # Stripe secret and restricted keys and webhook signing secrets. Publishable keys (pk_...)
    # are public by design: kept.
    (
        "stripe_key",
        r"\b(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,250}|whsec_[A-Za-z0-9]{24,250})",
        _at("sk_", "rk_", "whsec_"),
    ),
    (
        "github_token",
        r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{30,255})",
        _at("gh", "github_pat_"),
    ),
    (
        "gitlab_token",
        r"\b(?:gl(?:pat|dt|rt|ptt|ft|soat|imt|oas|agent|ffct|cbt)-[A-Za-z0-9_.-]{20,300}"
        r"|GR1348941[A-Za-z0-9_-]{20,100})",
        _at("gl", "GR1348941"),
    ),
    # Atlassian API tokens (Jira, Confluence), Bitbucket app passwords and access tokens.
    (
        "atlassian_token",
        r"\bAT(?:ATT|BB|CTT)[A-Za-z0-9_=-]{24,300}",
        _at("ATATT", "ATBB", "ATCTT"),
    ),
    (
        "slack_token",
        r"\b(?:xox[abposre]-[A-Za-z0-9-]{10,250}|xapp-\d-[A-Za-z0-9-]{10,250})",
        _at("xox", "xapp-"),
    ),
    # Incoming webhooks: whoever has the URL can post.
    (
        "webhook_url",
        r"https://(?:hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/_-]{20,200}"
        r"|(?:(?:ptb|canary)\.)?discord(?:app)?\.com/api/webhooks/\d{5,30}/[A-Za-z0-9_-]{20,200})",
        _at("https://"),
    ),
    # Discord bot token: the bot's id in base64 (digits encode to M|N|O, D|T|j|z, ...), a
    # timestamp, an HMAC.
    (
        "discord_token",
        r"(?<![A-Za-z0-9_-])[MNO][DTjz][AEIMQUYcgk][w-z0-5][A-Za-z0-9_-]{20,24}"
        r"\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}(?![A-Za-z0-9_-])",
        _if_found(r"\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27}"),
    ),
    # bot id:secret, also inside https://api.telegram.org/bot<token>/...
    (
        "telegram_token",
        r"(?<![0-9])[0-9]{5,16}:A[A-Za-z0-9_-]{34}(?![A-Za-z0-9_-])",
        _if_found(r":A[A-Za-z0-9_-]{34}"),
    ),
    # Twilio API key SIDs and account SIDs. The auth token has no shape of its own: it goes
    # where it is named (auth_token=...).
    ("twilio_key", r"\b(?:AC|SK)[0-9a-f]{32}\b", _at("AC", "SK")),
    (
        "sendgrid_key",
        r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])",
        _at("SG."),
    ),
    ("mailgun_key", r"(?<![\w-])key-[0-9a-f]{32}\b", _at("key-")),
    ("shopify_token", r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b", _at("shp")),
    ("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", _at("npm_")),
    ("pypi_token", r"\bpypi-AgE[A-Za-z0-9_-]{50,1000}", _at("pypi-")),
    ("docker_token", r"\bdckr_(?:pat|oat)_[A-Za-z0-9_-]{20,100}", _at("dckr_")),
    ("huggingface_token", r"\b(?:hf|api_org)_[A-Za-z0-9]{34}\b", _at("hf_", "api_org_")),
    ("groq_key", r"\bgsk_[A-Za-z0-9]{52}\b", _at("gsk_")),
    ("replicate_token", r"\br8_[A-Za-z0-9]{37}\b", _at("r8_")),
    ("xai_key", r"\bxai-[A-Za-z0-9]{80}\b", _at("xai-")),
    ("perplexity_key", r"\bpplx-[A-Za-z0-9]{48}\b", _at("pplx-")),
    # Google Cloud and Gemini API keys.
    ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}", _at("AIza")),
    (
        "google_oauth",
        r"\b(?:GOCSPX-[A-Za-z0-9_-]{28}|ya29\.[A-Za-z0-9_-]{20,2000})",
        _at("GOCSPX-", "ya29."),
    ),
    # Azure storage and Service Bus keys in connection strings, and SAS signatures in URLs.
    (
        "azure_key",
        r"(?:(?ai:AccountKey|SharedAccessKey)\s{0,4}=\s{0,4}|[?&]sig=)"
        r"(?P<secret>[A-Za-z0-9%+/]{20,200}={0,2})",
        _at("accountkey", "sharedaccesskey", "?sig=", "&sig=", fold=True),
    ),
    # Azure AD (Entra) application client secrets: three characters, a digit, Q~, the rest.
    (
        "azure_client_secret",
        r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])",
        _if_found("Q~"),
    ),
    (
        "digitalocean_token",
        r"\bdo[opr]_v1_[a-f0-9]{64}\b",
        _at("doo_v1_", "dop_v1_", "dor_v1_"),
    ),
    ("vault_token", r"\bhv[sbr]\.[A-Za-z0-9_-]{24,400}", _at("hv")),
    (
        "jwt",
        r"\beyJ[A-Za-z0-9_-]{8,10000}\.eyJ[A-Za-z0-9_-]{8,10000}\.[A-Za-z0-9_-]{0,10000}",
        _at("eyJ"),
    ),
    (
        "bearer",
        r"(?ai)\bbearer\s{1,8}(?P<secret>[A-Za-z0-9._~+/=-]{8,4096})",
        _at("bearer", fold=True),
    ),
    # Authorization headers with another scheme (Basic, Token) or none.
    (
        "authorization",
        r"(?ai)\bauthorization[\"']?\s{0,4}[:=]\s{0,4}[\"']?(?:(?:basic|token)\s{1,8})?"
        r"(?P<secret>[A-Za-z0-9._~+/=-]{8,4096})",
        _at("authorization", fold=True),
    ),
    # scheme://user:password@host (the user may be empty: redis://:password@host).
    ("basic_auth_url", r"://[^\s/:@]{0,256}:(?P<secret>[^\s/@]{1,256})@", _at("://")),
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
        _union(_at("aws", "secret", fold=True), _at("AKIA", "ASIA"), _runs(40)),
    ),
    (
        "aws_access_key",
        r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9]{16}\b",
        _if_found(r"A(?:3T[A-Z0-9]|KIA|SIA|BIA|CCA|GPA|IDA|ROA|IPA|NPA|NVA)[A-Z0-9]{16}"),
    ),
    # key = value assignments whose name says secret, in env files, YAML, JSON, code and
    # headers (DB_PASSWORD=..., "api_key": "...", X-Api-Key: ...); Cohere, Mistral and other
    # keys with no shape of their own are caught this way.
    (
        "assigned_secret",
        r"(?ai)(?<![A-Za-z0-9])(?:(?:api|access|auth|refresh|session)[_-]?token|api[_-]?key"
        r"|secret(?:[_-]?access)?[_-]?key|client[_-]?secret|password|passwd|passphrase)"
        r"[\"']?\s{0,4}[:=]\s{0,4}[\"']?(?P<secret>[^\s\"',;]{4,1024})",
        _at(*_SECRET_NAME_STARTS, fold=True),
    ),
    (
        "email",
        r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63}){0,8}"
        r"\.[A-Za-z]{2,24}\b",
        _if_found(r"@(?<=[A-Za-z0-9._%+-]@)[A-Za-z0-9-]{1,63}\."),
    ),
)

DEFAULT_PATTERNS: Final[Mapping[str, str]] = {name: pattern for name, pattern, _ in _RULES}
"""The default scrubber's patterns, by name, in the order they run (the README lists the
formats they cover). A pattern with a group named ``secret`` has only that group replaced
(``Bearer [REDACTED:bearer]``); otherwise the whole match is. Every quantifier is bounded, so
that a scan stays linear whatever the text."""

_WHERE: Final[Mapping[str, _Where]] = {pattern: where for _, pattern, where in _RULES}
_TOKEN_START: Final = "[REDACTED:"

_Rule: TypeAlias = tuple[str, re.Pattern[str], _Where | None, Callable[[re.Match[str]], str]]


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
    what it was). A default pattern is tried only where a cheap search shows a match may
    start, with the same result as a scan of the whole text. A scrubber is a plain callable
    ``str -> str``; any such callable can stand in for it where one is accepted.

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
            where = _WHERE.get(pattern) if isinstance(pattern, str) else None
            rules.append((name, compiled, where, _replacer(name, compiled)))
        self._rules = tuple(rules)

    @property
    def names(self) -> tuple[str, ...]:
        """The pattern names, in the order they run."""
        return tuple(name for name, *_ in self._rules)

    def __repr__(self) -> str:
        return f"Scrubber({list(self.names)!r})"

    def __call__(self, text: str) -> str:
        folded: bytes | None = None  # _fold(text), again after each replacement
        for _, pattern, where, replace in self._rules:
            starts = None
            if where is not None:
                if folded is None:
                    folded = _fold(text)
                starts = where(text, folded)
            if starts is None:
                out, count = pattern.subn(replace, text)
            else:
                out, count = _sub_at(pattern, replace, text, starts)
            if count:
                text, folded = out, None
        return text

    def scrub_all(self, texts: Iterable[str]) -> list[str]:
        """Each of ``texts``, scrubbed."""
        return [self(t) for t in texts]


def _sub_at(
    pattern: re.Pattern[str],
    replace: Callable[[re.Match[str]], str],
    text: str,
    starts: Iterable[int],
) -> tuple[str, int]:
    """``pattern.subn(replace, text)`` for a pattern whose every match starts at one of
    ``starts`` (and is not empty): the same leftmost, non-overlapping matches."""
    parts: list[str] = []
    done = 0
    for start in sorted(set(starts)):
        if start < done:
            continue
        match = pattern.match(text, start)
        if match is not None:
            parts += (text[done:start], replace(match))
            done = match.end()
    if not parts:
        return text, 0
    parts.append(text[done:])
    return "".join(parts), len(parts) // 2


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
