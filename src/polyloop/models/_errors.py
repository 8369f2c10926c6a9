"""How every model adapter turns a failure into a ``ModelCallError``, with no SDK imported:
the adapter's ``classify`` says what its SDK's exceptions mean (a :class:`Failure`: the kind,
retryability and HTTP status, by the SDK's classes and the error shapes its provider sends
inside a stream), and the :func:`translator` built on it does the rest, the same for every
provider."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Final, NamedTuple

import pydantic

from ..types import ModelCallError
from ._http import retry_after

__all__ = [
    "ERROR",
    "KIND_BY_STATUS",
    "Failure",
    "Translate",
    "by_status",
    "describe",
    "hints",
    "kind_along_mro",
    "mentions",
    "one_line",
    "translating",
    "translator",
]


KIND_BY_STATUS: Mapping[int, tuple[str, bool]] = {
    400: ("bad_request", False),
    401: ("auth", False),
    403: ("permission", False),
    404: ("not_found", False),
    408: ("timeout", True),
    409: ("conflict", True),
    422: ("bad_request", False),
    429: ("rate_limit", True),
}
"""``(kind, retryable)`` of the 4xx statuses the adapters tell apart, where no SDK class says
(other 4xx: ``error``; 5xx: ``server``)."""


def one_line(text: str) -> str:
    """``text`` with every run of white space (newlines included) as one space."""
    return " ".join(text.split())


def describe(exc: BaseException, *, with_cause: bool) -> str:
    """``exc`` on one line; ``with_cause``: followed by the exception it was raised from (a
    transport failure's reason), when that says something more."""
    text = str(exc) or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if with_cause and cause is not None and str(cause) not in ("", text):
        text += f" ({type(cause).__name__}: {cause})"
    return one_line(text)


def kind_along_mro(
    exc: BaseException, module: ModuleType, kinds: Mapping[str, tuple[str, bool]]
) -> tuple[str, bool] | None:
    """The entry of ``kinds`` for the most specific class of ``exc`` that ``module`` exports
    under that name (so an SDK version without some classes still works); None if none."""
    for cls in type(exc).__mro__:
        entry = kinds.get(cls.__name__)
        if entry is not None and getattr(module, cls.__name__, None) is cls:
            return entry
    return None


def mentions(exc: BaseException, phrases: tuple[str, ...], *extra: object) -> bool:
    """Whether the message or body of ``exc`` (or any of ``extra``) holds one of ``phrases``
    (lowercase), e.g. a provider's wording for "the prompt does not fit"."""
    body = getattr(exc, "body", None)
    parts = [str(e) for e in extra]
    parts.append(getattr(exc, "message", None) or str(exc))
    if isinstance(body, str):
        parts.append(body)
    elif body is not None:
        try:
            parts.append(json.dumps(body, default=str))
        except (TypeError, ValueError):
            parts.append(str(body))
    text = " ".join(parts).lower()
    return any(phrase in text for phrase in phrases)


def by_status(
    kind: str, retryable: bool, status: int | None, *, not_server: frozenset[int] = frozenset()
) -> tuple[str, bool]:
    """``(kind, retryable)`` of a failure whose SDK class left it ``error``, by its HTTP
    ``status``: a 5xx (but those in ``not_server``) is ``server``, a 408 ``timeout``; any
    other stays as it is."""
    if kind == "error" and status is not None:
        if status >= 500 and status not in not_server:
            return ("server", True)
        if status == 408:
            return ("timeout", True)
    return (kind, retryable)


def too_long(
    exc: BaseException, kind: str, status: int | None, phrases: tuple[str, ...], *extra: object
) -> bool:
    """Whether ``exc``, a client error (a 4xx, or an error without a status, as one sent
    inside a stream), says in its message or body (or ``extra``) that the prompt does not fit
    the model's context window, in one of the provider's ``phrases``."""
    return (
        kind in ("bad_request", "error")
        and (status is None or 400 <= status < 500)
        and mentions(exc, phrases, *extra)
    )


@contextmanager
def translating(translate: Callable[[Exception], ModelCallError | None]) -> Iterator[None]:
    """Raise ``translate(exc) from exc`` for an exception of the block; a ``ModelCallError``
    (the adapter's own) passes as it is, and so does an exception ``translate`` does not know
    (None: not the SDK's)."""
    try:
        yield
    except ModelCallError:
        raise
    except Exception as exc:
        translated = translate(exc)
        if translated is None:
            raise
        raise translated from exc


ERROR: Final = ("error", False)
"""``(kind, retryable)`` of an SDK failure nothing more specific is known of."""


class Failure(NamedTuple):
    """What an adapter's ``classify`` makes of an exception of its SDK (or its transport):
    its kind and retryability; the HTTP ``status`` it came with (None: none, as for an error
    inside a stream); ``said``, where else than its message and body it may word "the prompt
    does not fit" (an error ``code``, a body's ``details``; None: it cannot be a context-length
    error); ``cause``, whether the message shows the exception it was raised from (a
    transport's reason); ``body``, whether it is a body that is not a reply (worded ``bad
    response from ...``); ``wait``, the seconds the body asks to wait when no header does."""

    kind: str
    retryable: bool
    status: int | None = None
    said: tuple[object, ...] | None = None
    cause: bool = False
    body: bool = False
    wait: float | None = None


_NOT_A_REPLY: Final = (json.JSONDecodeError, pydantic.ValidationError)

_SHARED_HINTS: Final[Mapping[str, str]] = {
    "not_found": "check the model name and the base URL",
    "connection": "is the server running and the base URL right?",
    "context_length": "the prompt is longer than the model's context window "
    "(Limits.max_prompt_chars stops a run before this)",
}


def hints(
    auth: str, permission: str = "the API key may not use this model or endpoint"
) -> Mapping[str, str]:
    """The hint each kind's message ends with: ``auth`` and ``permission`` the provider's,
    the others the same for every provider."""
    return {"auth": auth, "permission": permission, **_SHARED_HINTS}


Translate = Callable[..., ModelCallError | None]


def translator(
    classify: Callable[[Exception, ModuleType], Failure | None],
    *,
    phrases: tuple[str, ...],
    hints: Mapping[str, str],
) -> Translate:
    """An adapter's ``translate(exc, module, where, *, secret=None)``: the ``ModelCallError``
    for ``exc``, an exception of the SDK whose exceptions ``module`` exports (or of its
    transport), from the server and model ``where`` names; None for one that is neither (it
    propagates unchanged). ``classify`` says what an exception of the SDK means (None: not
    the SDK's), ``phrases`` how its provider words "the prompt does not fit" (lowercase),
    ``hints`` what to do, by kind. Then, the same for every adapter: a body that
    is not a reply (invalid JSON, a pydantic ``ValidationError``) is a retryable
    ``bad_response``; a client error that says the prompt does not fit is ``context_length``;
    a retryable failure waits what the server asked (``retry-after-ms``, ``Retry-After``, else
    the wait its body gave); the message is one line, ends with the kind's hint, and never
    holds the key (some proxies echo the key they refused, and the message is journaled)."""

    def translate(
        exc: Exception, module: ModuleType, where: str, *, secret: str | None = None
    ) -> ModelCallError | None:
        # The SDKs decode a 200 body outside their own error handling: a truncated or invalid
        # JSON body arrives as a bare JSONDecodeError, a wrong shape as a ValidationError.
        failure: Failure | None = Failure("bad_response", True, body=True)
        if not isinstance(exc, _NOT_A_REPLY):
            failure = classify(exc, module)
        if failure is None:
            return None
        shown = describe(exc, with_cause=failure.cause)
        if failure.body:
            message = f"bad response from {where}: {type(exc).__name__}: {shown}"
        else:
            message = f"{type(exc).__name__} from {where}: {shown}"
        kind, retryable = failure.kind, failure.retryable
        if failure.said is not None and too_long(exc, kind, failure.status, phrases, *failure.said):
            kind, retryable = "context_length", False
        wait = None
        if retryable:
            wait = retry_after(getattr(exc, "response", None))
            if wait is None:
                wait = failure.wait
        if kind in hints:
            message += f" ({hints[kind]})"
        if secret and len(secret) >= 8:
            message = message.replace(secret, "***")
        return ModelCallError(message, retryable=retryable, retry_after=wait, kind=kind)

    return translate
