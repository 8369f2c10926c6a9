"""The five seams of the kernel (kernel.md §3), as ``typing.Protocol`` classes, plus a clock.

The kernel calls only these; adapters implement them. Anything that has the methods fits: no
base class to inherit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from .types import (
    Action,
    ApprovalDecided,
    Decision,
    EndRequest,
    Lease,
    LimitsRequest,
    Message,
    ModelReply,
    ModelRequest,
    Outcome,
    Record,
    ReplayPolicy,
    RequestResult,
    RunEnd,
    RunSpec,
    ToolContext,
    ToolSpec,
    Turn,
    Usage,
)

__all__ = [
    "Approvals",
    "Clock",
    "Context",
    "ContextBuilder",
    "EndRequests",
    "Environment",
    "Interpreter",
    "Journal",
    "Model",
    "ModelChain",
    "NeedsApproval",
    "PriceTable",
    "Pricer",
    "model_name",
]


@runtime_checkable
class Model(Protocol):
    """One model call per ``complete``.

    Raise ``ModelCallError(retryable=True)`` for failures worth retrying (rate limits, timeouts,
    5xx: the kernel retries with backoff, honouring ``retry_after``); any other exception is an
    unrecoverable model failure and ends the run ``llm_error``. A model call must have no side
    effect on the environment: after a crash it may be made again.
    """

    async def complete(self, request: ModelRequest) -> ModelReply: ...


@runtime_checkable
class ModelChain(Protocol):
    """A model that is several models in order (:class:`polyloop.FallbackModel`). The kernel
    asks ``models[0]``, retrying it per the retry policy; when an attempt fails with a kind in
    ``fallback_on`` and is not (or no longer) retried, the next attempt asks the next model,
    with a fresh retry budget. Each attempt is journaled with the ``name`` of the model it
    asked. ``complete`` is for use outside a run (it asks the models in turn, no retries)."""

    @property
    def models(self) -> Sequence[Model]: ...

    @property
    def fallback_on(self) -> frozenset[str]: ...

    async def complete(self, request: ModelRequest) -> ModelReply: ...


def model_name(model: object) -> str | None:
    """The ``name`` a model gives itself (a str attribute, optional: the built-in adapters
    give ``"provider:model"``, e.g. ``"openai:gpt-4o-mini"``), or None. Journaled with each
    attempt (``model_calls.model``) and in the step it answered (``StepRecord.model``)."""
    name = getattr(model, "name", None)
    return name if isinstance(name, str) and name else None


@runtime_checkable
class Interpreter(Protocol):
    """Turns one reply into exactly one decision: ``Action``, ``FinalAnswer`` or
    ``InvalidDecision``. Pure: no I/O, same reply in, same decision out (resume re-interprets
    a journaled reply). An exception raised here is a bug and propagates."""

    def interpret(self, reply: ModelReply, tool_specs: Sequence[ToolSpec]) -> Decision: ...


@runtime_checkable
class Environment(Protocol):
    """Where actions happen.

    ``execute`` returns an ``Outcome``; it raises ``EnvironmentFailure`` only when the
    environment itself is broken (the kernel records ``env_error``). An environment that
    breaks the Outcome contract (returns something else, or raises ``MalformedValue`` building
    its Outcome, in ``execute`` or ``reconcile``) is recorded as ``env_error`` too, with the
    validation message. Any other exception (an ``Exception``: a bug in the environment) from
    ``execute``, ``reconcile``, ``replay_policy`` or ``needs_approval`` is recorded the same
    way, never propagated: the step is written with ``action_status = env_error`` and the
    synthetic observation ``"<ExceptionType>: <message>"`` (for a method other than
    ``execute``, naming it and saying that the action was not executed, or for ``reconcile``
    that whether it happened is not known), the traceback goes to the ``polyloop`` log, and
    the run ends ``env_error`` with that text as ``stop_detail``, in one transaction with the
    step. An ``execute`` that raised was called: its action result is journaled (it may have
    acted), so no resume runs it again. A ``replay_policy`` or ``needs_approval`` that raised
    leaves no action intent (nothing ran). ``asyncio.CancelledError``, ``KeyboardInterrupt``
    and ``SystemExit`` still propagate. If it is cancelled or the
    process dies mid-call, the action may or may not have happened, and there is no way to know
    which: ``replay_policy`` tells resume what to do about that, and ``reconcile`` (for the
    ``reconcile`` policy) asks the environment whether the action with this ``ctx.op_id``
    happened (an ``Outcome``), did not (None), or cannot be told (raise ``OutcomeUnknown``).
    """

    def tool_specs(self) -> Sequence[ToolSpec]: ...

    async def execute(self, action: Action, ctx: ToolContext) -> Outcome: ...

    def replay_policy(self, action: Action) -> ReplayPolicy: ...

    async def reconcile(self, action: Action, ctx: ToolContext) -> Outcome | None: ...


@runtime_checkable
class NeedsApproval(Protocol):
    """An environment some of whose actions need a person's approval before they run (the
    ``ToolEnvironment`` of tools declared with ``approval=``). Optional: an environment without
    ``needs_approval`` never parks a run. The kernel asks it once per action, after
    ``replay_policy`` and before the action intent is written; True parks the run."""

    def needs_approval(self, action: Action) -> bool: ...


@runtime_checkable
class Context(Protocol):
    """The conversation of one run, built incrementally.

    ``prompt_chars`` is kernel.md §7's measure of ``messages()`` plus the tool specs, kept up to
    date as steps are added (never re-measured over the whole history). ``messages()`` returns
    an immutable snapshot, valid forever (later steps do not change it).
    """

    @property
    def prompt_chars(self) -> int: ...

    def messages(self) -> Sequence[Message]: ...

    def add_step(self, turn: Turn) -> None: ...


@runtime_checkable
class ContextBuilder(Protocol):
    """Makes the per-run :class:`Context`. One builder serves many concurrent runs, so all
    per-run state lives in the context it returns. Building the same turns in the same order
    must give byte-identical messages (resume relies on it)."""

    def new(
        self, *, goal: str, history: Sequence[Message], tool_specs: Sequence[ToolSpec]
    ) -> Context: ...


@runtime_checkable
class Journal(Protocol):
    """The write-ahead log of runs (durability.md).

    Every method may be called concurrently for different runs. Writes of a run are fenced by
    its :class:`Lease`: ``append`` raises ``LeaseLost`` (writing nothing) when the lease is no
    longer this execution's.

    After a crash, every record whose ``append`` returned is durable, and one ``append`` is all
    or nothing. If ``append`` is cancelled, it still finishes the write before ``CancelledError``
    propagates (the records are then durable), unless the write itself fails.
    """

    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease:
        """Store a new run and take its lease. Raises ``RunExists`` (writing nothing)."""
        ...

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]:
        """The run and its records in ``seq`` order. Read-only. Raises ``RunNotFound``."""
        ...

    async def acquire(
        self, run_id: str, *, ttl_s: float
    ) -> tuple[Lease, RunSpec, Sequence[Record]]:
        """Take the run's lease, then read it. Raises ``RunNotFound``, or ``RunLeased`` when a
        live execution holds it (writing nothing)."""
        ...

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        """Durably append records in one transaction; a ``RunEnd`` among them releases the
        lease in that same transaction."""
        ...

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        """Extend the lease's expiry (only the expiry). Raises ``LeaseLost``."""
        ...

    async def release(self, lease: Lease) -> None:
        """Give the lease up (no-op if it is no longer ours)."""
        ...


@runtime_checkable
class EndRequests(Protocol):
    """A journal that takes requests to end a run from any process (``Loop.stop`` /
    ``Loop.cancel``); the memory, SQLite and PostgreSQL journals do. A journal without it makes
    ``Loop.stop`` raise ``ConfigError``. Such a journal also hands the stored request out with
    every lease (``Lease.request``, from ``acquire`` and ``renew``), so a run's owner learns of
    it at its next heartbeat with no read of its own.
    """

    async def request_end(
        self,
        run_id: str,
        request: EndRequest,
        *,
        seen: int,
        end: Callable[[EndRequest], RunEnd],
    ) -> RequestResult | None:
        """Store ``request`` for the run, in one transaction that also decides what it does:

        * the run has ended: nothing is written, ``already_ended``;
        * ``request`` replaces the stored one (:meth:`EndRequest.replaces`) or none is stored:
          it is written; otherwise the stored one stays in force;
        * a live execution holds the lease (not expired, owner not provably dead): ``requested``
          (or ``already_requested`` when nothing was written);
        * nobody does: the run ends now, fenced, in this same transaction: if the run still has
          exactly ``seen`` records, the end record ``end(in_force)`` is appended (releasing any
          lease, as every end record does) and the answer is ``ended``; if it has more (some
          execution wrote since the caller read them), nothing is written and the answer is
          None: read the records again and retry.

        ``end`` is pure and quick (it may run on the journal's writer thread). Raises
        ``RunNotFound``. After a crash the transaction is all or nothing.
        """
        ...


@runtime_checkable
class LimitRequests(Protocol):
    """A journal that takes requests to change a run's budgets from any process
    (``Loop.set_limits``), one row each in its ``requests`` table; the memory, SQLite and
    PostgreSQL journals do. Such a journal hands the requests no owner has applied yet out with
    every lease (``Lease.limits``, from ``acquire`` and ``renew``)."""

    async def request_limits(self, request: LimitsRequest) -> LimitsRequest:
        """Store ``request`` as the run's next request (no lease needed); it comes back with
        its ``seq``. Raises ``RunNotFound``."""
        ...

    async def settle_requests(
        self, run_id: str, settled: Sequence[tuple[int, str]], *, at: float
    ) -> None:
        """Mark each (seq, outcome) of the run's requests settled at ``at`` (epoch s); one
        settled already stays as it was."""
        ...

    async def requests(self, run_id: str) -> list[dict[str, Any]]:
        """The run's requests by ``seq``, as dicts of the ``requests`` columns with
        ``values`` decoded from ``values_json``. Read-only."""
        ...


@runtime_checkable
class Approvals(Protocol):
    """A journal that takes a person's decision on a parked run's action from any process
    (``Loop.approve`` / ``Loop.deny``); the memory, SQLite and PostgreSQL journals do. Such a
    journal sets ``runs.status`` to ``'awaiting_approval'`` in the transaction that appends an
    ``ApprovalRequested`` record, and back to ``'running'`` with the decision."""

    async def decide(self, run_id: str, decision: ApprovalDecided) -> ApprovalDecided:
        """Append ``decision`` to the run, in one transaction under the journal's write lock,
        if and only if its action (``decision.op_id``) awaits a decision: the run's last
        ``ApprovalRequested`` is for that op and no ``ApprovalDecided`` follows it. Returns the
        decision that stands: ``decision`` itself when written, else the one written first
        (two deciders racing: exactly one wins). Needs no lease (a parked run has no owner;
        nothing else writes to it while it waits). Raises ``RunNotFound``, or
        ``NotAwaitingApproval`` when the action awaits no decision and has none."""
        ...

    async def pending_approvals(self) -> list[dict[str, Any]]:
        """The actions awaiting a decision, oldest first: dicts with ``run_id``, ``step_idx``,
        ``op_id``, ``tool_name``, ``args_json``, ``action``, ``requested_at``, ``expires_at``.
        Read-only."""
        ...


class Pricer(Protocol):
    """A model's prices: ``cost(usage)`` is what one attempt's ``usage`` cost in US dollars,
    or None when it cannot be priced. A :class:`polyloop.Pricing` is one (a model's own
    ``pricing``); the price table's entries (:mod:`polyloop.models.prices`) are others."""

    def cost(self, usage: Usage) -> float | None: ...


PriceTable = Callable[[str], "Pricer | None"]
"""The prices of the model named ``name`` (a model's ``name``, ``"openai:gpt-4o-mini"``), or
None when they are not known: asked once per model when a ``Loop`` is built, for the models
that have no ``pricing`` of their own."""


@runtime_checkable
class Clock(Protocol):
    """Time for the kernel: step timings, timestamps and retry backoff. Inject a fake one in
    tests (``polyloop.testing.FakeClock``) so backoff never really sleeps."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...
