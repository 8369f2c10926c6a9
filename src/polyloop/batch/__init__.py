"""Many runs: submit goals as journaled run rows, execute them with bounded concurrency on this
event loop or on Ray, and recover the runs whose worker died.

A caller of the public API (kernel.md §1): it drives runs with ``Loop.resume`` and never
reaches into the kernel. The journal is the queue of record — every goal becomes a run row
before anything executes, with a deterministic run id, so running the same batch again skips
the ended runs and finishes the rest.

* :func:`submit` — a run row per goal (never twice).
* :func:`execute` — drive given runs to their ends (``backend="local"`` or ``"ray"``).
* :func:`run_batch` — both.
* :func:`find_stalled` / :func:`recover` — the recovery sweeper.

The Ray backend lives in :mod:`polyloop.batch.ray` (extra ``polyloop[ray]``).
"""

from ._goals import Goal, GoalFileError, goal_run_id, load_goals, parse_goal_line
from ._journals import BatchJournal, LoopFactory, journal_spec, open_journal, resolve_factory
from ._results import BatchProgress, BatchResult, OutcomeStatus, ProgressFn, RunOutcome
from .runner import Backend, execute, run_batch, submit
from .sweeper import StalledRun, find_stalled, recover

__all__ = [
    "Backend",
    "BatchJournal",
    "BatchProgress",
    "BatchResult",
    "Goal",
    "GoalFileError",
    "LoopFactory",
    "OutcomeStatus",
    "ProgressFn",
    "RunOutcome",
    "StalledRun",
    "execute",
    "find_stalled",
    "goal_run_id",
    "journal_spec",
    "load_goals",
    "open_journal",
    "parse_goal_line",
    "recover",
    "resolve_factory",
    "run_batch",
    "submit",
]
