"""What every model adapter object is alike, with no SDK imported: the settings each checks
the same way at construction, the SDK client it builds (or the caller's it uses, with the
SDK's own retries off), the read-only facts (``model``, ``stream``, ``name``, ``base_url``,
``repr``) and its lifetime (``aclose``, ``async with``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, Self

from ..types import ConfigError, Pricing
from ._http import api_key_or_placeholder, redact_url

__all__ = ["Adapter", "check_max_tokens", "check_model", "check_stream", "sdk_client"]


def check_model(owner: str, model: object, example: str) -> None:
    """``ConfigError`` unless ``model`` is a non-empty name (``example`` shows one)."""
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{owner} needs a model name, e.g. {example!r}; got {model!r}")


def check_stream(owner: str, stream: object) -> None:
    """``ConfigError`` unless ``stream`` is a bool."""
    if not isinstance(stream, bool):
        raise ConfigError(f"{owner} stream must be True or False, got {stream!r}")


def check_max_tokens(owner: str, max_tokens: object, *, optional: bool = True) -> None:
    """``ConfigError`` unless ``max_tokens`` is an int > 0 (or None, when ``optional``)."""
    if optional and max_tokens is None:
        return
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
        raise ConfigError(f"{owner} max_tokens must be an int > 0, got {max_tokens!r}")


def sdk_client(
    factory: Callable[..., Any],
    client: Any,
    *,
    base_url: str | None,
    api_key: str | None,
    env: tuple[str, str],
    owner: str,
    timeout_s: float,
) -> tuple[Any, bool]:
    """``(client, owned)``: the caller's ``client`` as a copy with ``max_retries=0`` sharing its
    pool, else one ``factory`` (the SDK's client class) builds for ``base_url`` and ``api_key``
    or, when None, the variables ``env`` names (base URL, key), read now. ``TypeError`` for
    both; ``ConfigError`` naming ``owner`` for no key and a base URL not on this machine."""
    if client is not None:
        if base_url is not None or api_key is not None:
            raise TypeError(
                "pass client= or base_url=/api_key=, not both (a client brings its own)"
            )
        return client.with_options(max_retries=0), False
    base = base_url or os.environ.get(env[0]) or None
    key = api_key or os.environ.get(env[1]) or None
    key = api_key_or_placeholder(key, base, owner, env[1])
    return factory(api_key=key, base_url=base, max_retries=0, timeout=timeout_s), True


class Adapter:
    """The facts and the lifetime of a model adapter; a subclass sets ``_PROVIDER`` (the
    prefix of its ``name``) and, in its constructor, ``_model``, ``_stream``, ``_client``,
    ``_owns_client`` and ``pricing``."""

    _PROVIDER: ClassVar[str]
    _OWNER: ClassVar[str | None] = None
    """The class name ``repr`` shows; None: the object's own class."""

    _model: str
    _stream: bool
    _client: Any
    _owns_client: bool
    _closed: bool = False
    pricing: Pricing | None

    @property
    def model(self) -> str:
        """The model name sent with every request."""
        return self._model

    @property
    def base_url(self) -> str:
        """The API root requests go to (credentials in the URL, if any, shown as ``***``)."""
        return redact_url(str(self._client.base_url))

    @property
    def stream(self) -> bool:
        """Whether replies are streamed: the ``stream`` argument (for ``OpenAIModel``, until
        the server refuses to stream: then False for the rest of the object's life)."""
        return self._stream

    @property
    def name(self) -> str:
        """``"PROVIDER:MODEL"`` (``"openai:..."``, ``"openai-responses:..."``, ``"anthropic:..."``,
        ``"gemini:..."``): the model string of ``polyloop run --model``, journaled with every
        attempt this model makes."""
        return f"{self._PROVIDER}:{self._model}"

    def __repr__(self) -> str:
        owner = self._OWNER or type(self).__name__
        return f"{owner}(model={self._model!r}, base_url={self.base_url!r})"

    def _where(self) -> str:
        """The server and model a message names."""
        return f"{self.base_url} (model {self._model!r})"

    def _key(self) -> str | None:
        """The API key in use (masked in messages, as some proxies echo the key they
        refused, and messages are journaled)."""
        key = getattr(self._client, "api_key", None)
        return key if isinstance(key, str) else None

    async def _close_client(self) -> None:
        await self._client.close()

    async def aclose(self) -> None:
        """Close the client this model built (idempotent); a ``client=`` passed in stays open."""
        if self._owns_client and not self._closed:
            self._closed = True
            await self._close_client()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
