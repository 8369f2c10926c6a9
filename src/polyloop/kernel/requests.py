"""Ending a run on request, from any process: ``Loop.stop`` / ``Loop.cancel``.

A request is stored in the journal (the ``EndRequests`` seam), in a transaction that also
decides what it does: with a live owner, that owner ends the run when it learns of the request
(its next heartbeat's lease renewal returns it; a ``Loop`` that drives the run itself hands it
over directly); with none (the owner crashed, the run was detached, or it was created and never
driven) the requester ends the run at once, in that same transaction, with the end record built
here from the replayed records. A run whose request was stored but not yet honoured (its owner
died first) is ended by whoever resumes it, with the same end record.
"""

from __future__ import annotations

import functools
import getpass
import os
import socket
from collections.abc import Callable

from ..seams import Clock, EndRequests, Journal
from ..types import (
    ActionIntent,
    ConfigError,
    EndRequest,
    JournalError,
    PendingAction,
    ReplayPolicy,
    RequestResult,
    RunEnd,
    StopReason,
)
from . import stopping
from .replay import Interrupted, Replayed, replay

__all__ = ["default_by", "pending_action", "request_end", "requested_ending"]

# How often a request is decided again when the run's records keep changing between the read
# and the request's transaction (each time, an owner wrote and then let the run go).
_TRIES = 8


def pending_action(intent: ActionIntent, policy: ReplayPolicy) -> PendingAction:
    """The action of ``intent``, whose outcome is not known, under ``policy``."""
    a = intent.action
    return PendingAction(
        intent.step_idx, intent.op_id, a.tool_name, intent.args_json, a.text, policy
    )


def request_detail(request: EndRequest | None, in_flight: str | None) -> str | None:
    """The ``stop_detail`` of a run a request ended: the request's reason, then what was in
    flight (``in-flight action op_id=… tool=…: outcome unknown``) when there was something."""
    parts = [p for p in (None if request is None else request.reason, in_flight) if p]
    return "; ".join(parts) or None


def requested_ending(
    request: EndRequest, interrupted: Interrupted | None
) -> tuple[StopReason, str | None, PendingAction | None]:
    """The end of a run ``request`` ends with nothing in flight in this process: at a step
    boundary, or where a crash left it (``interrupted``): its stop reason, its detail, and
    the action whose intent is durable without a result (its outcome unknown), if any."""
    reason = stopping.requested(request)
    assert reason is not None
    pending = None
    in_flight = None
    intent = None if interrupted is None else interrupted.action_intent
    if intent is not None and interrupted is not None and interrupted.action_result is None:
        described = pending_action(intent, intent.replay_policy)
        if interrupted.approval is not None and not interrupted.approved_started:
            # Parked for a person's decision, never started: it did not happen.
            in_flight = f"action {described.describe()} awaited approval: not executed"
        else:
            pending = described
            in_flight = f"in-flight action {pending.describe()}: outcome unknown"
    return reason, request_detail(request, in_flight), pending


def _end_record(state: Replayed, clock: Clock, request: EndRequest) -> RunEnd:
    """The end record of a run nobody holds, ``request`` ends it, from its replayed state; its
    totals are what the run's attempts spent (the model results' usage and cost) and the
    active time its last step journaled (no process drives it while it ends)."""
    reason, detail, pending = requested_ending(request, state.interrupted)
    return state.end_record(reason, detail, clock.time(), state.active_s, pending=pending)


def default_by() -> str:
    """Who asks, when the caller does not say: ``user@host pid N``."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container without one)
        user = "?"
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


def takes_requests(journal: Journal) -> EndRequests:
    """The journal as the ``EndRequests`` seam; ``ConfigError`` when it is not one."""
    if not isinstance(journal, EndRequests):
        raise ConfigError(
            f"{type(journal).__name__} cannot take requests to end a run (it has no "
            "request_end method); use MemoryJournal, SQLiteJournal or PostgresJournal"
        )
    return journal


async def request_end(
    journal: Journal,
    clock: Clock,
    run_id: str,
    request: EndRequest,
    deliver: Callable[[RequestResult], None],
) -> RequestResult:
    """Store ``request`` for ``run_id`` and, if nobody holds the run, end it now; ``deliver``
    gets the answer first (to hand the request to a driver of this process at once).

    Raises:
        ConfigError: the journal takes no requests.
        RunNotFound: no such run.
        JournalError: its records are damaged, or kept changing for every try.
    """
    requests = takes_requests(journal)
    for _ in range(_TRIES):
        spec, records = await journal.read(run_id)
        state = replay(spec.run_id, spec.limits, records, None)
        end = functools.partial(_end_record, state, clock)
        answer = await requests.request_end(run_id, request, seen=len(records), end=end)
        if answer is not None:
            deliver(answer)
            return answer
    raise JournalError(
        f"run {run_id!r}: its records changed under each of {_TRIES} tries to end it on "
        "request (executions keep taking and releasing it); nothing was written, try again"
    )
