"""Reading what a stdio MCP server writes: one JSON-RPC message a line, made a session message.

A line the SDK's validator takes as it is (valid UTF-8 JSON, no lone surrogate, at most
``_MAX_DEPTH`` levels deep, a valid JSON-RPC message) is handed on as it is: the common case,
at the SDK's own cost. Any other line is read again, with Python's ``json`` (which accepts a
lone surrogate such as ``\\udcff``; a byte that is not UTF-8 becomes a lone surrogate too):

* an answer to a ``tools/call`` request keeps its text as sent: the text becomes the step's
  observation, which the kernel cleans to U+FFFD and counts in ``StepRecord.replaced_chars``
  (where every tool's text is cleaned and counted);
* every other message has its text cleaned here (:func:`polyloop.types.clean_json`); nothing
  downstream counts it, so the count is logged;
* then it is validated. A line that still cannot be read (not JSON, deeper than
  ``_MAX_DEPTH``, or not a JSON-RPC message, such as an answer with neither ``result`` nor
  ``error``) and that names a request waiting for its answer (its top-level ``id``, found even
  in a line that is not JSON) becomes a JSON-RPC error for that request with the code
  :data:`MALFORMED_ANSWER`: the call fails at once, as executed, since the server ran it. A
  line that names no waiting request is logged and dropped.

A line longer than the transport's limit is never held whole (:mod:`._lines`): only its first
and last bytes reach :meth:`AnswerReader.too_long`, which fails the request they name the same
way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import Any

import mcp_types
import pydantic
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from polyloop.types import clean_json

from ._lines import TooLong

log = logging.getLogger("polyloop.tools.mcp")

MALFORMED_ANSWER = -32090
"""The JSON-RPC error code of an answer PolyLoop could not read (in the range JSON-RPC leaves to
implementations; no MCP server sends it for its own errors)."""

# Levels of arrays and objects, the message itself included: what the SDK's parser accepts.
_MAX_DEPTH = 200
_SHOWN = 200
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_COLON = re.compile(r"\s*:\s*")
# The id as the last member of an answer (``{"result":…,"jsonrpc":"2.0","id":7}``, the order the
# TypeScript SDK writes), or before a last ``"jsonrpc"`` member.
_LAST_ID = re.compile(
    r'[,{]\s*"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*'
    r'(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*\Z'
)


class AnswerReader:
    """Turns the server's lines into session messages, knowing which requests written to it
    wait for their answers (:meth:`written`)."""

    def __init__(self) -> None:
        self._waiting: dict[int | str, str] = {}  # request id -> its method

    def written(self, message: Any, ok: bool) -> None:
        """``message`` was written to the server (``ok``), or its write failed."""
        if isinstance(message, mcp_types.JSONRPCRequest):
            if ok:
                self._waiting[_key(message.id)] = message.method
            else:
                self._waiting.pop(_key(message.id), None)
        elif (
            isinstance(message, mcp_types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
        ):
            request = (message.params or {}).get("requestId")
            if isinstance(request, int | str):
                self._waiting.pop(_key(request), None)

    def read(self, line: bytes) -> SessionMessage | Exception:
        """The session message of one line; an exception for a line that is dropped (the SDK
        logs and skips those)."""
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except ValueError:
            return self._read_again(line)
        self._answered(getattr(message, "id", None), message)
        return SessionMessage(message)

    def too_long(self, line: TooLong, limit: int) -> SessionMessage | Exception:
        """What :meth:`read` gives for a line of more than ``limit`` bytes, of which only
        ``line.head`` and ``line.tail`` were kept: the failure of the request its top-level id
        names (found in its head, or as its last member), else the exception that drops it."""
        head = line.head.decode("utf-8", "surrogateescape")
        request, method = _scan_top_level(head)
        if request is None and not method:
            last = _LAST_ID.search(line.tail.decode("utf-8", "surrogateescape"))
            if last is not None:
                with contextlib.suppress(ValueError):
                    request = json.loads(last.group(1))
        why = f"its line of {line.size} bytes is longer than {limit} bytes, the most read"
        return self._malformed(head, request, why)

    def _answered(self, request: Any, message: Any) -> None:
        if isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
            self._waiting.pop(_key(request), None)

    def _read_again(self, line: bytes) -> SessionMessage | Exception:
        text = line.decode("utf-8", "surrogateescape")
        try:
            value = json.loads(text)
        except RecursionError:
            return self._malformed(text, _top_level_id(text), "it is nested too deeply")
        except ValueError as exc:
            return self._malformed(text, _top_level_id(text), f"it is not JSON ({exc})")
        # Only an answer names one of our requests (a server's own request has its own ids).
        answer = isinstance(value, dict) and "method" not in value
        request = value.get("id") if answer else None
        if _too_deep(value):
            return self._malformed(text, request, "it is nested too deeply")
        if not (answer and self._waiting.get(_key(request)) == "tools/call"):
            value, replaced = clean_json(value)
            if replaced:
                log.warning(
                    "mcp server sent %d code points that are not valid Unicode in %r; "
                    "each became U+FFFD",
                    replaced,
                    text[:_SHOWN],
                )
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_python(value, by_name=False)
        except pydantic.ValidationError as exc:
            why = _answer_problem(value) if answer else first_error(exc)
            return self._malformed(text, request, why)
        self._answered(request, message)
        return SessionMessage(message)

    def _malformed(self, text: str, request: Any, why: str) -> SessionMessage | Exception:
        """The error that fails the waiting request ``request`` at once, or (no such request)
        the exception that drops the line."""
        if _key(request) not in self._waiting:
            log.warning("mcp server sent a line that is not JSON-RPC (%s): %r", why, text[:_SHOWN])
            return ValueError(f"a line that is not JSON-RPC: {why}")
        method = self._waiting.pop(_key(request))
        log.warning("mcp server answered %s %r malformed (%s): %r", method, request, why, text[:80])
        error = mcp_types.ErrorData(code=MALFORMED_ANSWER, message=malformed(why))
        return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request, error=error))


def malformed(why: str) -> str:
    """The message of a call whose answer could not be read or accepted, for ``why``."""
    return f"its answer was malformed ({why}); the call did reach the server, so it may have acted"


def refused(exc: RuntimeError | pydantic.ValidationError) -> MCPError:
    """The error of a ``tools/call`` whose answer was read but that the SDK's ``call_tool``
    then refused (a result that is not a tool result; a tool with an output schema answering
    without valid ``structuredContent``): the error of an answer that could not be read."""
    if isinstance(exc, pydantic.ValidationError):
        why = first_error(exc)
    else:
        text = str(exc).strip()
        why = text.splitlines()[0][:_SHOWN] if text else type(exc).__name__
    return MCPError(MALFORMED_ANSWER, malformed(why))


def _key(request: Any) -> Any:
    """A request id as the session matches it (``"7"`` and ``7`` are one id); None for a value
    that is no id at all."""
    if isinstance(request, bool) or not isinstance(request, int | str):
        return None
    if isinstance(request, str):
        try:
            return int(request)
        except ValueError:
            return request
    return request


def _answer_problem(value: dict[str, Any]) -> str:
    """Why a message without a method (an answer) is not a valid JSON-RPC answer."""
    if _key(value.get("id")) is None:
        return "it has no usable id"
    if "result" not in value and "error" not in value:
        return "it has neither a result nor an error"
    kind = mcp_types.JSONRPCError if "error" in value else mcp_types.JSONRPCResponse
    try:
        kind.model_validate(value, by_name=False)
    except pydantic.ValidationError as exc:
        return first_error(exc)
    return "it is not a JSON-RPC answer"


def first_error(exc: pydantic.ValidationError) -> str:
    """The first problem pydantic found, on one line: where, then what."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}"[:_SHOWN] if where else str(first["msg"])[:_SHOWN]


def _too_deep(value: Any) -> bool:
    """Arrays and objects nested more than ``_MAX_DEPTH`` levels (an iterative walk)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if depth > _MAX_DEPTH:
            return True
        stack.extend((v, depth + 1) for v in item if isinstance(v, dict | list))
    return False


def _top_level_id(text: str) -> Any:
    """The value of the top-level ``"id"`` key of a line that is not JSON as a whole (too
    deep, or broken after its id); None when there is none, it is not a number or a string, or
    the line has a top-level ``"method"`` (a server's own request or notification, whose ids
    are not ours)."""
    found, method = _scan_top_level(text)
    return None if method else found


def _scan_top_level(text: str) -> tuple[Any, bool]:
    """The top-level ``"id"`` of ``text`` (None: none that is a number or a string) and whether
    a top-level ``"method"`` key comes before it or after, by one pass over its strings and
    brackets (``text`` may be cut anywhere after the id)."""
    depth = 0
    found = None
    for token in _STRING_OR_BRACKET.finditer(text):
        word = token.group()
        if word[0] in "[{":
            depth += 1
        elif word[0] in "]}":
            depth -= 1
        elif depth == 1 and word in ('"id"', '"method"'):
            colon = _COLON.match(text, token.end())
            if colon is None:
                continue
            if word == '"method"':
                return None, True
            try:
                found, _ = json.JSONDecoder().raw_decode(text, colon.end())
            except (ValueError, RecursionError):
                return None, False
    return (found if _key(found) is not None else None), False
