"""Tools from MCP servers: the Model Context Protocol as a tool source, with replay policies
taken from the servers' own annotations (extra ``polyloop[mcp]``, on the official ``mcp`` SDK).

::

    from polyloop import Loop, ToolRegistry
    from polyloop.tools.mcp import MCPServer

    tools = ToolRegistry()
    async with MCPServer.stdio("python -m mcp_server_time") as time_server:
        await time_server.register(tools)          # beside any Python tools
        result = await Loop(model, tools=tools).run("What time is it in Tokyo?")

* **Servers.** ``MCPServer.stdio(command line)`` starts the server as a child process (its own
  process group) and stops it by pid on close; ``MCPServer.http(url, headers=...)`` talks
  Streamable HTTP. ``MCPServer.from_spec`` takes either (what ``polyloop run --mcp`` takes).
* **Tools** join a ``ToolRegistry`` with the server's JSON schemas as given; arguments are
  validated against them on the registry's usual path (an unknown tool or invalid arguments
  is ``not_executed``, with the problems in words a model can act on). A name that is already
  registered is a ``ConfigError``; ``register(prefix="time_")`` avoids it. So is a name
  model APIs refuse, unless ``register(on_skipped=...)`` is told to leave such tools out.
* **Replay policy** from the annotations: ``readOnlyHint: true`` or ``idempotentHint: true``
  gives ``idempotent``; anything else, no annotations included, ``never``
  (:func:`replay_from_annotations`); ``register(replay={"name": "never"})`` overrides it.
  The policy recorded in an action's intent is the one in force when it was written.
* **Approval**: ``register(approval=[...])`` makes the named tools wait for a person's decision
  (the run parks); :func:`approval_from_annotations` is True for a tool not marked read-only.
* **Results**: text blocks are the observation; structured content is kept as canonical
  JSON; images, audio and binary resources are one summary line each (type, size, URI) and
  saved under ``store_dir`` if given; ``isError: true`` is an executed failure the model sees;
  a long answer is cut to ``max_output_chars``.
* **Calls**: the ``op_id`` the server receives (the same on a replay after a crash), what a
  failure or a cancellation leaves: see :class:`MCPServer`.
* **Resume** lists the tools again: register them from the servers before ``Loop.resume``; a
  tool that vanished is treated like a Python tool that vanished (a ``never`` action of it
  ends ``resume_state_unknown``).
"""

from __future__ import annotations

try:
    import mcp as _mcp  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("polyloop.tools.mcp needs the MCP SDK: pip install 'polyloop[mcp]'") from exc

from ._ops import OP_ID_META_KEY
from ._server import MCPServer, MCPServerError
from ._texts import DEFAULT_MCP_TEXTS, MCPTexts
from ._tools import MCPTool, approval_from_annotations, replay_from_annotations

__all__ = [
    "DEFAULT_MCP_TEXTS",
    "OP_ID_META_KEY",
    "MCPServer",
    "MCPServerError",
    "MCPTexts",
    "MCPTool",
    "approval_from_annotations",
    "replay_from_annotations",
]
