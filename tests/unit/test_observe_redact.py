"""polyloop.observe.redact: safe summaries and the scrubber run over exported content."""

from __future__ import annotations

import pytest

from polyloop.observe import DEFAULT_PATTERNS, DEFAULT_SCRUBBER, Scrubber, digest, summarize


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("key sk-abcdefghijklmnopqrstuvwx end", "api_key"),
        ("key sk-proj-Abc_def-1234567890abcdefgh end", "api_key"),
        ("key sk-ant-api03-abcdefghijklmnop_QRST end", "api_key"),
        ("Authorization: Bearer eyJhbGciOi.abc.def-ghi", "bearer"),
        ("id AKIAIOSFODNN7EXAMPLE here", "aws_access_key"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_key"),
        ("write to jane.doe+tag@mail.example.co.uk please", "email"),
        ("token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github_token"),
        ("xoxb-1234567890-abcdefghij", "slack_token"),
        ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "google_api_key"),
        ("password: hunter2hunter2", "assigned_secret"),
        ('"api_key": "abcd1234efgh"', "assigned_secret"),
        ("https://user:p4ssw0rd@db.example.com/x", "basic_auth_url"),
        (
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "jwt",
        ),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
            "private_key",
        ),
    ],
)
def test_the_default_scrubber_redacts(text: str, name: str) -> None:
    out = DEFAULT_SCRUBBER(text)
    assert f"[REDACTED:{name}]" in out, out


def test_a_named_secret_group_keeps_its_context() -> None:
    assert DEFAULT_SCRUBBER("Bearer abcdefghijkl") == "Bearer [REDACTED:bearer]"
    assert DEFAULT_SCRUBBER("password=swordfish1") == "password=[REDACTED:assigned_secret]"


@pytest.mark.parametrize(
    "text",
    [
        "the task skipped ask-me-later",
        "run 3f2a9c completed in 12 steps",
        "def f(x): return x @ y",
        "a@b",
        "sk-short",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert DEFAULT_SCRUBBER(text) == text


def test_patterns_replace_the_defaults_and_extra_adds_to_them() -> None:
    only = Scrubber({"ticket": r"\bTCK-\d{6}\b"})
    assert only.names == ("ticket",)
    assert only("TCK-123456 by a@example.com") == "[REDACTED:ticket] by a@example.com"
    both = Scrubber(extra={"ticket": r"\bTCK-\d{6}\b"})
    assert both.names == (*DEFAULT_PATTERNS, "ticket")
    assert both("TCK-123456 by a@example.com") == "[REDACTED:ticket] by [REDACTED:email]"


def test_a_bad_pattern_is_named() -> None:
    with pytest.raises(ValueError, match="scrubber pattern 'broken' does not compile"):
        Scrubber({"broken": "(unclosed"})


def test_summaries_are_lengths_and_hash_prefixes() -> None:
    assert digest("abc") == "sha256:ba7816bf8f01cfea"
    s = summarize("héllo")
    assert s.chars == 5 and s.sha256 == digest("héllo")
    assert str(s) == f"5 chars, {digest('héllo')}"
    assert digest("\ud800").startswith("sha256:")  # lone surrogates do not crash
