"""Seeing runs from outside: OpenTelemetry export and redaction. Callers of the public API;
the kernel never learns they exist.

* :mod:`polyloop.observe.otel` — ``OTelObserver``: an observer that turns a run's events into
  OpenTelemetry spans (GenAI semantic conventions). Extra ``polyloop[otel]``, imported lazily:
  this package imports without it.
* :mod:`polyloop.observe.redact` — what may leave the owner's hands: safe summaries (lengths,
  hashes) and the :class:`Scrubber` that runs over content when content is opted in.
* :mod:`polyloop.observe.chat_export` — ``chat_records``: a journal's runs as trainers read
  them, one record per run with its conversation in the OpenAI chat shape;
  :mod:`polyloop.observe.chat_parquet` writes them as Parquet (needs ``pyarrow``).
"""

from __future__ import annotations

from .redact import DEFAULT_PATTERNS, DEFAULT_SCRUBBER, ContentSummary, Scrubber, digest, summarize

__all__ = [
    "DEFAULT_PATTERNS",
    "DEFAULT_SCRUBBER",
    "ContentSummary",
    "Scrubber",
    "digest",
    "summarize",
]
