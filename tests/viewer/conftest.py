"""One journal for the viewer tests: a run of every stop reason, a paused run, a 250-step run
and a run with a 2 MB observation, made once per session by real runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from polyloop import Limits, ModelReply
from polyloop.cli.view import ViewerApp, make_app
from polyloop.journal import SQLiteJournal
from tests.viewer.journal_factory import _run, build_journal, call, long_run

LONG_STEPS = 250
BIG_OBSERVATION = 2_000_000


async def _make(path: Path) -> None:
    await build_journal(path)
    journal = SQLiteJournal(path, durability="normal")
    try:
        await long_run(journal, "run-long", LONG_STEPS, observation_chars=200)
        await _run(
            journal,
            "run-bigobs",
            [call("big", {"n": BIG_OBSERVATION}), ModelReply("done")],
            limits=Limits(max_steps=5, max_observation_chars=1000),
            goal="read a huge file",
            metadata={"suite": "big"},
        )
    finally:
        await journal.aclose()


@pytest.fixture(scope="session")
def journal_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("viewer") / "journal.db"
    asyncio.run(_make(path))
    return path


@pytest.fixture(scope="session")
def app(journal_path: Path) -> Iterator[ViewerApp]:
    with make_app(journal_path) as viewer:
        yield viewer
