"""What the real-model scenarios share: a client that keeps every request and response it
exchanged with the server, the journal's tables read back with plain SQL, and the checks that
tie the two together (the step records and ``model_calls`` rows against the wire)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from polyloop.models.openai import OpenAIModel
from polyloop.testing.real_model import MODEL_ALIAS, LlamaServer

CHAT = "/chat/completions"


def canonical(value: Any) -> str:
    """kernel.md's canonical JSON, written out here so the checks do not lean on PolyLoop's."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Exchange:
    """One chat completion as it crossed the wire: the JSON body sent, the status and the JSON
    body received."""

    sent: dict[str, Any]
    status: int | None = None
    received: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = self.received["choices"][0]["message"]
        return message


class Wire:
    """An ``openai.AsyncOpenAI`` for ``server`` (API key "x") whose httpx hooks keep every chat
    completion exchanged, in order. ``on_sent`` is called once a request's body is fully
    written to the socket (httpcore's trace), before any answer can come back."""

    def __init__(self, base_url: str, on_sent: Any = None) -> None:
        self.exchanges: list[Exchange] = []
        self._on_sent = on_sent
        self.client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key="x",
            max_retries=0,
            # The SDK's own httpx client class (its httpx may be the httpx2 fork): hooks and
            # httpcore's trace extension work the same on both.
            http_client=openai.DefaultAsyncHttpxClient(
                event_hooks={"request": [self._request], "response": [self._response]},
                timeout=180.0,
            ),
        )

    def model(self, **options: Any) -> OpenAIModel:
        """An ``OpenAIModel`` on this client: greedy decoding, short replies."""
        options.setdefault("temperature", 0.0)
        options.setdefault("max_tokens", 64)
        return OpenAIModel(MODEL_ALIAS, client=self.client, **options)

    async def _request(self, request: Any) -> None:
        if request.url.path.endswith(CHAT):
            self.exchanges.append(Exchange(json.loads(request.content)))
            if self._on_sent is not None:
                request.extensions = {**request.extensions, "trace": self._trace}

    async def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event == "http11.send_request_body.complete":
            self._on_sent()

    async def _response(self, response: Any) -> None:
        if response.request.url.path.endswith(CHAT):
            await response.aread()
            exchange = self.exchanges[-1]
            exchange.status = response.status_code
            exchange.received = json.loads(response.content)

    async def aclose(self) -> None:
        await self.client.close()


def wire_chars(sent: dict[str, Any]) -> int:
    """kernel.md §7's prompt_chars, measured on a request body as sent: every message's content,
    every tool call's name and arguments string, and the canonical JSON of the tools ("[]"
    when none were sent)."""
    chars = 0
    for message in sent["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif content is not None:
            chars += len(canonical(content))
        for call in message.get("tool_calls") or ():
            chars += len(call["function"]["name"]) + len(call["function"]["arguments"])
    return chars + len(canonical(sent.get("tools", [])))


def raw_response(exchange: Exchange) -> str:
    """kernel.md §7's raw_response of a reply as received."""
    text = exchange.message.get("content") or ""
    calls = exchange.message.get("tool_calls") or []
    if not calls:
        return text
    shown = [
        {
            "id": c.get("id") or None,
            "name": c["function"]["name"],
            "arguments": c["function"]["arguments"],
        }
        for c in calls
    ]
    return text + "\n" + canonical(shown)


# -- the journal, read back with SQL ------------------------------------------------------------


def table(db: Path, sql: str, *args: Any) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute(sql, args)]
    finally:
        conn.close()


def steps(db: Path, run_id: str) -> list[dict[str, Any]]:
    return table(db, "SELECT * FROM steps WHERE run_id = ? ORDER BY step_idx", run_id)


def model_calls(db: Path, run_id: str) -> list[dict[str, Any]]:
    return table(
        db, "SELECT * FROM model_calls WHERE run_id = ? ORDER BY step_idx, attempt", run_id
    )


def run_row(db: Path, run_id: str) -> dict[str, Any]:
    (row,) = table(db, "SELECT * FROM runs WHERE run_id = ?", run_id)
    return row


def journal_kinds(db: Path, run_id: str) -> list[str]:
    rows = table(db, "SELECT kind FROM journal WHERE run_id = ? ORDER BY seq", run_id)
    return [r["kind"] for r in rows]


def assert_journal_matches_wire(db: Path, run_id: str, exchanges: list[Exchange]) -> None:
    """Every attempt in ``model_calls`` is one exchange on the wire, in order, and the records
    say what crossed it: a 200's completion id is the attempt's and its step's
    ``llm_call_id``, its usage is the attempt's tokens, its reply is the step's
    ``raw_response``; a refused request is a ``failed`` attempt whose step has no
    ``llm_call_id``; and each step's ``prompt_chars`` is the size of the request sent for it.
    Attempts lost in a crash (``uncertain``) were another process's exchanges: they are only
    checked to hold no reply."""
    calls = model_calls(db, run_id)
    for lost in (c for c in calls if c["state"] == "uncertain"):  # sent by a process now dead
        assert (lost["llm_call_id"], lost["input_tokens"], lost["output_tokens"]) == (None,) * 3
    calls = [c for c in calls if c["state"] != "uncertain"]
    by_step = {s["step_idx"]: s for s in steps(db, run_id)}
    assert len(calls) == len(exchanges), (calls, [e.status for e in exchanges])
    for call, exchange in zip(calls, exchanges, strict=True):
        step = by_step.get(call["step_idx"])
        if exchange.status == 200:
            completion_id = exchange.received["id"]
            usage = exchange.received["usage"]
            assert completion_id
            assert call["state"] == "ok"
            assert call["llm_call_id"] == completion_id
            assert call["input_tokens"] == usage["prompt_tokens"] > 0
            assert call["output_tokens"] == usage["completion_tokens"] is not None
            assert step is not None
            assert step["llm_call_id"] == completion_id
            assert step["raw_response"] == raw_response(exchange)
        else:
            assert call["state"] == "failed"
            assert call["llm_call_id"] is None
            assert step is None or step["llm_call_id"] is None
        if step is not None:
            assert step["prompt_chars"] == wire_chars(exchange.sent)
    assert set(by_step) <= {c["step_idx"] for c in calls}, "a step without a model call"


def tools_sent(exchange: Exchange) -> list[str]:
    return [t["function"]["name"] for t in exchange.sent.get("tools", [])]


def forced(name: str) -> dict[str, Any]:
    """A ``tool_choice`` that makes the server call ``name`` (its arguments generated under a
    grammar of the tool's JSON schema, so they are always valid JSON of that shape)."""
    return {"type": "function", "function": {"name": name}}


def served(server: LlamaServer) -> int:
    return server.requests_served()
