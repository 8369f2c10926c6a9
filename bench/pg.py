"""PostgreSQL for the ``polyloop_postgres`` system: the server, and what a child reads from it.

The server (the parent, :func:`server`): ``--pg-dsn``, else ``POLYLOOP_BENCH_PG_DSN``, else a
throwaway cluster started with ``.ci/postgres.sh start DIR`` — which starts it with the tests'
``fsync=off`` and ``full_page_writes=off`` — and restarted at once with the server's default
settings (fsync on, ``synchronous_commit=on``), stopped and deleted at the end. ``--quick``
starts no server. Children get the DSN in ``POLYLOOP_BENCH_PG_DSN`` (never in the results).

A child (:class:`Schema`): a fresh schema per configuration and repetition, dropped at its end;
snapshots of the server's WAL position, the schema's size on disk and the CPU time of the
server's processes (from ``/proc``, when the server runs on this machine).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ENV = "POLYLOOP_BENCH_PG_DSN"
SCRIPT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".ci", "postgres.sh"
)
POOL = 10  # PostgresJournal's default max_size; the child opens all of them before timing
SETTINGS = (
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "commit_delay",
    "shared_buffers",
    "max_connections",
)


class Unavailable(Exception):
    """PostgreSQL cannot be measured here; the message says why."""


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401  (the journal needs it too)
    except ImportError as exc:
        raise Unavailable(f"not installed here ({exc}; pip install -e '.[bench]')") from None
    return psycopg


def describe(dsn: str) -> dict[str, Any]:
    """The server's address (no password), version and settings; raises Unavailable."""
    psycopg = _psycopg()
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    where = f"{info.get('host') or 'local socket'}:{info.get('port') or 5432}/{info.get('dbname')}"
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
            rows = conn.execute(
                "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
                (list(SETTINGS),),
            ).fetchall()
    except psycopg.Error as exc:
        raise Unavailable(f"cannot connect to PostgreSQL at {where}: {exc}") from None
    return {"server": where, "version": version, "settings": dict(rows)}


@contextlib.contextmanager
def server(dsn: str | None, *, start: bool) -> Iterator[dict[str, Any]]:
    """The DSN to measure on, with :func:`describe`'s facts and ``started`` (whether the cluster
    is the runner's own). Raises Unavailable when there is none and none can be started."""
    _psycopg()
    if dsn:
        yield {"dsn": dsn, "started": False, **describe(dsn)}
        return
    if not start:
        raise Unavailable(f"--quick starts no server: pass --pg-dsn or set {ENV}")
    if shutil.which("bash") is None or not os.path.exists(SCRIPT):
        raise Unavailable(f"no DSN given and no bash or {SCRIPT} to start a server")
    folder = tempfile.mkdtemp(prefix="polyloop-bench-pg-")
    try:
        dsn = _start(folder)
        yield {"dsn": dsn, "started": True, **describe(dsn)}
    finally:
        subprocess.run(
            ["bash", SCRIPT, "stop", folder], capture_output=True, check=False, timeout=120
        )
        shutil.rmtree(folder, ignore_errors=True)


def _start(folder: str) -> str:
    """Start a cluster in ``folder`` with the script, then restart it with the default settings
    (only address, port and socket folder given). Its DSN."""
    try:
        started = subprocess.run(
            ["bash", SCRIPT, "start", folder], capture_output=True, text=True, timeout=900
        )
    except subprocess.TimeoutExpired:
        raise Unavailable(f"{SCRIPT} start did not finish in 900 s") from None
    if started.returncode != 0:
        tail = " | ".join(started.stderr.strip().splitlines()[-3:])
        raise Unavailable(f"starting PostgreSQL failed ({tail})")
    data = os.path.join(folder, "data")
    with open(os.path.join(data, "postmaster.opts")) as f:
        binary = shlex.split(f.read())[0]  # the server binary; pg_ctl is beside it
    with open(os.path.join(folder, "port")) as f:
        port = f.read().strip()
    owner = os.stat(data).st_uid  # the script runs the server as `postgres` when we are root
    as_owner = [] if owner == os.getuid() else ["runuser", "-u", pwd.getpwuid(owner).pw_name, "--"]
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}"
    restart = [os.path.join(os.path.dirname(binary), "pg_ctl"), "-D", data, "-w", "-t", "60"]
    restart += ["-l", os.path.join(folder, "server.log"), "-m", "fast", "restart", "-o", options]
    done = subprocess.run(
        [*as_owner, *restart], capture_output=True, text=True, cwd="/", timeout=120
    )
    if done.returncode != 0:
        raise Unavailable(f"restarting PostgreSQL with its defaults failed: {done.stderr.strip()}")
    return started.stdout.strip()


@dataclass
class Snapshot:
    wal: int  # bytes of WAL written since the cluster began
    stored: int  # the schema's tables with their indexes and TOAST, on disk
    cpu: dict[int, float] | None  # seconds per server process; None: not visible here


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a PostgreSQL process on this machine, else None."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "postgres":
                return None
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Schema:
    """A fresh schema on the server (the journal creates it), dropped by :meth:`drop`."""

    def __init__(self, dsn: str) -> None:
        self.name = f"bench_{os.getpid()}_{secrets.token_hex(4)}"
        self._conn = _psycopg().connect(dsn, autocommit=True)

    def snapshot(self) -> Snapshot:
        q = self._conn.execute
        wal = int(q("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()[0])
        stored = q(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind = 'r'",
            (self.name,),
        ).fetchone()[0]
        pids = q("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()").fetchall()
        cpu = {pid: _cpu_s(pid) for (pid,) in pids}
        seen = {pid: s for pid, s in cpu.items() if s is not None}
        return Snapshot(wal, int(stored), seen if len(seen) == len(cpu) else None)

    @staticmethod
    def extra(before: Snapshot, after: Snapshot) -> dict[str, float]:
        """The measured section's WAL bytes, stored bytes and server CPU seconds (a process
        that started meanwhile counts whole; one that ended meanwhile is lost)."""
        out: dict[str, float] = {
            "journal_bytes": after.wal - before.wal,
            "stored_bytes": after.stored - before.stored,
        }
        if before.cpu is not None and after.cpu is not None:
            out["server_cpu_s"] = sum(s - before.cpu.get(pid, 0.0) for pid, s in after.cpu.items())
        return out

    def drop(self) -> None:
        try:
            self._conn.execute(f'DROP SCHEMA IF EXISTS "{self.name}" CASCADE')
        finally:
            self._conn.close()
