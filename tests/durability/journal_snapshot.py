"""The journal's stored form, pinned: the DDL as it lands in a fresh database of each durable
journal, and the rows a fixed sequence of journal calls leaves in it.

The calls (``OPS``) were recorded once from real runs on a memory journal — a run with a
retried model call, a large observation and a NUL in a tool's answer; a run parked on an
approval, one approved, one stopped while parked; a live run that received a stop request — and
are kept, with the DDL and the rows they wrote, in ``snapshots/journal_schema.json``. Replaying
them on a fresh SQLite file (each durability and writer) or PostgreSQL schema must write the same
rows (owners, which are random per execution, read as ``<owner>``).

``python -m tests.durability.journal_snapshot`` writes the snapshot again (with
``POLYLOOP_TEST_PG_DSN`` set, for the PostgreSQL half): only for a deliberate schema change,
which also moves the journal schema version.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from polyloop import ApprovalRequired, Limits, Loop, ModelCallError, ToolRegistry
from polyloop.journal import MemoryJournal
from polyloop.types import (
    ApprovalDecided,
    EndRequest,
    Lease,
    ModelIntent,
    Record,
    RequestResult,
    RunEnd,
    RunSpec,
    record_from_dict,
    record_to_dict,
)

SNAPSHOT = Path(__file__).with_name("snapshots") / "journal_schema.json"
NOW = 1_700_000_000.0
SQLITE_MODES = {
    "full-thread": {"durability": "full"},
    "normal-thread": {"durability": "normal"},
    "full-process": {"durability": "full", "writer": "process"},
    "normal-process": {"durability": "normal", "writer": "process"},
}
_KEYS = {
    "runs": ("run_id",),
    "steps": ("run_id", "step_idx"),
    "journal": ("run_id", "seq"),
    "model_calls": ("intent_id", "attempt"),
    "meta": ("key",),
}


# -- recording the calls ----------------------------------------------------------------------


def _spec_dict(spec: RunSpec) -> dict[str, Any]:
    return {
        "run_id": spec.run_id,
        "goal": spec.goal,
        "limits": spec.limits.to_dict(),
        "created_at": spec.created_at,
        "history": list(spec.history),
        "metadata": None if spec.metadata is None else dict(spec.metadata),
        "wording_version": spec.wording_version,
    }


def _spec(d: dict[str, Any]) -> RunSpec:
    return RunSpec(
        d["run_id"],
        d["goal"],
        Limits.from_dict(d["limits"]),
        d["created_at"],
        tuple(d["history"]),
        d["metadata"],
        d["wording_version"],
    )


def _records(rs: Sequence[Record]) -> list[dict[str, Any]]:
    return [record_to_dict(r) for r in rs]


class _Recording(MemoryJournal):
    """A memory journal that notes every call that writes, in order."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: NOW)
        self.ops: list[dict[str, Any]] = []

    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease:
        self.ops.append({"op": "create", "spec": _spec_dict(spec), "ttl_s": ttl_s})
        return await super().create(spec, ttl_s=ttl_s)

    async def acquire(self, run_id: str, *, ttl_s: float) -> Any:
        self.ops.append({"op": "acquire", "run_id": run_id, "ttl_s": ttl_s})
        return await super().acquire(run_id, ttl_s=ttl_s)

    async def append(self, lease: Lease, records: Sequence[Record]) -> None:
        self.ops.append({"op": "append", "run_id": lease.run_id, "records": _records(records)})
        await super().append(lease, records)

    async def renew(self, lease: Lease, *, ttl_s: float) -> Lease:
        self.ops.append({"op": "renew", "run_id": lease.run_id, "ttl_s": ttl_s})
        return await super().renew(lease, ttl_s=ttl_s)

    async def release(self, lease: Lease) -> None:
        self.ops.append({"op": "release", "run_id": lease.run_id})
        await super().release(lease)

    async def decide(self, run_id: str, decision: ApprovalDecided) -> ApprovalDecided:
        self.ops.append({"op": "decide", "run_id": run_id, "decision": record_to_dict(decision)})
        return await super().decide(run_id, decision)

    async def request_end(
        self, run_id: str, request: EndRequest, *, seen: int, end: Any
    ) -> RequestResult | None:
        op: dict[str, Any] = {
            "op": "request_end",
            "run_id": run_id,
            "request": [request.kind, request.reason, request.by, request.at],
            "seen": seen,
            "end": None,
        }
        self.ops.append(op)

        def ending(r: EndRequest) -> RunEnd:
            record = end(r)
            op["end"] = record_to_dict(record)
            return record  # type: ignore[no-any-return]

        return await super().request_end(run_id, request, seen=seen, end=ending)


async def record_ops() -> list[dict[str, Any]]:
    """Drive the scenarios on a recording memory journal; the calls it received."""
    from polyloop import ModelReply, ToolCall
    from polyloop.testing import FakeClock, FunctionModel

    journal = _Recording()
    tools = ToolRegistry()

    @tools.tool(replay="idempotent")
    def look(what: str) -> str:
        """Look at something."""
        return ("x" * 5000) if what == "big" else f"a\x00b {what}"

    @tools.tool(approval=True)
    def send(to: str) -> str:
        """Send a message."""
        return f"sent to {to}"

    failed: set[int] = set()

    def model(request: Any) -> ModelReply:
        if request.step_idx == 0 and 0 not in failed:
            failed.add(0)
            raise ModelCallError("busy", retryable=True, kind="rate_limit")
        if request.step_idx < 2:
            what = "big" if request.step_idx == 0 else "small"
            return ModelReply(
                tool_calls=(ToolCall("look", {"what": what}, f"c{request.step_idx}"),)
            )
        return ModelReply("done")

    def mailer(request: Any) -> ModelReply:
        if request.step_idx == 0:
            return ModelReply(tool_calls=(ToolCall("send", {"to": "ceo"}, "m0"),))
        return ModelReply("mailed")

    def loop(fn: Any) -> Loop:
        return Loop(FunctionModel(fn), tools=tools, journal=journal, clock=FakeClock(NOW))

    await loop(model).run("look twice", run_id="plain", metadata={"who": "snapshot"})
    parked: dict[str, str] = {}
    for run_id in ("parked", "approved", "stopped"):
        try:
            await loop(mailer).run("mail the CEO", run_id=run_id)
        except ApprovalRequired as exc:
            parked[run_id] = exc.op_id
    await loop(mailer).approve("approved", parked["approved"], note="fine", by="ops")
    await loop(mailer).resume("approved")
    await loop(mailer).stop("stopped", "not today", by="ops")
    spec = RunSpec("live", "wait", Limits(), NOW, (), None, "w1")
    lease = await journal.create(spec, ttl_s=60.0)
    # An attempt lost in a crash: the next attempt of its intent finds it pending.
    await journal.append(lease, [ModelIntent(0, "i-live", 1, "m")])
    await journal.append(lease, [ModelIntent(0, "i-live", 2, "m")])
    await journal.request_end("live", EndRequest("stop", "later", "ops", NOW), seen=0, end=_never)
    return journal.ops


def _never(request: EndRequest) -> RunEnd:
    raise AssertionError("a live run is not ended by a request")


# -- replaying them -----------------------------------------------------------------------------


async def replay(journal: Any, ops: Sequence[dict[str, Any]]) -> None:
    """Make the calls ``ops`` on ``journal`` (opened with ``clock=lambda: NOW``)."""
    leases: dict[str, Lease] = {}
    for op in ops:
        kind, run_id = op["op"], op.get("run_id")
        if kind == "create":
            leases[op["spec"]["run_id"]] = await journal.create(
                _spec(op["spec"]), ttl_s=op["ttl_s"]
            )
        elif kind == "acquire":
            leases[run_id], _, _ = await journal.acquire(run_id, ttl_s=op["ttl_s"])
        elif kind == "append":
            records = [record_from_dict(d) for d in op["records"]]
            await journal.append(leases[run_id], records)
        elif kind == "renew":
            leases[run_id] = await journal.renew(leases[run_id], ttl_s=op["ttl_s"])
        elif kind == "release":
            await journal.release(leases.pop(run_id))
        elif kind == "decide":
            decision = record_from_dict(op["decision"])
            await journal.decide(run_id, decision)
        elif kind == "request_end":
            ending = op["end"]
            record = _never if ending is None else (lambda r, d=ending: record_from_dict(d))
            await journal.request_end(
                run_id, EndRequest(*op["request"]), seen=op["seen"], end=record
            )
        else:  # pragma: no cover
            raise AssertionError(kind)


# -- reading what landed -------------------------------------------------------------------------


def _rows(table: str, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Any]:
    out = []
    for row in rows:
        d = dict(zip(names, row, strict=True))
        if d.get("owner") is not None:
            d["owner"] = "<owner>"
        out.append(d)
    return sorted(out, key=lambda d: [str(d[k]) for k in _KEYS[table]])


def sqlite_ddl(path: Path) -> list[list[Any]]:
    with sqlite3.connect(path) as conn:
        return [
            list(r) for r in conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name")
        ]


def sqlite_rows(path: Path) -> dict[str, list[Any]]:
    out = {}
    with sqlite3.connect(path) as conn:
        for table in _KEYS:
            cur = conn.execute(f"SELECT * FROM {table}")
            out[table] = _rows(table, [d[0] for d in cur.description], cur.fetchall())
    return out


def pg_ddl(db: Any) -> dict[str, Any]:
    """Tables, columns, types, defaults, storage options, indexes, constraints and views of
    the schema of ``db`` (a ``tests.durability.pg.Db``), the schema's name as ``<schema>``."""
    s = db.schema

    def sql(query: str, *args: Any) -> list[tuple[Any, ...]]:
        return db._execute(query, args)  # type: ignore[no-any-return]

    def norm(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
        return [[str(v).replace(s, "<schema>") if v is not None else None for v in r] for r in rows]

    return {
        "columns": norm(
            sql(
                "SELECT table_name, ordinal_position, column_name, data_type, column_default, "
                "is_nullable, character_maximum_length, numeric_precision "
                "FROM information_schema.columns WHERE table_schema = %s "
                "ORDER BY table_name, ordinal_position",
                s,
            )
        ),
        "tables": norm(
            sql(
                "SELECT c.relname, c.relkind, c.reloptions FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                "ORDER BY c.relname",
                s,
            )
        ),
        "indexes": norm(
            sql(
                "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = %s "
                "ORDER BY indexname",
                s,
            )
        ),
        "constraints": norm(
            sql(
                "SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid) "
                "FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                "ORDER BY c.relname, k.conname",
                s,
            )
        ),
        "views": norm(
            sql(
                "SELECT viewname, pg_get_viewdef((quote_ident(schemaname) || '.' || "
                "quote_ident(viewname))::regclass) FROM pg_views WHERE schemaname = %s "
                "ORDER BY viewname",
                s,
            )
        ),
    }


def pg_rows(db: Any) -> dict[str, list[Any]]:
    out = {}
    conn = db.connect()
    try:
        for table in _KEYS:
            cur = conn.execute(f"SELECT * FROM {table}")
            out[table] = _rows(table, [d.name for d in cur.description], cur.fetchall())
    finally:
        conn.close()
    return out


def as_json(value: Any) -> Any:
    """``value`` as the snapshot file holds it (tuples as lists, floats exact)."""
    return json.loads(json.dumps(value))


# -- writing the snapshot -------------------------------------------------------------------------


async def _sqlite_part(ops: list[dict[str, Any]]) -> dict[str, Any]:
    from polyloop.journal import SQLiteJournal

    ddl, rows = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for mode, kw in SQLITE_MODES.items():
            path = Path(folder) / f"{mode}.db"
            async with SQLiteJournal(path, clock=lambda: NOW, **kw) as journal:
                await replay(journal, ops)
            ddl[mode] = sqlite_ddl(path)
            rows[mode] = sqlite_rows(path)
    first = next(iter(rows.values()))
    assert all(r == first for r in rows.values()), "SQLite modes wrote different rows"
    return {"ddl": ddl, "rows": first}


async def _pg_part(ops: list[dict[str, Any]], dsn: str) -> dict[str, Any]:
    from tests.durability.pg import Db

    db = Db(dsn)
    try:
        async with db.journal(clock=lambda: NOW) as journal:
            await replay(journal, ops)
        return {"ddl": pg_ddl(db), "rows": pg_rows(db)}
    finally:
        db.drop()


async def _main() -> None:
    ops = as_json(await record_ops())
    snapshot: dict[str, Any] = {"ops": ops, "sqlite": await _sqlite_part(ops)}
    dsn = os.environ.get("POLYLOOP_TEST_PG_DSN")
    if dsn:
        snapshot["postgres"] = await _pg_part(ops, dsn)
    else:
        print("POLYLOOP_TEST_PG_DSN is not set: the PostgreSQL half is left out", file=sys.stderr)
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(as_json(snapshot), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")


if __name__ == "__main__":
    asyncio.run(_main())
