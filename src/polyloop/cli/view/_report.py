"""``polyloop report``: one run as one self-contained HTML file, meant to be shared.

By default the file holds only safe data (lengths, sha256 hashes, tool names, statuses, ids,
timings); ``include_content=True`` adds the content, every piece scrubbed first.
"""

from __future__ import annotations

import time

from polyloop import RunNotFound
from polyloop import __version__ as _version
from polyloop.observe.redact import DEFAULT_SCRUBBER, ScrubFn

from ._data import ReadableJournal, Source
from ._html import esc, when
from ._pages import Disclosure, run_page

REPORT_MAX_CHARS = 50_000
"""With content: each piece is cut at this many characters (a report stays openable)."""


async def build_report(
    journal: ReadableJournal,
    run_id: str,
    *,
    include_content: bool = False,
    scrubber: ScrubFn | None = DEFAULT_SCRUBBER,
) -> str:
    """The report of run ``run_id`` as one HTML document (CSS and JS inline, no requests).

    Raises:
        RunNotFound: no such run in the journal.
    """
    source = Source(journal, cache_runs=1)
    run = await source.run(run_id)
    if run is None:
        raise RunNotFound(run_id)
    detail = await source.detail(run)
    disclosure = Disclosure(
        content=include_content,
        scrub=scrubber if include_content else None,
        max_chars=REPORT_MAX_CHARS,
        links=False,
        shared=True,
    )
    now = time.time()
    footer = (
        f'<footer class="report-footer dim">Written by polyloop {esc(_version)} report on '
        f"{esc(when(now))}"
        + (" with --include-content (scrubbed)." if include_content else " (content withheld).")
        + "</footer>"
    )
    return run_page(detail, disclosure=disclosure, now=now, standalone=True, footer=footer)
