"""The journals share what is the same: the statements of the write-ahead protocol are written
once (``polyloop.journal._sql``) and PostgreSQL speaks them in its own placeholders; the memory
journal decides leases and requests by the same rules; no journal module outgrows a reader."""

from __future__ import annotations

from pathlib import Path

import pytest

import polyloop.journal
from polyloop.journal import MemoryJournal
from polyloop.types import EndRequest, Limits, RunSpec

JOURNAL = Path(polyloop.journal.__file__).parent
SHARED = (
    "APPROVAL_RECORDS",
    "DECIDED",
    "END_PENDING",
    "END_RUN",
    "INSERT_INTENT",
    "INSERT_JOURNAL",
    "INSERT_STEP",
    "LAST_SEQ",
    "LEASE_OF",
    "MARK_UNCERTAIN",
    "NEXT_SEQ",
    "READ_RECORDS",
    "READ_RUN",
    "RELEASE",
    "RUN_FOUND",
    "SET_STATUS",
    "UPSERT_CALL",
    "WRITE_REQUEST",
)


def test_every_journal_module_is_under_600_lines() -> None:
    sizes = {
        str(path.relative_to(JOURNAL)): len(path.read_text().splitlines())
        for path in JOURNAL.rglob("*.py")
    }
    assert {name: n for name, n in sizes.items() if n > 600} == {}


@pytest.mark.parametrize("name", SHARED)
def test_postgres_speaks_the_shared_statement_in_its_placeholders(name: str) -> None:
    from polyloop.journal import _sql
    from polyloop.journal.postgres import _sql as pg_sql

    shared = getattr(_sql, name)
    assert "%s" not in shared and "?" in shared
    assert getattr(pg_sql, name) == shared.replace("?", "%s")


async def test_the_memory_journal_takes_a_request_for_a_live_run_as_the_sql_journals_do() -> None:
    # The SQL journals' rule (_request_rows.request_answer): a live owner gets the request in
    # its next renew; a second, weaker request leaves the first in force.
    journal = MemoryJournal(clock=lambda: 100.0)
    lease = await journal.create(RunSpec("r", "g", Limits(), 100.0), ttl_s=30.0)
    stop = EndRequest("stop", "enough", "ops", 100.0)
    first = await journal.request_end("r", stop, seen=0, end=_never)
    assert first is not None and (first.happened, first.request) == ("requested", stop)
    again = await journal.request_end("r", EndRequest("stop", "x", "b", 101.0), seen=0, end=_never)
    assert again is not None and (again.happened, again.request) == ("already_requested", stop)
    assert (await journal.renew(lease, ttl_s=30.0)).request == stop


def _never(request: EndRequest) -> object:
    raise AssertionError("a live run is not ended by a request")
