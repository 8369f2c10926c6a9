"""The op_id on the wire: the ``_meta`` key every ``tools/call`` carries it under, and telling
which calls were *sent* (reached the server, so may have acted) by it, for stdio (from the
transport's writes) and for HTTP (from its connections)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import mcp_types

OP_ID_META_KEY = "polyloop/op_id"
"""The key of ``params._meta`` under which every ``tools/call`` request carries PolyLoop's
``op_id`` (the same on a replay after a crash): a server may use it to de-duplicate."""


def request_meta(op_id: str) -> mcp_types.RequestParamsMeta:
    """The request's ``_meta``: an open map in the SDK's types (extra keys round-trip)."""
    meta: dict[str, Any] = {OP_ID_META_KEY: op_id}
    return meta  # type: ignore[return-value]


def op_of_message(message: Any) -> str | None:
    """The op_id of a ``tools/call`` JSON-RPC request; None for any other message."""
    if isinstance(message, mcp_types.JSONRPCRequest) and message.method == "tools/call":
        op = ((message.params or {}).get("_meta") or {}).get(OP_ID_META_KEY)
        if isinstance(op, str):
            return op
    return None


class Tracking(httpx2.AsyncBaseTransport):
    """An HTTP transport that marks a ``tools/call`` as sent once its connection opened (a
    connection that could not be opened sent nothing)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, sent: set[str]) -> None:
        self._inner = inner
        self._sent = sent

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        op = _op_of(request.content) if request.method == "POST" else None
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout):
            raise
        except BaseException:
            if op is not None:
                self._sent.add(op)
            raise
        if op is not None:
            self._sent.add(op)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _op_of(body: bytes) -> str | None:
    if OP_ID_META_KEY.encode() not in body:
        return None
    try:
        params = json.loads(body).get("params") or {}
    except (ValueError, AttributeError):
        return None
    op = (params.get("_meta") or {}).get(OP_ID_META_KEY)
    return op if isinstance(op, str) else None
