"""Requests to end a run from anywhere: ``Loop.stop`` / ``Loop.cancel``, ``polyloop stop`` /
``polyloop cancel``.

A request is stored in the run's ``runs`` row (columns ``request``, ``request_reason``,
``requested_by``, ``requested_at``), so any process that can write the journal can make one and
the run's owner, wherever it is, reads it with the lease renewal it already makes at each
heartbeat. What a request did is a :class:`RequestResult`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = ["EndRequest", "RequestHappened", "RequestKind", "RequestResult"]

RequestKind: TypeAlias = Literal["stop", "cancel"]
"""``stop``: end the run ``stopped`` at its next step boundary (an action or model call in
flight finishes and its step is recorded first). ``cancel``: end it ``cancelled`` as a local
cancellation does (an action in flight gets the cancellation grace)."""

RequestHappened: TypeAlias = Literal["ended", "requested", "already_requested", "already_ended"]
"""What a request did (:attr:`RequestResult.happened`):

* ``ended``: nobody was advancing the run (its owner crashed, it was detached, or it was
  created and never driven): the requester wrote its end record at once.
* ``requested``: a live execution holds the run; the request is durable and that owner ends the
  run at its next heartbeat (cancel) or the step boundary after it (stop).
* ``already_requested``: a live owner already has a request this one does not change (a stop or
  a cancel pending, and this is a stop; or a cancel pending, and this is a cancel): nothing was
  written.
* ``already_ended``: the run had ended: nothing was written."""


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


@dataclass(frozen=True, slots=True)
class EndRequest:
    """A request to end one run, as stored in its ``runs`` row.

    ``kind`` is the ``request`` column, ``reason`` ``request_reason`` (None: none given), ``by``
    ``requested_by`` (who asked: the caller's ``by=``, else ``user@host pid N``), ``at``
    ``requested_at`` (epoch seconds, the requester's clock). A cancel may replace a pending stop
    (it is stronger); nothing else replaces a pending request.
    """

    kind: RequestKind
    reason: str | None
    by: str
    at: float

    def replaces(self, pending: EndRequest | None) -> bool:
        """Whether this request takes the place of ``pending``: there is none, or this is a
        cancel and that a stop (a stop never downgrades a pending cancel)."""
        return pending is None or (self.kind == "cancel" and pending.kind == "stop")

    def describe(self) -> str:
        """``stop requested by alice@host pid 7 at 2026-12-01 10:00:00 ("the reason")``."""
        reason = "" if self.reason is None else f" ({self.reason!r})"
        return f"{self.kind} requested by {self.by} at {_when(self.at)}{reason}"


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What ``Loop.stop`` / ``Loop.cancel`` did (see :data:`RequestHappened`).

    ``request`` is the request in force: this one when it was written, else the one that came
    first (``already_requested``, and ``already_ended`` when a request was stored before the
    run ended; None when the run ended with no request stored). ``stop_reason`` and
    ``stop_detail`` are the end record's once the run has ended (``ended``,
    ``already_ended``), else None.
    """

    run_id: str
    happened: RequestHappened
    request: EndRequest | None
    stop_reason: str | None = None
    """A :class:`StopReason` (a plain string only for a reason this version does not know)."""
    stop_detail: str | None = None

    def describe(self) -> str:
        """One line saying what happened, for people (the CLI prints it)."""
        run = f"run {self.run_id}"
        asked = "" if self.request is None else f" ({self.request.describe()})"
        match self.happened:
            case "ended":
                return f"{run} ended {self.stop_reason} now: nobody was advancing it{asked}"
            case "requested":
                return (
                    f"{run}: {self.request.kind if self.request else 'a'} request written; the "
                    f"execution advancing it ends it at its next heartbeat{asked}"
                )
            case "already_requested":
                return f"{run}: a request was already pending, nothing changed{asked}"
            case _:
                stored = "" if self.request is None else f" (it had {self.request.describe()})"
                return f"{run} had already ended {self.stop_reason}, nothing changed{stored}"
