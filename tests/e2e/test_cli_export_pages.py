"""``polyloop export`` streams: every format reads the runs a page at a time and writes each
run's rows as they come, and the files are those one unpaged read wrote (JSON Lines byte for
byte; Parquet with the same rows and columns), on a SQLite journal of 50 runs, several created
at the same instant."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from polyloop.cli import _reading, _render
from polyloop.journal import SQLiteJournal
from polyloop.observe import chat_export
from tests.durability.test_list_runs_pages import IDS, Unpaged, make_runs

pytest.importorskip("typer")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


async def unpaged_steps(path: Path) -> list[dict[str, Any]]:
    """The step export's rows as one ``list_runs()`` gave them."""
    async with SQLiteJournal(path, read_only=True) as j:
        rows = []
        for run in await j.list_runs():
            usage = await j.step_usage(run["run_id"])
            for step in await j.steps(run["run_id"]):
                rows.append(_render.export_row(run, step, usage.get(step.step_idx), redact=False))
        return rows


async def unpaged_chat(path: Path) -> str:
    async with SQLiteJournal(path, read_only=True) as j:
        records = chat_export.chat_records(Unpaged(j))
        return "".join([json.dumps(r, ensure_ascii=False) + "\n" async for r in records])


def test_every_format_pages_and_writes_what_one_read_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j.db"

    def opened() -> Any:
        return SQLiteJournal(path)

    asyncio.run(make_runs(opened))
    steps = asyncio.run(unpaged_steps(path))
    chat = asyncio.run(unpaged_chat(path))
    assert len(steps) > len(IDS)
    calls: list[Any] = []
    paged = SQLiteJournal.list_runs

    async def noted(self: SQLiteJournal, **kw: Any) -> list[dict[str, Any]]:
        calls.append(kw.get("limit"))
        return await paged(self, **kw)

    monkeypatch.setattr(chat_export, "PAGE_SIZE", 7)
    monkeypatch.setattr(SQLiteJournal, "list_runs", noted)
    out = {fmt: tmp_path / f"out.{fmt}" for fmt in ("jsonl", "parquet", "chat", "chat-parquet")}
    for fmt, target in out.items():
        calls.clear()
        _reading.export(journal=str(path), fmt=fmt, output=target, redact=False)  # type: ignore[arg-type]
        assert calls == [7] * 8, fmt  # 50 runs, 7 a page

    lines = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in steps)
    assert out["jsonl"].read_text(encoding="utf-8") == lines
    assert out["chat"].read_text(encoding="utf-8") == chat
    before = pa.Table.from_pylist(steps)
    written = pq.read_table(out["parquet"])
    assert written.to_pylist() == before.to_pylist()
    assert written.column_names == before.column_names
    for field in before.schema:
        if not pa.types.is_null(field.type):  # a column null in every row has a type now
            assert written.schema.field(field.name).type == field.type, field.name
    chat_rows = pq.read_table(out["chat-parquet"]).to_pylist()
    assert [r["run_id"] for r in chat_rows] == [json.loads(x)["run_id"] for x in chat.splitlines()]
