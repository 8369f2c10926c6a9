"""Chat records (:mod:`polyloop.observe.chat_export`) as a Parquet file that Hugging Face
``datasets`` loads (``load_dataset("parquet", data_files=...)``): the same columns, one row per
run, written in row groups as the runs are read. Needs ``pyarrow`` (``polyloop[parquet]``).

A Parquet column has one type for every row, so three values are stored differently than in
the JSON Lines form: ``metadata`` is its JSON text (each run may label itself with other
keys); a message's ``content`` that is not a string (structured parts, from a ``history``) is
its JSON text; a message holds ``role``, ``content``, ``tool_calls`` and ``tool_call_id``
(other keys a ``history`` message carried are left out). Absent values are nulls.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, Mapping
from pathlib import Path
from typing import IO, Any, BinaryIO

from .chat_export import RUN_FIELDS

__all__ = ["ROWS_PER_GROUP", "chat_schema", "write_chat_parquet"]

ROWS_PER_GROUP = 64
"""Runs per Parquet row group: what is held in memory before it is written."""


def chat_schema() -> Any:
    """The ``pyarrow`` schema of a chat-record Parquet file."""
    import pyarrow as pa

    s, i, f = pa.string(), pa.int64(), pa.float64()
    call = pa.struct(
        [("id", s), ("type", s), ("function", pa.struct([("name", s), ("arguments", s)]))]
    )
    message = pa.struct(
        [("role", s), ("content", s), ("tool_calls", pa.list_(call)), ("tool_call_id", s)]
    )
    token = [("token", s), ("logprob", f), ("token_id", i)]
    logprob = pa.struct([*token, ("top_logprobs", pa.list_(pa.struct(token)))])
    usage = [(name, i) for name in ("input_tokens", "output_tokens", "cached_tokens")]
    turn = pa.struct(
        [
            ("message_index", i),
            ("step_idx", i),
            ("model", s),
            ("wrap_up", pa.bool_()),
            *usage,
            ("reasoning_tokens", i),
            ("cost_usd", f),
            ("logprobs", pa.list_(logprob)),
        ]
    )
    ints = ("steps_used", "actions_executed", "tokens_used", "usage_missing")
    floats = ("created_at", "ended_at", "cost_usd", "active_seconds")
    run: list[tuple[str, Any]] = []
    for name in RUN_FIELDS:
        kind = i if name in ints or name.endswith("_tokens") else f if name in floats else s
        run.append((name, kind))
    return pa.schema([*run, ("messages", pa.list_(message)), ("turns", pa.list_(turn))])


def _row(record: Mapping[str, Any]) -> dict[str, Any]:
    row = dict(record)
    if row["metadata"] is not None:
        row["metadata"] = json.dumps(row["metadata"], ensure_ascii=False, sort_keys=True)
    messages = []
    for message in row["messages"]:
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            message = {**message, "content": json.dumps(content, ensure_ascii=False)}
        messages.append(message)
    row["messages"] = messages
    return row


async def write_chat_parquet(
    records: AsyncIterable[Mapping[str, Any]], path: Path | BinaryIO | IO[Any]
) -> int:
    """Write ``records`` as Parquet to ``path`` (a file path, or a binary file open for
    writing, left open), ``ROWS_PER_GROUP`` runs per row group; returns the number of runs.
    After a failure the file may be partly written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = chat_schema()
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        batch: list[dict[str, Any]] = []
        async for record in records:
            batch.append(_row(record))
            n += 1
            if len(batch) == ROWS_PER_GROUP:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                batch = []
        if batch or n == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
    return n
