"""polyloop.observe.redact: safe summaries and the scrubber run over exported content."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import string
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyloop.observe import DEFAULT_PATTERNS, DEFAULT_SCRUBBER, Scrubber, digest, summarize

# Every credential below is fake and is assembled only when the tests run, from split prefixes
# and seeded random characters: no string in this file is a well-formed credential, so the
# secret scanners of code hosts have nothing to flag, and none of them was ever a live key.

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
B64URL = ALNUM + "_-"


def fake(n: int, alphabet: str = ALNUM, seed: str = "") -> str:
    """``n`` characters of ``alphabet``, the same on every run for the same arguments."""
    rng = random.Random(f"{seed}/{n}/{alphabet}")
    return "".join(rng.choice(alphabet) for _ in range(n))


def b64url(data: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def pem(kind: str, lines: int = 3, newline: str = "\n") -> str:
    label = f"{kind} PRIVATE KEY".strip()
    body = newline.join(fake(64, B64, f"{kind}{i}") for i in range(lines))
    return f"-----BEGIN {label}-----{newline}{body}{newline}-----END {label}-----"


# A 40-character AWS secret access key without a / or a +: caught only where it is named or
# stands beside its key id. And one with both, which is caught anywhere.
AWS_SECRET_PLAIN = fake(40, seed="aws-plain")
AWS_SECRET_MARKED = fake(14, seed="aws1") + "/" + fake(15, seed="aws2") + "+" + fake(9, seed="aws3")
AWS_KEY_ID = "AK" + "IA" + fake(16, UPPER_DIGITS, "aws-id")
DISCORD_USER_ID = base64.b64encode(b"198622483471925248").decode()
JWT = ".".join(
    (
        b64url({"alg": "HS256", "typ": "JWT"}),
        b64url({"sub": "1234567890", "name": "Jane", "iat": 1516239022}),
        fake(43, B64URL, "jwt"),
    )
)


class Case(NamedTuple):
    """A text made of kept parts (strings) and secrets (``(secret, name)``)."""

    kind: str
    parts: tuple[str | tuple[str, str], ...]

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else p[0] for p in self.parts)

    @property
    def expected(self) -> str:
        return "".join(p if isinstance(p, str) else f"[REDACTED:{p[1]}]" for p in self.parts)

    @property
    def secrets(self) -> list[str]:
        return [p[0] for p in self.parts if not isinstance(p, str)]


def case(kind: str, *parts: str | tuple[str, str]) -> Case:
    return Case(kind, parts)


CASES = [
    # --- cloud ---------------------------------------------------------------------------------
    case("aws access key id", "export AWS_ACCESS_KEY_ID=", (AWS_KEY_ID, "aws_access_key"), "\n"),
    case(
        "aws temporary key id",
        "id ",
        ("AS" + "IA" + fake(16, UPPER_DIGITS, "asia"), "aws_access_key"),
        " expires soon",
    ),
    case(
        "aws secret key, named",
        "aws_secret_access_key = ",
        (AWS_SECRET_PLAIN, "aws_secret_key"),
        "\nregion = eu-west-1",
    ),
    case(
        "aws secret key in STS JSON",
        '{"AccessKeyId": "',
        (AWS_KEY_ID, "aws_access_key"),
        '", "SecretAccessKey": "',
        (AWS_SECRET_PLAIN, "aws_secret_key"),
        '"}',
    ),
    case(
        "aws secret key beside its key id (credentials CSV)",
        "User,Access key ID,Secret access key\nci,",
        (AWS_KEY_ID, "aws_access_key"),
        ",",
        (AWS_SECRET_PLAIN, "aws_secret_key"),
        "\n",
    ),
    case(
        "aws secret key, bare",
        "the old one was ",
        (AWS_SECRET_MARKED, "aws_secret_key"),
        " (rotated)",
    ),
    case(
        "gcp api key in a URL",
        "GET https://maps.googleapis.com/maps/api/geocode/json?key=",
        ("AI" + "za" + fake(35, B64URL, "gcp"), "google_api_key"),
        "&address=x",
    ),
    case(
        "gemini api key",
        "export GEMINI_API_KEY=",
        ("AI" + "za" + fake(35, B64URL, "gemini"), "google_api_key"),
        "\n",
    ),
    case(
        "gcp service-account private key (JSON)",
        '{"type": "service_account", "private_key": "',
        (pem("", newline="\\n"), "private_key"),
        '\\n", "project_id": "demo"}',
    ),
    case(
        "google oauth client secret",
        "client ",
        ("GOC" + "SPX-" + fake(28, B64URL, "gocspx"), "google_oauth"),
        " loaded",
    ),
    case(
        "google oauth access token",
        "token: ",
        ("ya" + "29." + fake(120, B64URL, "ya29"), "google_oauth"),
        "\n",
    ),
    case(
        "azure storage connection string",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=",
        (base64.b64encode(fake(64, seed="azure").encode()).decode(), "azure_key"),
        ";EndpointSuffix=core.windows.net",
    ),
    case(
        "azure SAS URL",
        "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sp=r&sig=",
        (fake(20, ALNUM, "sas1") + "%2B" + fake(20, ALNUM, "sas2") + "%3D", "azure_key"),
        " (expires 2030)",
    ),
    case(
        "azure AD client secret",
        "secret value ",
        (
            fake(3, seed="aad") + "8Q~" + fake(33, ALNUM + "_~.-", "aad") + "a",
            "azure_client_secret",
        ),
        " created",
    ),
    case(
        "digitalocean token",
        "doctl auth init -t ",
        ("dop" + "_v1_" + fake(64, HEX, "do"), "digitalocean_token"),
        "\n",
    ),
    case(
        "hashicorp vault token",
        "VAULT_TOKEN=",
        ("hv" + "s." + fake(95, B64URL, "vault"), "vault_token"),
        " vault kv get secret/app",
    ),
    # --- version control -----------------------------------------------------------------------
    case(
        "github classic token", "token ", ("gh" + "p_" + fake(36, seed="ghp"), "github_token"), "."
    ),
    case(
        "github oauth token", "oauth=", ("gh" + "o_" + fake(36, seed="gho"), "github_token"), "\n"
    ),
    case(
        "github app token in a clone URL",
        "git clone https://x-access-token:",
        ("gh" + "s_" + fake(36, seed="ghs"), "github_token"),
        "@github.com/o/r.git",
    ),
    case(
        "github fine-grained token",
        "GH_TOKEN=",
        ("github" + "_pat_" + fake(22, seed="pat1") + "_" + fake(59, seed="pat2"), "github_token"),
        "\n",
    ),
    case(
        "gitlab personal access token",
        "PRIVATE-TOKEN: ",
        ("gl" + "pat-" + fake(20, B64URL, "glpat"), "gitlab_token"),
        "\n",
    ),
    case(
        "bitbucket app password",
        "app password ",
        ("AT" + "BB" + fake(32, seed="atbb"), "atlassian_token"),
        " works",
    ),
    case(
        "atlassian api token",
        "jira token ",
        ("ATA" + "TT3" + fake(180, B64URL, "atatt"), "atlassian_token"),
        "\n",
    ),
    # --- chat ----------------------------------------------------------------------------------
    case(
        "slack bot token",
        "SLACK_BOT_TOKEN=",
        ("xo" + "xb-" + "1234567890-1234567890123-" + fake(24, seed="xoxb"), "slack_token"),
        "\n",
    ),
    case(
        "slack user token",
        "using ",
        ("xo" + "xp-" + "1234567890-1234567890-1234567890123-" + fake(32, HEX), "slack_token"),
        " now",
    ),
    case(
        "slack app token",
        "SLACK_APP_TOKEN=",
        ("xa" + "pp-1-A0123456789-1234567890123-" + fake(64, HEX, "xapp"), "slack_token"),
        "\n",
    ),
    case(
        "slack webhook URL",
        "POST ",
        (
            "https://hooks."
            + "slack.com/services/T0"
            + fake(8, UPPER_DIGITS, "t")
            + "/B0"
            + fake(8, UPPER_DIGITS, "b")
            + "/"
            + fake(24, seed="hook"),
            "webhook_url",
        ),
        " -> 200",
    ),
    case(
        "discord bot token",
        "DISCORD_TOKEN=",
        (
            DISCORD_USER_ID + "." + fake(6, B64URL, "d1") + "." + fake(38, B64URL, "d2"),
            "discord_token",
        ),
        "\n",
    ),
    case(
        "discord webhook URL",
        "notify ",
        (
            "https://discord." + "com/api/webhooks/123456789012345678/" + fake(68, B64URL, "dw"),
            "webhook_url",
        ),
        " ok",
    ),
    case(
        "telegram bot token in the API URL",
        "GET https://api.telegram.org/bot",
        ("123456789:A" + "A" + fake(33, B64URL, "tg"), "telegram_token"),
        "/getMe",
    ),
    # --- payment and messaging -----------------------------------------------------------------
    case(
        "stripe live secret key",
        "STRIPE_SECRET_KEY=",
        ("sk" + "_live_" + fake(24, seed="sk-live"), "stripe_key"),
        "\n",
    ),
    case(
        "stripe test secret key",
        "stripe.api_key = '",
        ("sk" + "_test_" + fake(99, seed="sk-test"), "stripe_key"),
        "'",
    ),
    case(
        "stripe restricted key",
        "key ",
        ("rk" + "_live_" + fake(99, seed="rk-live"), "stripe_key"),
        " (read-only)",
    ),
    case(
        "stripe webhook signing secret",
        "endpoint secret ",
        ("wh" + "sec_" + fake(32, seed="whsec"), "stripe_key"),
        "\n",
    ),
    case("twilio api key", "sid ", ("S" + "K" + fake(32, HEX, "twsk"), "twilio_key"), " ok"),
    case("twilio account sid", "account ", ("A" + "C" + fake(32, HEX, "twac"), "twilio_key"), "\n"),
    case(
        "sendgrid api key",
        "SENDGRID_API_KEY=",
        ("S" + "G." + fake(22, B64URL, "sg1") + "." + fake(43, B64URL, "sg2"), "sendgrid_key"),
        "\n",
    ),
    case(
        "mailgun api key",
        "curl -s --user 'api:",
        ("ke" + "y-" + fake(32, HEX, "mg"), "mailgun_key"),
        "' https://api.mailgun.net/v3",
    ),
    case(
        "shopify access token",
        "X-Shopify-Access-Token: ",
        ("shp" + "at_" + fake(32, HEX, "shp"), "shopify_token"),
        "\n",
    ),
    # --- package registries --------------------------------------------------------------------
    case(
        "npm token",
        "//registry.npmjs.org/:_authToken=",
        ("np" + "m_" + fake(36), "npm_token"),
        "\n",
    ),
    case(
        "pypi token",
        "password = ",
        ("py" + "pi-AgEIcHlwaS5vcmc" + fake(70, B64URL, "pypi"), "pypi_token"),
        "\n",
    ),
    case(
        "docker hub token",
        "docker login -u ci -p ",
        ("dck" + "r_pat_" + fake(27, B64URL, "dckr"), "docker_token"),
        "\n",
    ),
    # --- LLM providers -------------------------------------------------------------------------
    case(
        "openai project key",
        "OPENAI_API_KEY=",
        ("sk" + "-proj-" + fake(156, B64URL, "openai"), "api_key"),
        "\n",
    ),
    case(
        "openai legacy key", "key ", ("sk" + "-" + fake(48, seed="openai-old"), "api_key"), " end"
    ),
    case(
        "anthropic key",
        "x-api-key: ",
        ("sk" + "-ant-api03-" + fake(93, B64URL, "ant") + "AA", "api_key"),
        "\n",
    ),
    case(
        "hugging face token",
        "HF_TOKEN=",
        ("h" + "f_" + fake(34, string.ascii_letters, "hf"), "huggingface_token"),
        "\n",
    ),
    case("groq key", "GROQ_API_KEY=", ("gs" + "k_" + fake(52, seed="groq"), "groq_key"), "\n"),
    case(
        "replicate token",
        "REPLICATE_API_TOKEN=",
        ("r" + "8_" + fake(37, seed="r8"), "replicate_token"),
        "\n",
    ),
    case("xai key", "XAI_API_KEY=", ("xa" + "i-" + fake(80, seed="xai"), "xai_key"), "\n"),
    case("perplexity key", "key ", ("pp" + "lx-" + fake(48, seed="pplx"), "perplexity_key"), " ok"),
    case(
        "cohere key (named)",
        "COHERE_API_KEY=",
        (fake(40, seed="cohere"), "assigned_secret"),
        "\n",
    ),
    # --- tokens, keys, URLs, headers and assignments -------------------------------------------
    case("JWT", "id_token=", (JWT, "jwt"), "&state=abc"),
    case("RSA private key", "key:\n", (pem("RSA"), "private_key"), "\nthat was the key"),
    case("EC private key", "", (pem("EC"), "private_key"), "\n"),
    case("PKCS#8 private key", "", (pem(""), "private_key"), " done"),
    case("encrypted private key", "", (pem("ENCRYPTED"), "private_key"), "\n"),
    case(
        "OpenSSH private key", "$ cat ~/.ssh/id_ed25519\n", (pem("OPENSSH"), "private_key"), "\n$"
    ),
    case(
        "PGP private key block",
        "",
        (
            "-----BEGIN PGP PRIVATE " + "KEY BLOCK-----\n\n" + fake(64, B64, "pgp") + "\n=abcd\n"
            "-----END PGP PRIVATE " + "KEY BLOCK-----",
            "private_key",
        ),
        "\n",
    ),
    case(
        "private key cut off before its END line",
        "$ head -c 200 key.pem\n",
        (pem("RSA", lines=9).split("\n-----END")[0][:190] + "\n", "private_key"),
        "[output truncated]",
    ),
    case(
        "a cut-off private key, then a whole one",
        "",
        (pem("RSA").split("\n-----END")[0][:100] + "\n", "private_key"),
        (pem("EC"), "private_key"),
        "\n",
    ),
    case(
        "database URL with a password",
        "DATABASE_URL=postgresql://app:",
        (fake(20, seed="dburl"), "basic_auth_url"),
        "@db.internal:5432/app",
    ),
    case(
        "redis URL with only a password",
        "redis://:",
        (fake(16, seed="redis"), "basic_auth_url"),
        "@cache:6379/0",
    ),
    case(
        "bearer header",
        "Authorization: Bearer ",
        (fake(40, B64URL, "bearer"), "bearer"),
        "\n",
    ),
    case(
        "basic auth header",
        "-H 'Authorization: Basic ",
        (base64.b64encode(b"admin:" + fake(12).encode()).decode(), "authorization"),
        "'",
    ),
    case("password in an env file", "DB_PASSWORD=", (fake(16, seed="pw"), "assigned_secret"), "\n"),
    case("password in YAML", "  password: ", (fake(12, seed="yaml"), "assigned_secret"), "\n"),
    case("api key in JSON", '{"api_key": "', (fake(24, seed="json"), "assigned_secret"), '"}'),
    case("email address", "contact ", ("jane.doe+tag@mail.example.co.uk", "email"), " please"),
]


@pytest.mark.parametrize("wrap", ["", "ré ✓ "], ids=["ascii", "non-ascii"])
@pytest.mark.parametrize("c", CASES, ids=[c.kind for c in CASES])
def test_the_default_scrubber_removes_each_credential_and_keeps_the_rest(
    c: Case, wrap: str
) -> None:
    out = DEFAULT_SCRUBBER(wrap + c.text + wrap)
    for secret in c.secrets:
        assert secret not in out
    assert out == wrap + c.expected + wrap


SHA1 = hashlib.sha1(b"polyloop").hexdigest()
# 40 characters of the AWS secret alphabet, capitals, digits and slashes: a path, not a key.
PATH_40 = "/opt/Polyloop2/releases/Current/binaries"
NEAR_MISSES = [
    f"commit {SHA1}",
    f"fingerprint {SHA1.upper()}",
    "HEAD is now at 3f2a9c1 fix",
    f"run {uuid.UUID(int=random.Random(1).getrandbits(128))} started",
    "aGVsbG8gd29ybGQ=",
    base64.b64encode(b"The quick brown fox jumps over").decode(),  # 40 characters
    base64.b64encode(bytes(range(256))).decode(),  # long, with + and /
    "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=",
    f"ls {PATH_40}",
    "pk" + "_live_" + fake(24, seed="pk"),  # Stripe publishable keys are public by design
    "see https://example.com:8443/docs and localhost:5432",
    "at 12:30:45, v1.2.3 was released",
    "a key-value store, sk-learn and AKIA as a word",
    "the task skipped ask-me-later",
    "run 3f2a9c completed in 12 steps",
    "def f(x): return x @ y",
    "@pytest.mark.parametrize",
    "a@b",
    "sk-short",
    "Basic authentication is disabled; the password must be rotated",
]


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert DEFAULT_SCRUBBER(text) == text


def test_the_readme_lists_every_default_pattern() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("### What the scrubber redacts", 1)[1].split("\n## ", 1)[0]
    assert [name for name in DEFAULT_PATTERNS if f"(`{name}`)" not in table] == []


def test_the_near_miss_path_is_the_shape_of_a_bare_aws_secret() -> None:
    assert re.fullmatch(r"[A-Za-z0-9/+]{40}", PATH_40)


def test_a_named_secret_group_keeps_its_context() -> None:
    assert DEFAULT_SCRUBBER("Bearer abcdefghijkl") == "Bearer [REDACTED:bearer]"
    assert DEFAULT_SCRUBBER("password=swordfish1") == "password=[REDACTED:assigned_secret]"


def test_a_value_already_redacted_keeps_the_name_of_what_it_was() -> None:
    key = "sk" + "-proj-" + fake(40, seed="again")
    assert DEFAULT_SCRUBBER(f"password={key}") == "password=[REDACTED:api_key]"
    assert DEFAULT_SCRUBBER(DEFAULT_SCRUBBER(f"password={key}")) == "password=[REDACTED:api_key]"


def test_every_quantifier_of_the_default_patterns_is_bounded() -> None:
    # An unbounded repeat after a partial match is what makes a scan quadratic (or worse) on a
    # long line of the right characters; bounded ones keep the work per position constant.
    from re import _constants as c
    from re import _parser

    repeats = {c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT}

    def unbounded(items: object) -> list[str]:
        found: list[str] = []
        for op, av in items:
            if op in repeats:
                lo, hi, sub = av
                if hi == c.MAXREPEAT:
                    found.append(f"{{{lo},}}")
                found += unbounded(sub)
            elif op is c.SUBPATTERN:
                found += unbounded(av[-1])
            elif op is c.BRANCH:
                for alt in av[1]:
                    found += unbounded(alt)
            elif op in (c.ASSERT, c.ASSERT_NOT):
                found += unbounded(av[1])
            elif op is c.ATOMIC_GROUP:
                found += unbounded(av)
        return found

    bad = {name: u for name, p in DEFAULT_PATTERNS.items() if (u := unbounded(_parser.parse(p)))}
    assert bad == {}


# The default scrubber tries a pattern only where a cheap search says a match may start; a
# scrubber given the same patterns compiled gets no such search and scans the whole text, so it
# is the reference.
REFERENCE = Scrubber({name: re.compile(p) for name, p in DEFAULT_PATTERNS.items()})
CASINGS = {
    "as is": str,
    "upper": str.upper,
    "lower": str.lower,
    "swapped": str.swapcase,
    # Outside Latin-1, and two characters in lower case (but one in the folded text)
    "dotted I": lambda t: "İ " + t,
}
FRAGMENTS = [
    piece
    for c in CASES
    for text in (c.text, c.text.upper(), c.text.swapcase())
    for piece in (text, text[: len(text) // 2], text[len(text) // 2 :])
]


def test_the_reference_scrubber_runs_the_same_patterns() -> None:
    assert REFERENCE.names == DEFAULT_SCRUBBER.names


@pytest.mark.parametrize("casing", CASINGS)
def test_searching_where_matches_may_start_finds_what_a_full_scan_finds(casing: str) -> None:
    for c in CASES:
        text = CASINGS[casing](c.text)
        assert DEFAULT_SCRUBBER(text) == REFERENCE(text), c.kind


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(FRAGMENTS)
        | st.text(alphabet=" =:/+\n\"'@.-_~", max_size=3)
        | st.text(max_size=4),
        max_size=8,
    )
)
def test_searching_where_matches_may_start_changes_no_result(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert DEFAULT_SCRUBBER(text) == REFERENCE(text)


def test_patterns_replace_the_defaults_and_extra_adds_to_them() -> None:
    only = Scrubber({"ticket": r"\bTCK-\d{6}\b"})
    assert only.names == ("ticket",)
    assert only("TCK-123456 by a@example.com") == "[REDACTED:ticket] by a@example.com"
    both = Scrubber(extra={"ticket": r"\bTCK-\d{6}\b"})
    assert both.names == (*DEFAULT_PATTERNS, "ticket")
    assert both("TCK-123456 by a@example.com") == "[REDACTED:ticket] by [REDACTED:email]"


def test_a_pattern_replaced_by_name_is_scanned_in_full() -> None:
    # The search for where an email may start belongs to the default pattern, not to the name.
    mine = Scrubber(extra={"email": r"\buser\d+\b"})
    assert mine("by user42 today") == "by [REDACTED:email] today"


def test_a_bad_pattern_is_named() -> None:
    with pytest.raises(ValueError, match="scrubber pattern 'broken' does not compile"):
        Scrubber({"broken": "(unclosed"})


def test_summaries_are_lengths_and_hash_prefixes() -> None:
    assert digest("abc") == "sha256:ba7816bf8f01cfea"
    s = summarize("héllo")
    assert s.chars == 5 and s.sha256 == digest("héllo")
    assert str(s) == f"5 chars, {digest('héllo')}"
    assert digest("\ud800").startswith("sha256:")  # lone surrogates do not crash
