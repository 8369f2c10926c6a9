"""What the model adapters do alike in reading and writing their APIs' shapes, with no SDK
imported: the failures of a reply (one of the wrong shape, one the content filter withheld, a
conversation that cannot be sent), reading token counts into ``Usage``, and reading a stream:
closing it whatever happens, relaying its pieces to ``ModelRequest.on_delta`` while it is
read, and telling a stream cut off from one the server refused. Failures of a call are
:mod:`._errors`'s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple

from ..types import ModelCallError, Usage, text_nested_deeper
from ..types._checks import MAX_REPORTED

__all__ = [
    "Relay",
    "UsageFields",
    "add_counts",
    "arguments_object",
    "bad_response",
    "clipped",
    "content_filtered",
    "cut_off",
    "drain",
    "name_of",
    "stream_refused",
    "unconvertible",
    "usage_from",
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


class UsageFields(NamedTuple):
    """Where a provider's usage object holds the counts of ``Usage``: the fields whose sum is
    the input (``inputs``) and the output (``outputs``), and the paths (a field, or a field of
    a field) of the cached and the reasoning tokens among them."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cached: tuple[str, ...]
    reasoning: tuple[str, ...]


def _field(reported: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        reported = getattr(reported, name, None)
    return reported


def usage_from(reported: Any, fields: UsageFields) -> Usage | None:
    """The ``Usage`` of a provider's usage object (see :func:`add_counts`), read as ``fields``
    say; None when it is None or reports neither the input nor the output. The counts are
    passed on as reported: the kernel refuses a usage that cannot be believed
    (:func:`polyloop.types.usage_refusal`)."""
    if reported is None:
        return None
    prompt = add_counts(*(getattr(reported, name, None) for name in fields.inputs))
    output = add_counts(*(getattr(reported, name, None) for name in fields.outputs))
    if prompt is None and output is None:
        return None
    return Usage(
        prompt,
        output,
        cached_tokens=_field(reported, fields.cached),
        reasoning_tokens=_field(reported, fields.reasoning),
    )


def name_of(value: object) -> str | None:
    """``value`` when it is a non-empty str (an id, a model name), else None."""
    return value if isinstance(value, str) and value else None


def clipped(value: object) -> str:
    """``repr(value)``, its first 200 characters and "..." when longer (for a message)."""
    shown = repr(value)
    return shown if len(shown) <= 200 else shown[:200] + "..."


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


def unconvertible(where: str, what: str) -> ModelCallError:
    """A conversation an adapter cannot send in its API's shape: ``bad_request``, before any
    request is made."""
    return ModelCallError(
        f"cannot send the conversation to {where}: {what} "
        "(the context must hold OpenAI-format chat messages)",
        retryable=False,
        kind="bad_request",
    )


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
