"""``Loop``: the composition root. Wires the default adapters around the kernel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .context import ChatContextBuilder
from .interpreters import NativeToolCallInterpreter
from .journal import MemoryJournal
from .kernel import Kernel, KernelConfig
from .models.prices import table_price
from .seams import Clock, ContextBuilder, Environment, Interpreter, Journal, Model
from .tools import ToolEnvironment, ToolRegistry
from .types import (
    DEFAULT_TEMPLATES,
    ApprovalDecided,
    ConfigError,
    GuardCheck,
    Limits,
    LimitsRequest,
    Message,
    Observer,
    ReportHook,
    RequestResult,
    RetryPolicy,
    RunEndGuard,
    RunResult,
    Templates,
    check_number,
)

__all__ = ["Loop", "SystemClock"]


class SystemClock:
    """The real clock: ``time.monotonic``, ``time.time`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Loop:
    """Runs agents: ``await Loop(model, tools=registry).run(goal)``.

    Args:
        model: the Model seam (``polyloop.models.openai``, or ``polyloop.testing`` fakes).
        tools: a ``ToolRegistry``; shorthand for ``environment=ToolEnvironment(tools)``.
        environment: the Environment seam (default: a ``ToolEnvironment`` with no tools).
        interpreter: the Interpreter seam (default: native tool calls; text is a final answer).
        context: the ContextBuilder seam (default: ``ChatContextBuilder``).
        journal: the Journal seam (default: a fresh ``MemoryJournal``, lost with the process).
        limits: the default limits of a run; stored with each run.
        observers: callables receiving events; must not block; exceptions are logged.
        retry: how model calls are retried.
        cancel_grace_s: how long (seconds) an in-flight action may finish after cancellation.
        lease_ttl_s: the lease duration (renewed every third of it; each renewal is also
            when a run learns of a request to stop or cancel it made elsewhere).
        templates: the model-visible wording of the default adapters (version stored per run).
        approval_timeout_s: an approval request (a tool declared with ``approval=``) expires
            after this many seconds: ``polyloop recover`` then denies it, reason "timed out".
            None (default): it waits for a person however long it takes.
        wrap_up: when a budget ends a run, make one more model call, tools withheld (sent with
            ``ModelRequest.tool_choice="none"``), asking
            for the best final answer (``Templates.wrap_up``); the step has ``wrap_up=True``,
            the stop reason stays the budget's, and ``steps_used`` may exceed ``max_steps`` by
            one (see :mod:`polyloop.kernel.wrap_up`). Off by default: experiments choose it.
        clock: time source for timings and backoff (``polyloop.testing.FakeClock`` in tests).
        guards: run-end guards, checked in order when the model gives a final answer (those
            with ``on_task_completed`` also when a marker tool or the environment completed
            the run); a plain function becomes ``RunEndGuard(fn)`` (named after it, at most 2
            steers, final answers only).
        time_budget_grace_s: seconds a call may run past the time budget
            (``Limits.max_seconds``): every model call attempt and every action is given what
            is left of the budget when it begins plus this grace (the action as
            ``ToolContext.timeout_s``), no retry starts after the budget's end, and the
            wrap-up call gets this grace of its own (see :mod:`polyloop.kernel.deadline`). A
            run with a time budget is then active at most ``max_seconds`` plus the grace (two
            with ``wrap_up``) plus what cannot be interrupted (journal writes, code that does
            not await). 5 s by default: enough for an answer that is arriving to arrive (a
            reply being streamed, a timed-out command being killed and reported), small
            against the minutes runs are budgeted. 0: every call is stopped at the budget's
            end.
        report_hook: ``report_hook(report) -> [direction, ...]``: candidate directions of
            your own for the escalation report of a ``repeated_failure`` run, appended to
            those PolyLoop reads from the ledger (sync; must not block; an exception it raises
            propagates and the run stays resumable).

    Raises:
        TypeError: both ``tools`` and ``environment`` given, or a seam of the wrong shape.
        ConfigError: ``cancel_grace_s`` or ``time_budget_grace_s`` not a finite number
            >= 0, ``lease_ttl_s`` not a finite number > 0, ``approval_timeout_s`` neither None
            nor a finite number > 0 (NaN, ``inf`` and bools are refused: "never" is None).

    A ``Loop`` keeps no per-run state beyond its active runs (for :meth:`detach`, and to hand
    :meth:`stop` / :meth:`cancel` requests to them at once), so concurrent ``run`` calls on one
    ``Loop`` are fine.
    """

    def __init__(
        self,
        model: Model,
        *,
        tools: ToolRegistry | None = None,
        environment: Environment | None = None,
        interpreter: Interpreter | None = None,
        context: ContextBuilder | None = None,
        journal: Journal | None = None,
        limits: Limits | None = None,
        observers: Sequence[Observer] = (),
        retry: RetryPolicy | None = None,
        cancel_grace_s: float = 5.0,
        lease_ttl_s: float = 30.0,
        templates: Templates = DEFAULT_TEMPLATES,
        clock: Clock | None = None,
        guards: Sequence[RunEndGuard | GuardCheck] = (),
        wrap_up: bool = False,
        report_hook: ReportHook | None = None,
        approval_timeout_s: float | None = None,
        time_budget_grace_s: float = 5.0,
    ) -> None:
        if tools is not None and environment is not None:
            raise TypeError(
                "pass tools= or environment=, not both (tools=r means "
                "environment=ToolEnvironment(r))"
            )
        if not callable(getattr(model, "complete", None)):
            raise TypeError(f"model must have an async complete(request) method, got {model!r}")
        check_number("cancel_grace_s", cancel_grace_s, unit=" of seconds")
        check_number("lease_ttl_s", lease_ttl_s, above=True, unit=" of seconds")
        check_number("time_budget_grace_s", time_budget_grace_s, unit=" of seconds")
        check_number(
            "approval_timeout_s", approval_timeout_s, above=True, none="never", unit=" of seconds"
        )
        if report_hook is not None and not callable(report_hook):
            raise TypeError(f"report_hook must be callable, got {report_hook!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError(f"limits must be a polyloop.Limits, got {type(limits).__name__}")
        if environment is None:
            registry = tools if tools is not None else ToolRegistry()  # an empty one too
            environment = ToolEnvironment(registry, templates=templates)
        self.limits = limits or Limits()
        self.journal: Journal = journal if journal is not None else MemoryJournal()
        self.environment = environment
        self._kernel = Kernel(
            KernelConfig(
                model=model,
                interpreter=interpreter or NativeToolCallInterpreter(templates=templates),
                environment=environment,
                context_builder=context or ChatContextBuilder(templates=templates),
                journal=self.journal,
                observers=tuple(observers),
                retry=retry or RetryPolicy(),
                cancel_grace_s=cancel_grace_s,
                lease_ttl_s=lease_ttl_s,
                clock=clock or SystemClock(),
                wording_version=_wording_version(templates, environment),
                guards=_guards(guards),
                wrap_up=wrap_up,
                wrap_up_prompt=templates.wrap_up,
                wrap_up_no_action=templates.wrap_up_no_action,
                report_hook=report_hook,
                approval_timeout_s=approval_timeout_s,
                approval_denied=templates.approval_denied,
                time_budget_grace_s=float(time_budget_grace_s),
                price_table=table_price,
            )
        )

    async def run(
        self,
        goal: str,
        *,
        run_id: str | None = None,
        history: Sequence[Message] = (),
        metadata: Mapping[str, Any] | None = None,
        limits: Limits | None = None,
    ) -> RunResult:
        """Start a new run and drive it to its end.

        Args:
            goal: what the run is for; the first user message.
            run_id: the run's id (default: a fresh one).
            history: messages to continue from (e.g. a previous phase's transcript); stored
                with the run, counted in ``prompt_chars``, in no budget; ``step_idx`` still
                starts at 0.
            metadata: JSON-ready data stored with the run.
            limits: this run's limits (default: the ``Loop``'s).

        Returns:
            The :class:`RunResult`; its ``stop_reason`` says why the run stopped.

        Raises:
            RunExists: ``run_id`` is already in the journal (nothing written).
            ConfigError: the goal, history or metadata holds text that is not valid Unicode,
                or nests more than ``polyloop.types.MAX_NESTING`` levels (nothing written).
            RunDetached: :meth:`detach` paused the run (no end record; resumable).
            asyncio.CancelledError: re-raised after the ``cancelled`` end record is written
                (a cancellation of this call; :meth:`cancel` instead makes it return the
                result, ``stop_reason = cancelled``).

        After a crash, a cancellation or a detach: every step whose record was written is in
        the journal; an action in flight may or may not have happened, and resume decides by
        its replay policy. An exception from the environment (its ``execute``, ``reconcile``,
        ``replay_policy`` or ``needs_approval``) does not propagate: the step is recorded
        ``env_error`` with the exception's type and message, and the run ends ``env_error``
        (see :class:`polyloop.seams.Environment`). Any other exception propagates with no end
        record, and the run can be resumed.
        """
        if not isinstance(goal, str):
            raise TypeError(f"goal must be a str, got {type(goal).__name__}")
        return await self._kernel.start(
            goal,
            limits=limits or self.limits,
            run_id=run_id,
            history=history,
            metadata=metadata,
        )

    async def resume(self, run_id: str, *, limits: Limits | None = None) -> RunResult:
        """Continue a journaled run from where its records end.

        An ended run comes back as it ended, with no model or environment call (a cancelled
        run with ``stop_reason = cancelled``); ``limits`` is then ignored. Otherwise ``limits``
        overrides the stored limits from here on (the override is journaled).

        Raises:
            RunNotFound: no such run.
            RunLeased: another live execution is advancing it (nothing written).
            JournalError: its records are damaged or out of order (nothing written).
            RunDetached / asyncio.CancelledError: as for :meth:`run`.
        """
        return await self._kernel.resume(run_id, limits=limits)

    def detach(self, run_id: str) -> bool:
        """Pause an active run at its next step boundary: no end record, lease released,
        ``run``/``resume`` raise ``RunDetached``; continue later with :meth:`resume`.
        Returns False when no such run is active on this ``Loop``."""
        return self._kernel.detach(run_id)

    async def stop(self, run_id: str, reason: str, *, by: str | None = None) -> RequestResult:
        """End a run ``stopped``, wherever it runs: ``stop_detail`` is ``reason``.

        The request is stored in the journal first (``runs.request`` etc.), so it works on a
        run that another process or host drives (SQLite and PostgreSQL journals). Then:

        * a run this ``Loop`` drives gets it at once; a live owner elsewhere at its next
          heartbeat (every ``lease_ttl_s / 3`` seconds, which bounds the delay). Either way the
          run ends at the next step boundary after that: a model call or action in flight
          finishes and its step is recorded first, and ``run``/``resume`` return the result
          (``stop_reason = stopped``). It may end for another reason first (the step in flight
          completes it): the request then stays in the row, unhonoured.
        * a run nobody drives (its owner crashed, it was detached, or it was created and never
          started) is ended now, fenced and exactly once; an action whose intent is durable
          without a result is named in ``pending_action`` and ``stop_detail`` (its outcome is
          unknown, as for ``resume_state_unknown``). A resume of it returns that result.
        * a run whose owner died after the request was stored is ended by whoever resumes it.

        Args:
            run_id: the run.
            reason: why, for the record (required, non-empty).
            by: who asks, stored as ``requested_by`` (default: ``user@host pid N``).

        Returns:
            A :class:`~polyloop.types.RequestResult`: ``happened`` is ``ended`` (ended now),
            ``requested`` (the live owner will), ``already_requested`` (a stop or cancel was
            pending: nothing written; ``request`` is that one) or ``already_ended`` (nothing
            changed; ``stop_reason`` is how it ended). A pending cancel is never downgraded.

        Raises:
            RunNotFound: no such run.
            ConfigError: no reason given, or the journal cannot take requests (it lacks
                ``request_end``).
        """
        return await self._kernel.request(run_id, "stop", reason, by)

    async def cancel(
        self, run_id: str, *, reason: str | None = None, by: str | None = None
    ) -> RequestResult:
        """End a run ``cancelled``, wherever it runs, as a local cancellation does: an action
        in flight gets ``cancel_grace_s`` to finish and is recorded, else named in
        ``stop_detail`` with its outcome unknown; ``stop_detail`` starts with ``reason`` when
        one is given. The owner cancels the run when it learns of the request (at once in this
        ``Loop``, at its next heartbeat elsewhere), but since nobody cancelled the caller of
        its ``run``/``resume``, that call **returns** the result (``stop_reason =
        cancelled``) instead of raising ``CancelledError``. A cancel replaces a pending stop.
        Otherwise as :meth:`stop` (same result value, same errors but for the reason, which
        is optional here)."""
        return await self._kernel.request(run_id, "cancel", reason, by)

    async def set_limits(
        self, run_id: str, *, by: str | None = None, reason: str, **limits: int | float | None
    ) -> LimitsRequest:
        """Change budgets of a run, wherever it runs: ``max_steps``, ``max_actions``,
        ``max_tokens``, ``max_cost`` (USD), ``max_seconds`` (the :class:`Limits` names; None:
        unbounded, except ``max_steps``). Works on a run that another process or host drives,
        or that is detached, parked or stale (SQLite and PostgreSQL journals).

        The request is journaled first, as one row of the ``requests`` table (the budgets'
        old and new values, ``by`` — default ``user@host pid N`` —, ``reason``, when). Then:

        * a run this ``Loop`` drives gets it at once; a live owner elsewhere at its next
          heartbeat (every ``lease_ttl_s / 3`` seconds). It applies the new limits at the next
          step boundary, before budget admission (rule A): a budget lowered to or below what
          the run has spent ends it there with that budget's stop reason (``step_budget``,
          ``token_budget`` …); a raised one lets it go on. A model call or action in flight
          finishes first.
        * a run nobody drives: the new limits are applied now (this call takes the run's lease
          for a moment) and the run is let go; ``resume`` goes on with them.

        Either way ``resume`` rebuilds the latest limits (a ``LimitsChanged`` record). Returns
        the stored request: ``seq`` its number in the run, ``applied_at``/``outcome`` set
        when it was applied here (``outcome = "applied"``), None while a live owner has yet to
        apply it (see the ``requests`` table for when it did).

        Raises:
            ConfigError: an unknown budget name, none at all, no reason, a value ``Limits``
                refuses (``max_steps`` <= 0 or None, zero, negative, NaN, infinite, a bool),
                the run has ended, or the journal takes no requests. Nothing is written.
            RunNotFound: no such run.
        """
        stored, _live = await self._kernel.set_limits(run_id, limits, reason, by)
        return stored

    async def approve(
        self, run_id: str, op_id: str, *, note: str | None = None, by: str | None = None
    ) -> ApprovalDecided:
        """Approve the action ``op_id`` a parked run awaits a decision on (``ApprovalRequired``
        said which), from any process: the decision is journaled (``approval_decided``) and
        the run's ``status`` is ``running`` again; ``resume`` then executes the action.

        Args:
            run_id, op_id: the run and its pending action (``polyloop pending`` lists them).
            note: for the record.
            by: who decides (default: ``user@host pid N``).

        Returns:
            The decision as written.

        Raises:
            AlreadyDecided: someone decided first (``.decision`` says who, when, what);
                nothing was written. Exactly one decision per action, also across processes.
            NotAwaitingApproval: the run awaits no decision on ``op_id`` (ended, not parked,
                or parked on another action).
            RunNotFound: no such run.
            ConfigError: the journal cannot take decisions (no ``decide``).
        """
        return await self._kernel.decide(run_id, op_id, True, note, by)

    async def deny(
        self, run_id: str, op_id: str, *, reason: str, by: str | None = None
    ) -> ApprovalDecided:
        """Deny the action ``op_id``: ``resume`` records it ``not_executed`` with the synthetic
        observation ``Templates.approval_denied`` carrying ``reason``, and the run goes on (the
        model sees why). ``reason`` is required. Otherwise as :meth:`approve`."""
        return await self._kernel.decide(run_id, op_id, False, reason, by)

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """The actions awaiting a decision in this Loop's journal, oldest request first:
        ``run_id``, ``step_idx``, ``op_id``, ``tool_name``, ``args_json``, ``action``,
        ``requested_at``, ``expires_at``. Read-only."""
        return await self._kernel.pending_approvals()

    def run_sync(self, goal: str, **kwargs: Any) -> RunResult:
        """:meth:`run` for scripts (runs its own event loop)."""
        return asyncio.run(self.run(goal, **kwargs))

    def resume_sync(self, run_id: str, *, limits: Limits | None = None) -> RunResult:
        """:meth:`resume` for scripts (runs its own event loop)."""
        return asyncio.run(self.resume(run_id, limits=limits))


def _guards(guards: Sequence[RunEndGuard | GuardCheck]) -> tuple[RunEndGuard, ...]:
    out = tuple(g if isinstance(g, RunEndGuard) else RunEndGuard(g) for g in guards)
    names = [g.name for g in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(
            f"run-end guards need distinct names (their steer counts are "
            f"journaled by name); duplicated: {dupes}"
        )
    return out


def _wording_version(templates: Templates, environment: Environment) -> str:
    """The version of all model-visible wording of a run: the templates', plus the wording
    sets of tools on the environment's registry (e.g. ``polyloop-1+polyloop-builtin-1``)."""
    registry = getattr(environment, "registry", None)
    extra = sorted(getattr(registry, "wording_versions", ()))
    return "+".join([templates.version, *extra])
