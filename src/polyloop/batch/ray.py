"""The Ray backend of :func:`polyloop.batch.execute` (extra ``polyloop[ray]``).

Runs are executed by async Ray actors (:class:`BatchWorker`), each hosting many runs at once
(``max_concurrency``) with one ``Loop`` built by ``make_loop`` on a journal the actor opens from
its *spec* (``sqlite:/path`` on one machine, or a PostgreSQL URI for a cluster).

Failures:

* A worker process or a node dies: Ray restarts the actor (``max_restarts=-1``) and re-runs its
  tasks (``max_task_retries``: system failures only). The re-run resumes the run from the
  journal: it takes the lease back at once when the previous owner is provably dead (same host,
  process gone), or once the lease has expired (another host); only the steps that were not
  durable are done again, by the replay policies (a ``never``-replay action in flight ends the
  run ``resume_state_unknown``, never a second execution).
* A run that stops for any PolyLoop stop reason has *ended*: that is a result, returned to the
  driver, and never retried — Ray never sees it as a failure.
* Graceful shutdown (the driver's ``execute`` is cancelled, or :meth:`BatchWorker.drain`): the
  actors detach their runs (no end record, lease released) and never cancel them.
* The driver dies: Ray removes its actors; the runs are left with leases of dead processes,
  which the sweeper (:func:`polyloop.batch.recover`, ``polyloop recover``) takes over.

Ray is imported only here, and only when used; without it a one-line ``ImportError`` names the
extra to install.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from polyloop import ConfigError, Loop
from polyloop.types import import_extra

from ._drive import Tracker, drive_run
from ._journals import LoopFactory, journal_spec, open_journal, resolve_factory
from ._results import RunOutcome

__all__ = ["BatchWorker", "run_on_ray"]

log = logging.getLogger("polyloop")

INSTALL_HINT = "the Ray backend needs Ray: pip install 'polyloop[ray]'"

DEFAULT_LEASE_WAIT_S = 90.0
"""How long a restarted worker waits for the lease of a run whose previous attempt died on
another machine (a lease lasts ``Loop(lease_ttl_s=30)`` by default)."""


def _ray() -> Any:
    """``ray``, imported on first use (layout.md rule 6)."""
    return import_extra("ray", INSTALL_HINT)


class BatchWorker:
    """A Ray actor executing runs of one journal (wrapped with ``ray.remote`` by
    :func:`run_on_ray`; Ray pickles its class by reference, so workers import this module).

    Args:
        spec: the journal spec (:func:`polyloop.batch.journal_spec`), opened in the worker.
        make_loop: the ``Loop`` factory (a callable Ray can pickle, or ``"module:function"``).
    """

    def __init__(self, spec: str, make_loop: LoopFactory) -> None:
        self._spec = spec
        self._make_loop = make_loop
        self._journal: Any = None
        self._loop: Loop | None = None
        self._active: set[str] = set()
        self._draining = False
        try:
            with warnings.catch_warnings():  # Ray's own deprecation inside this property
                warnings.simplefilter("ignore")
                ctx = _ray().get_runtime_context()
                self._restarted = bool(ctx.was_current_actor_reconstructed)
        except Exception:  # cannot tell: assume a restart (costs at most a wait for a lease)
            self._restarted = True

    def _get_loop(self) -> Loop:
        if self._loop is None:
            self._journal = open_journal(self._spec)
            self._loop = resolve_factory(self._make_loop)(self._journal)
        return self._loop

    async def run(self, run_id: str, lease_wait_s: float = DEFAULT_LEASE_WAIT_S) -> RunOutcome:
        """Resume ``run_id`` to its end; the outcome (a stop reason is a result). In a restarted
        actor, a run still leased by its previous (dead) attempt is waited for up to
        ``lease_wait_s``."""
        if self._draining:
            return RunOutcome(run_id, "detached", detail="the worker is shutting down")
        try:
            loop = self._get_loop()
        except Exception as exc:
            log.warning("batch: cannot build the Loop in a Ray worker", exc_info=True)
            detail = f"cannot build the Loop in the worker: {type(exc).__name__}: {exc}"
            return RunOutcome(run_id, "error", detail=detail)
        self._active.add(run_id)
        try:
            wait = lease_wait_s if self._restarted else 0.0
            return await drive_run(loop, run_id, wait_leased_s=wait)
        finally:
            self._active.discard(run_id)

    async def drain(self) -> int:
        """Graceful shutdown: start no new run, detach the active ones (each stops at its next
        step boundary, resumable) and return, once they have stopped, how many there were."""
        self._draining = True
        count = len(self._active)
        while self._active:
            if self._loop is not None:
                for run_id in list(self._active):
                    self._loop.detach(run_id)
            await asyncio.sleep(0.05)
        return count

    async def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()


async def run_on_ray(
    journal: Any,
    run_ids: Sequence[str],
    make_loop: LoopFactory,
    *,
    concurrency: int,
    tracker: Tracker,
    actors: int | None = None,
    actor_options: Mapping[str, Any] | None = None,
    max_task_retries: int = 3,
    lease_wait_s: float = DEFAULT_LEASE_WAIT_S,
) -> None:
    """Drive ``run_ids`` on Ray actors, at most ``concurrency`` at once in all. Connects to
    Ray with ``ray.init()`` (``RAY_ADDRESS`` or a local instance) unless already connected.
    The actors are killed when done."""
    if not run_ids:
        return
    if max_task_retries < 0:
        raise ConfigError(f"max_task_retries must be >= 0, got {max_task_retries}")
    if isinstance(make_loop, str):
        resolve_factory(make_loop)  # a bad path fails here, not in every worker
    spec = journal_spec(journal)
    ray = _ray()
    if not ray.is_initialized():
        ray.init()
    if actors is None:
        cpus = int(ray.cluster_resources().get("CPU", 1)) or 1
        actors = max(1, min(cpus, concurrency, len(run_ids)))
    if actors < 1:
        raise ConfigError(f"actors must be >= 1, got {actors}")
    per_actor = math.ceil(concurrency / actors)
    options: dict[str, Any] = {
        "max_restarts": -1,
        "max_task_retries": max_task_retries,
        # room beyond the runs for drain(): a graceful shutdown is never queued behind them
        "max_concurrency": per_actor + 2,
    }
    options.update(actor_options or {})
    worker_cls = ray.remote(BatchWorker)
    handles = [worker_cls.options(**options).remote(spec, make_loop) for _ in range(actors)]
    load = [0] * actors
    pending = iter(run_ids)
    stopping = False

    async def call(run_id: str) -> RunOutcome:
        """One run on the least loaded actor. Ray re-runs the task when its worker dies
        (``max_task_retries``); when Ray gives up — the actor was unreachable for a while, as
        while a lost node is detected and the actor restarted elsewhere — the call is made
        again here, after a pause, up to ``max_task_retries`` more times. Only Ray's system
        failures get there: the actor returns every PolyLoop outcome as a value."""
        for attempt in range(max_task_retries + 1):
            i = min(range(actors), key=load.__getitem__)
            load[i] += 1
            try:
                outcome: RunOutcome = await handles[i].run.remote(run_id, lease_wait_s)
                return outcome
            except ray.exceptions.RayActorError as exc:
                error: BaseException = exc
                if exc.actor_init_failed:  # it cannot come back: do not retry
                    break
            except ray.exceptions.RayError as exc:  # not a lost worker: do not retry
                error = exc
                break
            finally:
                load[i] -= 1
            if stopping:
                break
            await asyncio.sleep(min(0.5 * 2**attempt, 8.0))
        first = (str(error).strip().splitlines() or [""])[0]
        return RunOutcome(
            run_id, "error", detail=f"Ray lost its worker ({type(error).__name__}): {first}"
        )

    async def dispatcher() -> None:
        run_id = None if stopping else next(pending, None)
        if run_id is not None:
            tracker.started(run_id)
        while run_id is not None:
            outcome = await call(run_id)
            run_id = None if stopping else next(pending, None)
            tracker.finished(outcome, then=run_id)  # both in one snapshot

    tasks = [asyncio.ensure_future(dispatcher()) for _ in range(min(concurrency, len(run_ids)))]
    try:
        try:
            await asyncio.wait(tasks)
        except asyncio.CancelledError:
            stopping = True
            drains = [h.drain.remote() for h in handles]
            await asyncio.wait(tasks)  # the runs in flight come back ``detached``
            await asyncio.gather(*drains, return_exceptions=True)
            raise
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for handle in handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                log.debug("batch: could not kill a Ray actor", exc_info=True)
    for task in tasks:
        task.result()
