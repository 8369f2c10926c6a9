"""Runs listed page by page: ``list_runs(after=(created_at, run_id), limit=n)`` on each journal
gives, page after page, exactly what one ``list_runs()`` gives (equal ``created_at`` split by
the run id), and the chat export reads the runs a page at a time (a journal without the page
keywords is read with one call), writing the same records as one unpaged read."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polyloop import Loop
from polyloop.observe.chat_export import chat_records, listed_runs
from polyloop.testing import FakeClock, ScriptedModel
from tests.conftest import call, make_tools
from tests.durability.conftest import OpenJournal

# Shuffled ids, several created at the same instant: the order is created_at, then run id.
IDS = [f"r{(i * 37) % 50:02d}" for i in range(50)]


async def make_runs(open_journal: OpenJournal, ids: list[str] = IDS) -> None:
    clock = FakeClock()
    async with open_journal() as journal:
        for i, run_id in enumerate(ids):
            if i % 4 == 0:
                clock.advance(1.0)
            replies = [call("count", {"n": i}), f"done {i}"] if i % 3 else [f"at once {i}"]
            loop = Loop(ScriptedModel(replies), tools=make_tools(), journal=journal, clock=clock)
            await loop.run(f"goal {run_id}", run_id=run_id)


class Unpaged:
    """A journal whose ``list_runs`` takes no page keywords (a custom journal of before)."""

    def __init__(self, journal: Any) -> None:
        self.journal = journal

    async def list_runs(self) -> list[dict[str, Any]]:
        return list(await self.journal.list_runs())

    async def read(self, run_id: str) -> Any:
        return await self.journal.read(run_id)

    async def step_usage(self, run_id: str) -> dict[int, dict[str, Any]]:
        return dict(await self.journal.step_usage(run_id))


class Counted(Unpaged):
    """A journal that notes each ``list_runs`` call's page keywords."""

    def __init__(self, journal: Any) -> None:
        super().__init__(journal)
        self.calls: list[tuple[Any, Any]] = []

    async def list_runs(  # type: ignore[override]
        self, *, after: Any = None, limit: Any = None
    ) -> list[dict[str, Any]]:
        self.calls.append((after, limit))
        return list(await self.journal.list_runs(after=after, limit=limit))


def key(row: dict[str, Any]) -> tuple[float, str]:
    return (row["created_at"], row["run_id"])


async def test_pages_give_what_one_list_gives(every_journal: OpenJournal) -> None:
    await make_runs(every_journal)
    async with every_journal() as journal:
        whole = await journal.list_runs()
        assert sorted(r["run_id"] for r in whole) == sorted(IDS)
        assert len({r["created_at"] for r in whole}) < len(whole)  # ties, not vacuous
        for size in (1, 2, 3, 7, 50, 51):
            paged: list[dict[str, Any]] = []
            after = None
            while True:
                page = await journal.list_runs(after=after, limit=size)
                assert len(page) <= size
                paged.extend(page)
                if len(page) < size:
                    break
                after = key(page[-1])
            assert [r["run_id"] for r in paged] == [r["run_id"] for r in whole], size
            assert paged == whole, size
        ended = await journal.list_runs(status="ended", limit=3)
        assert ended == whole[:3]
        one = await journal.list_runs(run_id=IDS[5], limit=1)
        assert [r["run_id"] for r in one] == [IDS[5]]
        for bad in ({"limit": 0}, {"limit": "2"}, {"after": "r01"}, {"after": (1.0, 2)}):
            with pytest.raises(ValueError, match="list_runs"):
                await journal.list_runs(**bad)


async def test_the_export_reads_the_runs_page_by_page(every_journal: OpenJournal) -> None:
    ids = ["e", "c", "a", "d", "b"]
    await make_runs(every_journal, ids)
    async with every_journal() as journal:
        whole = await journal.list_runs()
        counted = Counted(journal)
        records = [r async for r in chat_records(counted, page_size=2)]
        assert [r["run_id"] for r in records] == [r["run_id"] for r in whole]
        assert len(records) == 5
        assert counted.calls == [(None, 2), (key(whole[1]), 2), (key(whole[3]), 2)]
        unpaged = Unpaged(journal)
        assert [r async for r in listed_runs(unpaged, page_size=2)] == whole  # one call
        with pytest.raises(ValueError, match="page_size"):
            [r async for r in listed_runs(journal, page_size=0)]


async def test_paged_chat_records_are_the_unpaged_ones(every_journal: OpenJournal) -> None:
    await make_runs(every_journal)
    async with every_journal() as journal:

        async def lines(source: Any, **kw: Any) -> str:
            out = [
                json.dumps(r, ensure_ascii=False) + "\n" async for r in chat_records(source, **kw)
            ]
            return "".join(out)

        before = await lines(Unpaged(journal))  # one list_runs(), as the export read it
        assert before.count("\n") == len(IDS)
        for size in (1, 3, 500):
            assert await lines(journal, page_size=size) == before, size
