"""An MCP server on the official SDK's MCPServer (FastMCP), for the faults real servers do not
show on demand: dying mid-call, never answering, failing to start. Every tools/call it
receives is logged (tool, op_id from ``_meta``) to $FAULTY_LOG before the tool runs, so a test
sees what reached the server and with which op_id.

    python -m tests.mcp.faulty_server

Environment: FAULTY_LOG (the log file, required), FAULTY_FAIL_START=1 (exit at once with a
message on stderr), FAULTY_FAIL_START_IF=PATH (the same while PATH exists), FAULTY_BIG=1 (a tool
``big`` answering as many characters as asked, plain or as an error), FAULTY_BAD_NAME=1 (two more
tools, named ``bad name`` and ``also.bad``, which model APIs refuse),
FAULTY_RAW_ANSWERS=1 (also offer answer_raw, which answers with a hand-written line),
FAULTY_IGNORE_EOF=1 (once stdin ends, stay alive, and ignore SIGTERM and SIGHUP: only SIGKILL
ends it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(readOnlyHint=True)
DESTRUCTIVE = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False)

server = MCPServer("faulty")
# The SDK points fd 1 at stderr while it serves (a print must not break the protocol): a copy of
# the real stdout, for the lines answer_raw writes by hand.
WIRE = os.dup(1)


def _log(event: str, ctx: Context, **extra: object) -> None:
    meta = dict(ctx.request_context.meta or {})
    entry = {"event": event, "op_id": meta.get("polyloop/op_id"), **extra}
    with open(os.environ["FAULTY_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")
        f.flush()
        os.fsync(f.fileno())


@server.tool(annotations=READ_ONLY)
async def lookup(key: str, ctx: Context) -> str:
    """Look a key up (read-only)."""
    _log("lookup", ctx, key=key)
    return f"value of {key}"


@server.tool(annotations=READ_ONLY)
async def slow_lookup(seconds: float, ctx: Context) -> str:
    """Look something up slowly (read-only); logs 'cancelled' if the call is cancelled."""
    _log("slow_lookup", ctx)
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _log("cancelled", ctx)
        raise
    return f"looked up after {seconds} s"


@server.tool(annotations=DESTRUCTIVE)
async def slow_delete(name: str, seconds: float, ctx: Context) -> str:
    """Delete something slowly (destructive, not idempotent)."""
    _log("slow_delete", ctx, name=name)
    await asyncio.sleep(seconds)
    return f"deleted {name}"


@server.tool()
async def die(ctx: Context) -> str:
    """Exit the server process in the middle of the call."""
    _log("die", ctx)
    os._exit(7)


@server.tool(annotations=READ_ONLY)
async def hang(ctx: Context) -> str:
    """Never answer."""
    _log("hang", ctx)
    await asyncio.Event().wait()
    return "never"


@server.tool()
async def fail(reason: str, ctx: Context) -> str:
    """Raise an error (the result is isError)."""
    _log("fail", ctx)
    raise ToolError(reason)


if os.environ.get("FAULTY_BIG") == "1":

    @server.tool(annotations=READ_ONLY)
    async def big(chars: int, ctx: Context, error: bool = False) -> str:
        """Answer ``chars`` characters: 'a' then 'b' for the first and last thousand, 'x'
        between (read-only); with ``error``, as the error of an isError result."""
        _log("big", ctx, chars=chars)
        edge = min(1000, chars // 2)
        text = "a" * edge + "x" * (chars - 2 * edge) + "b" * edge
        if error:
            raise ToolError(text)
        return text


if os.environ.get("FAULTY_BAD_NAME") == "1":

    @server.tool(name="bad name", annotations=READ_ONLY)
    async def bad_name(ctx: Context) -> str:
        """A tool whose name has a space."""
        return "bad"

    @server.tool(name="also.bad", annotations=READ_ONLY)
    async def also_bad(ctx: Context) -> str:
        """A tool whose name has a dot."""
        return "also bad"


def _deep(request_id: object) -> str:
    """A result nested 5,000 levels deep, its id after it."""
    nested = "[" * 5000 + "]" * 5000
    result = f'{{"content":[],"deep":{nested}}}'
    return f'{{"jsonrpc":"2.0","result":{result},"id":{json.dumps(request_id)}}}'


RAW_ANSWERS: dict[str, Callable[[object], str]] = {
    # a lone surrogate (U+DCFF) as a JSON escape, in an otherwise valid answer.
    "surrogate": lambda i: (
        f'{{"jsonrpc":"2.0","id":{json.dumps(i)},'
        '"result":{"content":[{"type":"text","text":"caf\\udcff ok"}],'
        '"structuredContent":{"result":"caf\\udcff ok"},"isError":false}}'
    ),
    "deep": _deep,
    "neither": lambda i: f'{{"jsonrpc":"2.0","id":{json.dumps(i)}}}',
    # answer_raw declares an output schema (it returns a str): no structuredContent here.
    "unstructured": lambda i: (
        f'{{"jsonrpc":"2.0","id":{json.dumps(i)},'
        '"result":{"content":[{"type":"text","text":"no structure"}],"isError":false}}'
    ),
    # a valid JSON-RPC answer whose result is not a tool result (content is no list).
    "invalid": lambda i: (
        f'{{"jsonrpc":"2.0","id":{json.dumps(i)},"result":{{"content":"not a list"}}}}'
    ),
    # 2 MB of text with the id last, as the TypeScript SDK orders an answer.
    "long_id_last": lambda i: (
        '{"result":{"content":[{"type":"text","text":"' + "x" * 2_000_000 + '"}]},'
        f'"jsonrpc":"2.0","id":{json.dumps(i)}}}'
    ),
}


async def answer_raw(kind: str, ctx: Context) -> str:
    """Answer the call with the hand-written line RAW_ANSWERS[kind], then never answer it
    properly (destructive: it acts before it answers). Offered with FAULTY_RAW_ANSWERS=1."""
    _log("answer_raw", ctx, kind=kind)
    os.write(WIRE, RAW_ANSWERS[kind](ctx.request_id).encode("utf-8") + b"\n")
    await asyncio.Event().wait()
    return "never"


if __name__ == "__main__":
    flag = os.environ.get("FAULTY_FAIL_START_IF")
    if os.environ.get("FAULTY_FAIL_START") == "1" or (flag and os.path.exists(flag)):
        print("faulty: refusing to start (FAULTY_FAIL_START=1)", file=sys.stderr, flush=True)
        sys.exit(5)
    if os.environ.get("FAULTY_RAW_ANSWERS") == "1":
        server.tool(annotations=DESTRUCTIVE)(answer_raw)
    ignore_eof = os.environ.get("FAULTY_IGNORE_EOF") == "1"
    if ignore_eof:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
    server.run("stdio")
    while ignore_eof:  # stdin ended: a server that does not take that as "stop"
        time.sleep(1)
