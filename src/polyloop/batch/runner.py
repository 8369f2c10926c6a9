"""Submitting goals as run rows (the journal is the queue of record) and executing them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from polyloop import DEFAULT_TEMPLATES, ConfigError, Limits, RunExists
from polyloop.types import RunEnd, RunSpec

from ._drive import Tracker
from ._goals import Goal, goal_run_id
from ._journals import BatchJournal, LoopFactory, journal_of
from ._results import BatchResult, ProgressFn, RunOutcome

__all__ = ["Backend", "execute", "run_batch", "submit"]

Backend = Literal["local", "ray"]

_SUBMIT_TTL_S = 30.0
"""The lease ``create`` takes on a new row, released right away (if the submitting process dies
in between, the row is free again once its owner is provably dead or the lease expired)."""


async def submit(
    journal: BatchJournal,
    goals: Iterable[Goal | str],
    *,
    limits: Limits | None = None,
    wording_version: str = DEFAULT_TEMPLATES.version,
    concurrency: int = 32,
) -> list[str]:
    """Write a run row for each goal, before anything executes: the journal is the queue of
    record. A row that already exists (the same goal submitted before) is left as it is, so
    submitting the same batch twice never duplicates a run. With ``list_runs`` (SQLite,
    PostgreSQL) the rows already there are read in one query and skipped without a write, so
    re-running a batch of 10,000 runs costs one query, not 10,000 refused creates.

    Args:
        journal: where the rows go (any journal: SQLite, PostgreSQL, memory).
        goals: ``Goal``s, or plain goal strings (``Goal(text)``).
        limits: the limits stored with each new run (default ``Limits()``).
        wording_version: the templates version stored with each run; pass your ``Loop``'s
            ``templates.version`` if you use other templates.
        concurrency: how many rows are written at once.

    Returns:
        The run id of each goal, in order (derived ids: :func:`goal_run_id`).

    Raises:
        ConfigError: two goals of the batch have the same explicit run id but differ.
        TypeError / ValueError: a goal's metadata is not JSON (nothing written).
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    limits = limits if limits is not None else Limits()
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a polyloop.Limits, got {type(limits).__name__}")
    items = [g if isinstance(g, Goal) else Goal(g) for g in goals]
    ids = [goal_run_id(g) for g in items]  # every id (and its metadata) checked before writing
    first: dict[str, Goal] = {}
    for run_id, goal in zip(ids, items, strict=True):
        seen = first.setdefault(run_id, goal)
        if (seen.goal, seen.metadata) != (goal.goal, goal.metadata):
            raise ConfigError(
                f"two goals of the batch have run id {run_id!r} but differ "
                f"({seen.goal[:40]!r} vs {goal.goal[:40]!r}); nothing was written"
            )
    made = await _made(journal)
    todo = iter([(r, g) for r, g in first.items() if r not in made])

    async def make() -> None:
        for run_id, goal in todo:  # one iterator shared by the writers: each row made once
            spec = RunSpec(
                run_id=run_id,
                goal=goal.goal,
                limits=limits,
                created_at=time.time(),
                metadata=None if goal.metadata is None else dict(goal.metadata),
                wording_version=wording_version,
            )
            try:
                lease = await journal.create(spec, ttl_s=_SUBMIT_TTL_S)
            except RunExists:
                continue  # submitted before
            await journal.release(lease)  # a queued row: no owner, no records

    writers = [asyncio.ensure_future(make()) for _ in range(min(concurrency, len(first)))]
    try:
        await asyncio.gather(*writers)
    except BaseException:
        for writer in writers:
            writer.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        raise
    return ids


async def execute(
    journal: BatchJournal | str,
    run_ids: Iterable[str],
    make_loop: LoopFactory,
    *,
    concurrency: int = 8,
    backend: Backend = "local",
    on_progress: ProgressFn | None = None,
    actors: int | None = None,
    actor_options: Mapping[str, Any] | None = None,
    max_task_retries: int = 3,
) -> BatchResult:
    """Drive journaled runs to their ends, ``concurrency`` at a time, by ``resume`` — so a run
    row created ahead of time starts, a run stopped halfway continues, and an ended run is
    skipped (``already_ended``). Re-running the same call finishes what is left.

    Args:
        journal: the journal holding the runs, or its spec (``"sqlite:/path.db"``,
            ``"postgresql://…"``; opened and closed here).
        run_ids: the runs to drive (duplicates are driven once).
        make_loop: builds the ``Loop`` from a journal (see :data:`LoopFactory`).
        concurrency: the most runs advancing at once (over all Ray actors on Ray).
        backend: ``"local"`` (this event loop) or ``"ray"`` (extra ``polyloop[ray]``: async
            actors, restarted by Ray when a worker or node dies — see
            :mod:`polyloop.batch.ray`; the journal must then be SQLite on a path the workers
            share, or PostgreSQL).
        on_progress: called with a :class:`BatchProgress` whenever a run starts or finishes.
        actors, actor_options, max_task_retries: Ray only — how many actors (default: one per
            CPU of the cluster, at most one per run), extra ``.options()`` for them (resources,
            scheduling strategy, ``num_cpus``), and how often Ray re-runs a run whose worker
            died (system failures only: a stop reason is a result, never retried).

    Returns:
        A :class:`BatchResult` with one outcome per run. PolyLoop stop reasons are results;
        runs leased by another live execution are ``leased`` (skipped); failures to advance a
        run are ``error`` outcomes (the run stays resumable), never exceptions.

    Cancelling it is a graceful shutdown: runs in flight are detached (resumable, no end
    record) and ``CancelledError`` propagates once they have stopped.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    if backend not in ("local", "ray"):
        raise ConfigError(f"backend must be 'local' or 'ray', got {backend!r}")
    ids = list(dict.fromkeys(run_ids))
    async with journal_of(journal) as opened:
        tracker = Tracker(ids, on_progress)
        ended = await _ended(opened, ids)
        for outcome in ended.values():
            tracker.finished(outcome, quiet=True)
        todo = [r for r in ids if r not in ended]
        if backend == "local":
            from ._local import run_local

            await run_local(opened, todo, make_loop, concurrency=concurrency, tracker=tracker)
        else:
            from .ray import run_on_ray

            await run_on_ray(
                opened,
                todo,
                make_loop,
                concurrency=concurrency,
                tracker=tracker,
                actors=actors,
                actor_options=actor_options,
                max_task_retries=max_task_retries,
            )
        return tracker.result()


async def run_batch(
    journal: BatchJournal | str,
    goals: Iterable[Goal | str],
    make_loop: LoopFactory,
    *,
    concurrency: int = 8,
    backend: Backend = "local",
    limits: Limits | None = None,
    on_progress: ProgressFn | None = None,
    wording_version: str = DEFAULT_TEMPLATES.version,
    actors: int | None = None,
    actor_options: Mapping[str, Any] | None = None,
    max_task_retries: int = 3,
) -> BatchResult:
    """Submit ``goals`` (:func:`submit`: a run row each, never twice), then drive every run of
    the batch that has not ended (:func:`execute`). Running the same batch again skips the
    ended runs and finishes the rest.

    Example::

        result = await run_batch(SQLiteJournal("runs.db"), ["fix bug 1", "fix bug 2"],
                                 lambda journal: Loop(model, tools=tools, journal=journal))
        print(result.summary())
    """
    async with journal_of(journal) as opened:
        ids = await submit(opened, goals, limits=limits, wording_version=wording_version)
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


async def _made(journal: BatchJournal) -> set[str]:
    """The run ids the journal holds, when it can list them (else empty: ``create`` tells)."""
    list_runs = getattr(journal, "list_runs", None)
    if list_runs is None:
        return set()
    return {row["run_id"] for row in await list_runs()}


async def _ended(journal: BatchJournal, ids: Sequence[str]) -> dict[str, RunOutcome]:
    """The runs among ``ids`` that have ended, from ``list_runs`` when the journal has it."""
    wanted = set(ids)
    list_runs = getattr(journal, "list_runs", None)
    out: dict[str, RunOutcome] = {}
    if list_runs is not None:
        for row in await list_runs(status="ended"):
            if row["run_id"] in wanted:
                out[row["run_id"]] = RunOutcome(
                    row["run_id"],
                    "already_ended",
                    row["stop_reason"],
                    row["stop_detail"],
                    row["steps_used"],
                )
        return out
    for run_id in ids:
        try:
            _, records = await journal.read(run_id)
        except Exception:
            continue  # execute reports it
        if records and isinstance(records[-1], RunEnd):
            end = records[-1]
            out[run_id] = RunOutcome(
                run_id, "already_ended", str(end.stop_reason), end.stop_detail, end.steps_used
            )
    return out
