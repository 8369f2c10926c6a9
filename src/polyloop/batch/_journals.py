"""What a batch needs of a journal, and journal *specs*: strings that open the same journal
in another process (a Ray worker) — ``sqlite:/abs/path.db`` or a PostgreSQL URI."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from polyloop import ConfigError, Loop
from polyloop.types import Lease, Record, RunSpec

__all__ = [
    "BatchJournal",
    "LoopFactory",
    "is_postgres_spec",
    "journal_spec",
    "open_journal",
    "resolve_factory",
]


@runtime_checkable
class BatchJournal(Protocol):
    """The journal methods a batch uses (a subset of the Journal seam). ``list_runs`` (the SQLite
    and PostgreSQL journals have it) is used when present, and needed by the sweeper."""

    async def create(self, spec: RunSpec, *, ttl_s: float) -> Lease: ...

    async def read(self, run_id: str) -> tuple[RunSpec, Sequence[Record]]: ...

    async def release(self, lease: Lease) -> None: ...


LoopFactory = Callable[[Any], Loop] | str
"""Builds the ``Loop`` that executes runs, given the journal to use: a callable
``make_loop(journal) -> Loop``, or its dotted path ``"package.module:function"``. It is called
once per worker (once per batch on the local backend, once per actor on Ray), and that Loop
drives many runs concurrently, so its model and tools must not keep per-run state. For Ray it
must be importable or picklable on the workers (a module-level function, or a path)."""

_PG_SCHEMES = ("postgresql://", "postgres://")
_SCHEMA_MARK = "#schema="


def resolve_factory(make_loop: LoopFactory) -> Callable[[Any], Loop]:
    """The callable behind ``make_loop`` (importing ``"module:function"`` paths).

    Raises:
        ConfigError: a path that does not name an importable callable.
    """
    if not isinstance(make_loop, str):
        if not callable(make_loop):
            raise ConfigError(f"make_loop must be callable or 'module:function', got {make_loop!r}")
        return make_loop
    module_name, sep, attr = make_loop.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"make_loop path must look like 'package.module:function', got {make_loop!r}"
        )
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load make_loop {make_loop!r}: {exc}") from None
    if not callable(target):
        raise ConfigError(f"make_loop {make_loop!r} is not callable")
    fn: Callable[[Any], Loop] = target
    return fn


def journal_spec(journal: Any) -> str:
    """A string that opens ``journal`` again elsewhere (:func:`open_journal`):
    ``sqlite:/absolute/path`` for a ``SQLiteJournal``, the DSN (plus ``#schema=NAME``) for a
    ``PostgresJournal``. A string is returned as it is.

    Raises:
        ConfigError: any other journal (a ``MemoryJournal`` lives in one process only).
    """
    if isinstance(journal, str):
        return journal
    from polyloop.journal import SQLiteJournal

    if isinstance(journal, SQLiteJournal):
        return "sqlite:" + os.path.abspath(journal.path)
    dsn = getattr(journal, "dsn", None)
    if type(journal).__name__ == "PostgresJournal" and isinstance(dsn, str):
        schema = getattr(journal, "schema", None)
        return dsn + (f"{_SCHEMA_MARK}{schema}" if schema else "")
    raise ConfigError(
        f"{type(journal).__name__} cannot be opened by another process: run distributed "
        "batches on a SQLiteJournal (same machine) or a PostgresJournal"
    )


def is_postgres_spec(spec: str) -> bool:
    """Does ``spec`` name a PostgreSQL journal (``postgresql://…`` / ``postgres://…``)?"""
    return spec.startswith(_PG_SCHEMES)


def open_journal(spec: str) -> Any:
    """Open the journal a spec names: ``postgresql://…`` / ``postgres://…`` (optionally ending
    in ``#schema=NAME``) is a ``PostgresJournal`` (extra ``polyloop[postgres]``); ``sqlite:PATH``
    or a plain path is a ``SQLiteJournal``. Close it with ``aclose()`` when done.

    Raises:
        ConfigError: an empty spec. ``JournalError``/``ImportError`` as the journal raises them.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"a journal spec is a SQLite path or a PostgreSQL URI, got {spec!r}")
    if is_postgres_spec(spec):
        from polyloop.journal import PostgresJournal

        dsn, mark, schema = spec.partition(_SCHEMA_MARK)
        return PostgresJournal(dsn, schema=schema if mark else None)
    from polyloop.journal import SQLiteJournal

    path = spec.removeprefix("sqlite:")
    return SQLiteJournal(path)


@contextlib.asynccontextmanager
async def journal_of(journal: BatchJournal | str) -> AsyncIterator[BatchJournal]:
    """``journal`` itself, or, for a spec string, the journal it names (:func:`open_journal`),
    closed when the block ends."""
    if not isinstance(journal, str):
        yield journal
        return
    opened = open_journal(journal)
    try:
        yield opened
    finally:
        await opened.aclose()
