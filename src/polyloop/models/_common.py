"""What the model adapters do alike, with no SDK imported: the last steps of translating an
SDK's exception into a ``ModelCallError``, reading token counts, and relaying a streamed reply
to ``ModelRequest.on_delta`` while it is read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

from ..types import ModelCallError, text_nested_deeper
from ..types._checks import MAX_REPORTED

__all__ = [
    "KIND_BY_STATUS",
    "Relay",
    "add_counts",
    "arguments_object",
    "bad_response",
    "by_status",
    "content_filtered",
    "cut_off",
    "describe",
    "drain",
    "finish",
    "kind_along_mro",
    "mentions",
    "name_of",
    "one_line",
    "stream_refused",
    "too_long",
    "translating",
    "unconvertible",
]


# -- replies -----------------------------------------------------------------------------------


def arguments_object(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments from the history, for an API that takes them as an object: a
    mapping as a dict, a string holding a JSON object decoded; anything else (not JSON, not an
    object, nested more than ``MAX_NESTING`` levels) as ``{}``, as the model cannot have meant
    it to run (the interpreter refused it, and the history holds that refusal)."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str) or text_nested_deeper(arguments):
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def add_counts(*values: Any) -> Any:
    """Counts a provider reports apart and ``Usage`` holds as one (Anthropic's input and
    cache tokens, Gemini's candidates and thoughts): None when none is reported, their sum
    when every reported one can be believed, else the first that cannot (so that the kernel
    refuses the usage, as it would that count alone)."""
    given = [v for v in values if v is not None]
    if not given:
        return None
    for v in given:
        if type(v) is not int or not 0 <= v <= MAX_REPORTED:
            return v
    return sum(given)


def name_of(value: object) -> str | None:
    """``value`` when it is a non-empty str (an id, a model name), else None."""
    return value if isinstance(value, str) and value else None


def bad_response(where: str, what: str) -> ModelCallError:
    """A reply of the wrong shape: retryable ``bad_response``."""
    return ModelCallError(f"bad response from {where}: {what}", retryable=True, kind="bad_response")


def content_filtered(where: str, what: str) -> ModelCallError:
    """A reply the provider withheld or cut for its content policy: ``content_filter``, not
    retryable (the same request would be filtered again)."""
    return ModelCallError(
        f"{where} withheld the reply: {what} (the provider's content filter; "
        "the same request would be refused again)",
        retryable=False,
        kind="content_filter",
    )


# -- errors ------------------------------------------------------------------------------------

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


def unconvertible(where: str, what: str) -> ModelCallError:
    """A conversation an adapter cannot send in its API's shape: ``bad_request``, before any
    request is made."""
    return ModelCallError(
        f"cannot send the conversation to {where}: {what} "
        "(the context must hold OpenAI-format chat messages)",
        retryable=False,
        kind="bad_request",
    )


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


def finish(
    message: str,
    kind: str,
    retryable: bool,
    retry_after: float | None,
    *,
    hints: Mapping[str, str],
    secret: str | None,
) -> ModelCallError:
    """The ``ModelCallError`` an adapter raises: ``message`` with the hint for ``kind`` (if
    any), and ``secret`` (the API key) masked, as some proxies echo the key they refused and
    the message is journaled."""
    if kind in hints:
        message += f" ({hints[kind]})"
    if secret and len(secret) >= 8:
        message = message.replace(secret, "***")
    return ModelCallError(message, retryable=retryable, retry_after=retry_after, kind=kind)


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


# -- streams -----------------------------------------------------------------------------------


def cut_off(where: str, what: str) -> ModelCallError:
    """A stream that ended before its last event: a failed attempt (``connection``,
    retryable); what arrived of it is no reply."""
    return ModelCallError(
        f"the stream from {where} ended before {what}: the reply is incomplete and was dropped",
        retryable=True,
        kind="connection",
    )


def stream_refused(where: str) -> ModelCallError:
    """A stream that ended cleanly before its first event: the server's refusal to stream
    this request, not a broken connection. llama-cpp-python's server answers so (200, an event
    stream with no event) when it cannot stream a reply, a tool call chosen under
    ``tool_choice`` "auto" among them; its reason is only in its own log. Retryable, kind
    ``stream_refused``: the adapter that raises it sends its requests whole from then on, so
    the next attempt is not streamed."""
    return ModelCallError(
        f"the stream from {where} ended before its first event: the server refuses to stream "
        "this request (llama-cpp-python's server does, for a tool call under tool_choice "
        "'auto'); this model's requests are sent whole from now on, the next attempt's too",
        retryable=True,
        kind="stream_refused",
    )


async def drain(stream: Any, handle: Callable[[Any], None]) -> None:
    """Hand each event of ``stream`` (an SDK's async stream) to ``handle``, and close the
    stream whatever happens: at its end, on an error, on cancellation (the connection is
    closed then, so the provider stops generating)."""
    events: AsyncIterator[Any] = stream.__aiter__()
    try:
        async for event in events:
            handle(event)
    finally:
        close = getattr(stream, "aclose", None) or stream.close
        await close()


class Relay:
    """Passes the pieces of a streamed reply to ``on_delta`` as they arrive (nothing when it
    is None), so that the pieces of each kind concatenate to what the reply's field will be:
    where the adapter joins the parts of a field with a separator (``"\\n\\n"`` between
    reasoning summaries, say), the separator is relayed before the first piece of each part
    after the first."""

    __slots__ = ("_last", "_on_delta")

    def __init__(self, on_delta: Callable[[str, str], None] | None) -> None:
        self._on_delta = on_delta
        self._last: dict[str, object] = {}

    def __call__(self, kind: str, text: object, part: object = None, separator: str = "") -> None:
        """Relay ``text`` of ``kind``, a piece of ``part`` (any key: a block index, an item
        id); empty text, or anything but a str, is not relayed."""
        if not isinstance(text, str) or not text or self._on_delta is None:
            return
        if separator and kind in self._last and self._last[kind] != part:
            self._on_delta(kind, separator)
        self._last[kind] = part
        self._on_delta(kind, text)
