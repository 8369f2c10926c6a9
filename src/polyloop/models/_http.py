"""HTTP details the model adapters share: reading ``Retry-After``, showing a base URL without
its credentials, telling whether a base URL is on this machine, telling an HTTP transport's
own failures apart. No SDK or HTTP client is imported here."""

from __future__ import annotations

import email.utils
import ipaddress
import math
import time
from datetime import UTC
from typing import Any, Final
from urllib.parse import urlsplit

from ..types import ConfigError, Pricing

__all__ = [
    "NO_KEY_PLACEHOLDER",
    "api_key_or_placeholder",
    "checked_pricing",
    "is_local",
    "redact_url",
    "retry_after",
    "seconds",
    "transport_kind",
]

NO_KEY_PLACEHOLDER = "polyloop-no-key"
"""The key sent to a server on this machine when none is given (local servers need none)."""


def api_key_or_placeholder(key: str | None, base: str | None, owner: str, env_var: str) -> str:
    """``key``, or :data:`NO_KEY_PLACEHOLDER` for a ``base`` URL on this machine; without
    either, ``ConfigError`` naming ``owner`` (the adapter class) and ``env_var``."""
    if key is not None:
        return key
    if base is None or not is_local(base):
        shown = redact_url(base) if base else None
        raise ConfigError(
            f"{owner} has no API key: pass api_key= or set {env_var} "
            f"(only a base_url on this machine needs none; base_url={shown!r})"
        )
    return NO_KEY_PLACEHOLDER


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()


def is_local(url: str) -> bool:
    """Whether ``url`` names this machine (loopback, ``localhost``, or ``0.0.0.0``)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return False
    if host is None:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def seconds(text: str) -> float | None:
    """``text`` as a finite number of seconds >= 0, else None."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def retry_after(response: Any) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms``, else ``Retry-After`` as seconds
    or as an HTTP date (relative to the wall clock). None when absent or unreadable.
    ``response`` is anything with a ``headers`` mapping (an httpx response), or None."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None and (value := seconds(str(millis))) is not None:
        return value / 1000
    raw = headers.get("retry-after")
    if raw is None:
        return None
    if (value := seconds(str(raw))) is not None:
        return value
    try:
        when = email.utils.parsedate_to_datetime(str(raw))
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - time.time())


def checked_pricing(pricing: object, adapter: str) -> Pricing | None:
    """An adapter's ``pricing=`` (a :class:`polyloop.Pricing` or None), else a one-line
    ``ConfigError``. The kernel prices each attempt's usage with it for ``Limits.max_cost``."""
    if pricing is not None and not isinstance(pricing, Pricing):
        raise ConfigError(
            f"{adapter} pricing must be a polyloop.Pricing(input_per_mtok, output_per_mtok, "
            f"cached_input_per_mtok) or None, got {pricing!r}"
        )
    return pricing


# The HTTP clients the SDKs run on, by top-level module name: httpx (or its fork httpx2, which
# the installed SDKs may use instead), and aiohttp, which google-genai prefers when installed.
_HTTPX: Final = frozenset({"httpx", "httpx2", "httpcore", "httpcore2"})


def transport_kind(exc: BaseException) -> tuple[str, bool] | None:
    """``("timeout", True)`` or ``("connection", True)`` for a failure of the HTTP transport
    itself, raised through an SDK unwrapped (refused, reset, a body cut off mid-way, a read
    that timed out): httpx's ``TimeoutException`` and ``TransportError``, aiohttp's
    ``ServerTimeoutError``, ``ClientConnectionError`` and ``ClientPayloadError``, and the
    built-in ``TimeoutError`` (aiohttp's total timeout). None for any other exception. Found by
    class and module name, so that neither client needs to be importable."""
    for cls in type(exc).__mro__:
        top = cls.__module__.partition(".")[0]
        if top in _HTTPX:
            if cls.__name__ == "TimeoutException":
                return ("timeout", True)
            if cls.__name__ == "TransportError":
                return ("connection", True)
        elif top == "aiohttp":
            if cls.__name__ == "ServerTimeoutError":
                return ("timeout", True)
            if cls.__name__ in ("ClientConnectionError", "ClientPayloadError"):
                return ("connection", True)
    if isinstance(exc, TimeoutError):
        return ("timeout", True)
    return None
