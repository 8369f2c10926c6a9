"""Control: ``polyloop stop``, ``cancel``, ``limits``, ``pending``, ``approve`` and ``deny`` —
requests and decisions written to the journal, for a run that may be advanced by another process."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import typer

from polyloop import Loop

from ._approval import continue_hint
from ._common import ByOpt, RequestJournalOpt, T, call, fail, journal_spec, when
from ._errors import valid_text
from ._setup import BadInput


class _NoModel:
    """The model of the Loop that ``stop`` and ``cancel`` use: ending a run calls none."""

    name = "none"

    async def complete(self, request: Any) -> Any:
        raise RuntimeError("polyloop stop and cancel never call a model")


def _on_journal(
    journal: str | None, run_id: str | None, act: Callable[[Loop], Coroutine[Any, Any, T]]
) -> T:
    """``act(loop)`` with a Loop on the journal that calls no model (for the commands that
    only write requests and decisions); library errors, a missing extra and no such run are
    one line and exit code 1."""
    from polyloop import RunNotFound
    from polyloop.batch import open_journal as open_spec

    spec = journal_spec(journal, must_exist=True)

    async def go() -> T:
        j = open_spec(spec)
        try:
            try:
                return await act(Loop(_NoModel(), journal=j))
            except RunNotFound:
                raise BadInput(f"no run {run_id!r} in {spec}") from None
        finally:
            await j.aclose()

    try:
        return call(go)
    except (ImportError, ValueError) as exc:  # a missing extra (psycopg), a bad value
        raise fail(str(exc).splitlines()[0]) from None


def _request(
    journal: str | None, run_id: str, kind: str, reason: str | None, by: str | None
) -> None:
    """Store a request to end ``run_id`` and print what it did, in one line (exit 0 whatever
    it did; 1 for no such run or a journal that cannot be written)."""

    async def act(loop: Loop) -> Any:
        if kind == "stop":
            assert reason is not None
            return await loop.stop(run_id, reason, by=by)
        return await loop.cancel(run_id, reason=reason, by=by)

    answer = _on_journal(journal, run_id, act)
    print(answer.describe(), flush=True)
    raise typer.Exit(0)


def stop(
    run_id: Annotated[str, typer.Argument(help="The run to stop.", callback=valid_text)],
    reason: Annotated[
        str, typer.Option("--reason", help="Why; it becomes the run's stop_detail (required).")
    ],
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """End a run with stop reason `stopped`, wherever it runs (another process or host).

    The request is written to the journal. A run some process is advancing ends at the step
    boundary after that process's next heartbeat (lease_ttl_s/3, 10 s by default): the step in
    flight finishes and is recorded first. A run nobody is advancing (crashed, detached, never
    started) is ended now. One line says which; an ended run is left as it is. Exit code 0
    whatever happened to the run, 1 for no such run.

    Example: polyloop stop 3f2a… --reason "budget exhausted" --journal polyloop.db
    """
    if not reason.strip():
        raise fail("stop --reason must not be empty (it becomes the run's stop_detail)")
    _request(journal, run_id, "stop", reason, by)


def cancel(
    run_id: Annotated[str, typer.Argument(help="The run to cancel.", callback=valid_text)],
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why; the start of its stop_detail.")
    ] = None,
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """End a run with stop reason `cancelled`, wherever it runs (another process or host).

    As a local cancellation: the process advancing it cancels it at its next heartbeat, and an
    action in flight gets the cancellation grace to finish (else it is named in stop_detail,
    its outcome unknown). A pending stop is replaced; a run nobody is advancing is ended now.
    One line says what happened; exit code 0 whatever it was, 1 for no such run.

    Example: polyloop cancel 3f2a… --reason "wrong goal" --journal postgresql://host/db
    """
    _request(journal, run_id, "cancel", reason, by)


def limits(
    run_id: Annotated[str, typer.Argument(help="The run to retune.", callback=valid_text)],
    reason: Annotated[str, typer.Option("--reason", help="Why (required; it is journaled).")],
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="New step budget (a positive int).")
    ] = None,
    max_actions: Annotated[
        int | None, typer.Option("--max-actions", help="New executed-action budget.")
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="New token budget (input + output).")
    ] = None,
    max_cost: Annotated[
        float | None, typer.Option("--max-cost", help="New cost budget, in US dollars.")
    ] = None,
    max_seconds: Annotated[
        float | None, typer.Option("--max-seconds", help="New time budget, in active seconds.")
    ] = None,
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """Change the budgets of a run, wherever it runs (another process or host), detached,
    parked or stale; the budgets not given stay as they are.

    The request is journaled (one row of the requests table: old and new values, who, why,
    when). A run some process is advancing takes it at that process's next heartbeat
    (lease_ttl_s/3) and applies it at its next step boundary, before budget admission: a
    budget lowered to or below what the run spent ends it there with that budget's stop
    reason (step_budget, token_budget ...), a raised one lets it go on. A run nobody is
    advancing gets the new limits now, and resume goes on with them. One line says which;
    exit code 1 for a value that cannot hold, an ended run or no such run.

    Example: polyloop limits 3f2a… --max-steps 80 --reason "needs more room" --journal polyloop.db
    """
    given = {
        "max_steps": max_steps,
        "max_actions": max_actions,
        "max_tokens": max_tokens,
        "max_cost": max_cost,
        "max_seconds": max_seconds,
    }
    new = {name: value for name, value in given.items() if value is not None}
    if not new:
        raise fail("limits needs at least one of --max-steps, --max-actions, --max-tokens, "
                   "--max-cost, --max-seconds")  # fmt: skip

    async def act(loop: Loop) -> Any:
        return await loop.set_limits(run_id, by=by, reason=reason, **new)

    stored = _on_journal(journal, run_id, act)
    if stored.outcome is None:
        then = (
            "requested; the execution advancing it applies it at its next step boundary "
            "after its next heartbeat"
        )
    else:
        then = f"{stored.outcome} now: nobody was advancing it"
    print(f"run {run_id}: limits request {stored.seq} ({stored.describe()}) {then}", flush=True)
    raise typer.Exit(0)


def _decide(
    journal: str | None, run_id: str, op_id: str, approved: bool, note: str | None, by: str | None
) -> None:
    """Journal a decision and print it in one line (exit 0; 1 when someone decided first,
    nothing awaits a decision, or no such run)."""
    from polyloop import AlreadyDecided

    async def act(loop: Loop) -> Any:
        try:
            if approved:
                decision = await loop.approve(run_id, op_id, note=note, by=by)
            else:
                assert note is not None
                decision = await loop.deny(run_id, op_id, reason=note, by=by)
        except AlreadyDecided as exc:
            raise BadInput(str(exc)) from None
        spec, _ = await loop.journal.read(run_id)
        return decision, spec.metadata

    decision, metadata = _on_journal(journal, run_id, act)
    hint = continue_hint(run_id, metadata, journal_spec(journal, must_exist=True))
    print(f"run {run_id}: {decision.describe()}; {hint}", flush=True)
    raise typer.Exit(0)


def pending(journal: RequestJournalOpt = None) -> None:
    """List the actions awaiting a person's approval (runs parked with status
    `awaiting_approval`), oldest first: run, step, op_id, tool and arguments. Read-only.

    Example: polyloop pending --journal polyloop.db
    """

    async def act(loop: Loop) -> list[dict[str, Any]]:
        return await loop.pending_approvals()

    rows = _on_journal(journal, None, act)
    if not rows:
        print("no action awaits approval", flush=True)
    for row in rows:
        expires = "" if row["expires_at"] is None else f"  expires {when(row['expires_at'])}"
        print(
            f"{row['run_id']}  step {row['step_idx']}  op_id {row['op_id']}  "
            f"{row['tool_name'] or row['action']} {row['args_json'] or ''}  "
            f"requested {when(row['requested_at'])}{expires}",
            flush=True,
        )
    raise typer.Exit(0)


def approve(
    run_id: Annotated[str, typer.Argument(help="The parked run.", callback=valid_text)],
    op_id: Annotated[
        str, typer.Argument(help="The op_id of its pending action.", callback=valid_text)
    ],
    note: Annotated[str | None, typer.Option("--note", help="For the record.")] = None,
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """Approve the action a parked run awaits (`polyloop pending` lists them); then the
    command it prints continues the run and executes the action: `polyloop resume RUN_ID` for
    a run of `polyloop run` or `batch --model` on a SQLite journal; `polyloop recover
    --older-than 0` (or the batch again) for one of `batch --loop` or on PostgreSQL;
    `loop.resume(RUN_ID)` for one started from Python. Exactly one decision per action: exit
    code 1 and one line naming who decided, when someone decided first.

    Example: polyloop approve 3f2a… 9b1c… --by alice --journal polyloop.db
    """
    _decide(journal, run_id, op_id, True, note, by)


def deny(
    run_id: Annotated[str, typer.Argument(help="The parked run.", callback=valid_text)],
    op_id: Annotated[
        str, typer.Argument(help="The op_id of its pending action.", callback=valid_text)
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why; the model is shown it (required).")],
    journal: RequestJournalOpt = None,
    by: ByOpt = None,
) -> None:
    """Deny the action a parked run awaits: the command it prints continues the run (as for
    approve), which records the action not executed, the model seeing the reason, and goes on.
    Exit code 1 when someone decided first.

    Example: polyloop deny 3f2a… 9b1c… --reason "not to customers" --journal polyloop.db
    """
    if not reason.strip():
        raise fail("deny --reason must not be empty (the model is shown it)")
    _decide(journal, run_id, op_id, False, reason, by)
