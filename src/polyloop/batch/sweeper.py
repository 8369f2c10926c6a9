"""The recovery sweeper: finds runs that stopped advancing without ending — their driver died,
their node was lost, or they were submitted and never dispatched — and resumes them.

Whether a run may be taken over is decided by the journal when the sweeper acquires it, by the
lease rules of durability.md: a lease that expired, or whose owner is provably dead (same host,
its process gone), is taken at once; a live lease is left alone (``leased`` outcome). So the
sweeper can run anywhere, any number of times, next to live batches: it never duplicates work.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from polyloop import ConfigError
from polyloop.types import check_number

from ._journals import BatchJournal, LoopFactory, journal_of
from ._results import BatchResult, ProgressFn
from .runner import Backend, execute

__all__ = ["StalledRun", "deny_expired", "find_stalled", "recover"]

StallReason = Literal["lease_expired", "unowned", "leased"]


@dataclass(frozen=True, slots=True)
class StalledRun:
    """A run that has not ended and may need the sweeper.

    ``why``: ``lease_expired`` (its owner stopped renewing: died, lost its node, or hangs);
    ``unowned`` (nobody holds it: never dispatched, detached, or released after an error, and
    created at least ``older_than_s`` ago); ``leased`` (a lease that has not expired: taken
    over only if the journal proves its owner dead, else left alone).

    ``state``: the run's state in the words of ``list_runs()`` and ``polyloop runs``
    (``detached`` for ``unowned``, ``stale`` for ``lease_expired`` and for ``leased`` whose
    owner is provably dead, else ``running``).
    """

    run_id: str
    why: StallReason
    owner: str | None
    created_at: float
    steps_used: int
    metadata: Mapping[str, Any] | None
    state: str = ""


async def find_stalled(
    journal: BatchJournal, *, older_than_s: float = 300.0, include_leased: bool = True
) -> list[StalledRun]:
    """The runs of the journal that have not ended and nobody is visibly advancing, oldest
    first. Read-only.

    Args:
        older_than_s: an unowned run counts only once it is this old (a batch that just
            submitted its rows is about to dispatch them).
        include_leased: also list runs whose lease has not expired (their owner may be
            provably dead; only acquiring tells).

    Raises:
        ConfigError: the journal cannot list its runs (use SQLite or PostgreSQL), or
            ``older_than_s`` is not a finite number >= 0.
    """
    check_number("older_than_s", older_than_s, unit=" of seconds")
    list_runs = getattr(journal, "list_runs", None)
    if list_runs is None:
        raise ConfigError(
            f"the sweeper needs a journal that lists its runs (SQLiteJournal or "
            f"PostgresJournal), got {type(journal).__name__}"
        )
    now = time.time()
    out: list[StalledRun] = []
    for row in await list_runs(status="running"):
        owner, expires = row.get("owner"), row.get("lease_expires_at")
        why: StallReason
        if owner is None:
            if float(row["created_at"]) > now - older_than_s:
                continue
            why = "unowned"
        elif expires is None or float(expires) <= now:
            why = "lease_expired"
        elif include_leased:
            why = "leased"
        else:
            continue
        out.append(
            StalledRun(
                row["run_id"],
                why,
                owner,
                float(row["created_at"]),
                int(row.get("steps_used") or 0),
                row.get("metadata"),
                str(row.get("state") or ""),
            )
        )
    return out


async def deny_expired(
    journal: BatchJournal, *, now: float | None = None, by: str = "polyloop recover"
) -> list[str]:
    """Deny, reason "timed out", every pending approval whose request has expired
    (``Loop(approval_timeout_s=...)``), as a person would with ``Loop.deny``; the ids of the
    runs denied (a resume then records the action ``not_executed`` and goes on). A decision
    someone made meanwhile stands. Runs parked without an expiry are left alone."""
    from polyloop import AlreadyDecided, NotAwaitingApproval
    from polyloop.types import ApprovalDecided

    pending = getattr(journal, "pending_approvals", None)
    decide = getattr(journal, "decide", None)
    if pending is None or decide is None:
        return []
    when = time.time() if now is None else now
    denied = []
    for row in await pending():
        expires = row["expires_at"]
        if expires is None or float(expires) > when:
            continue
        decision = ApprovalDecided(row["step_idx"], row["op_id"], False, "timed out", by, when)
        try:
            standing = await decide(row["run_id"], decision)
        except (AlreadyDecided, NotAwaitingApproval):
            continue
        if standing.by == by and standing.decided_at == when:
            denied.append(row["run_id"])
    return denied


async def recover(
    journal: BatchJournal | str,
    make_loop: LoopFactory,
    *,
    older_than_s: float = 300.0,
    concurrency: int = 8,
    backend: Backend = "local",
    on_progress: ProgressFn | None = None,
    actors: int | None = None,
    actor_options: Mapping[str, Any] | None = None,
    max_task_retries: int = 3,
) -> BatchResult:
    """One sweep: :func:`deny_expired` (approvals past their expiry), :func:`find_stalled`,
    then resume each of those runs to its end (:func:`execute`, same arguments). Runs parked
    awaiting a person's decision (``runs.status = 'awaiting_approval'``) are left alone: they
    are not stalled. Returns what it did, one outcome per run resumed: ``ended`` (recovered),
    ``leased`` (a live execution has it: left alone), ``error``.

    Example (after the batch driver was killed)::

        result = await recover(SQLiteJournal("runs.db"), make_loop, older_than_s=0)
    """
    check_number("older_than_s", older_than_s, unit=" of seconds")  # before anything is done
    async with journal_of(journal) as opened:
        denied = await deny_expired(opened)
        stalled = await find_stalled(opened, older_than_s=older_than_s)
        ids = [s.run_id for s in stalled]
        ids += [r for r in denied if r not in ids]
        return await execute(
            opened,
            ids,
            make_loop,
            concurrency=concurrency,
            backend=backend,
            on_progress=on_progress,
            actors=actors,
            actor_options=actor_options,
            max_task_retries=max_task_retries,
        )
