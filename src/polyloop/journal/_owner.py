"""Owner identities for leases: unique per execution, and provably dead when the process is.

An owner string is ``<host id>/<pid>/<process start time>/<token>``. The host id combines the
kernel's boot id with the pid-namespace id, so two containers sharing a hostname differ, and
a reboot changes it. The random token makes two executions in one process (two ``Loop`` runs)
different owners.

"Provably dead" (durability.md "Leases") is decided from ``/proc`` of this host: no process with
the owner's pid and start time, or one that can never run an instruction of its own again — a
zombie (it exited; its parent has not reaped it yet, which may take a while or never happen)
or a process being torn down by a SIGKILL (``kill -9`` returned; the kernel has not finished).
A stopped (SIGSTOP) or traced process is alive, and so is a process whose main thread exited
while other threads still run (the leader shows as a zombie then).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
from dataclasses import dataclass

__all__ = ["OwnerId", "new_owner", "owner_is_dead", "parse_owner"]


@dataclass(frozen=True, slots=True)
class OwnerId:
    host: str
    pid: int
    start: str
    token: str

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.start}/{self.token}"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


_host_cache: str | None = None


def host_id() -> str:
    """Boot id + pid-namespace id (Linux); the hostname elsewhere."""
    global _host_cache
    if _host_cache is None:
        boot = _read("/proc/sys/kernel/random/boot_id")
        try:
            ns = os.readlink("/proc/self/ns/pid").partition("[")[2].rstrip("]")
        except OSError:
            ns = ""
        _host_cache = f"{boot}:{ns}" if boot else f"host:{socket.gethostname()}"
    return _host_cache


def _stat(pid: int) -> tuple[str, str] | None:
    """(state letter, start time in clock ticks since boot) of a process, or None if none."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # Fields 3 and 22; the command name (field 2) may contain spaces, so split after its ")".
    rest = stat.rpartition(")")[2].split()
    return (rest[0], rest[19]) if len(rest) > 19 else None


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if no such process."""
    seen = _stat(pid)
    return None if seen is None else seen[1]


_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
_EXITED = ("Z", "X")  # zombie, dead (being reaped)


def _never_runs_again(pid: int, start: str) -> bool:
    """Whether the process ``pid`` (seen with start time ``start``) can never execute another
    instruction of its own: a SIGKILL is queued for the whole process (it is being torn down;
    no thread returns to user space), or its leader has exited and no other thread is left (a
    zombie). Answers False when in doubt."""
    fields: dict[str, str] = {}
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    try:
        state = fields["State"][:1]
        threads = int(fields.get("Threads", "0"))
        pending = int(fields.get("ShdPnd", "0"), 16)
    except (KeyError, ValueError):
        return False
    if pending & _SIGKILL_BIT:  # SIGKILL cannot be caught, blocked or ignored
        return True
    if state not in _EXITED or threads != 1:
        return False  # running, sleeping, stopped, traced; or a zombie leader with live threads
    # A zombie alone. Read the state again: a thread that exec'd while the leader was a zombie
    # takes over its pid (and start time), and only its own state shows it is running.
    again = _stat(pid)
    return again is None or again[1] != start or again[0] in _EXITED


_self_cache: tuple[int, str] | None = None


def _self_prefix() -> str:
    """``<host id>/<pid>/<start time>`` of this process, read from /proc once per process (a
    forked child has another pid and reads its own)."""
    global _self_cache
    pid = os.getpid()
    if _self_cache is None or _self_cache[0] != pid:
        _self_cache = (pid, f"{host_id()}/{pid}/{process_start(pid) or '?'}")
    return _self_cache[1]


def new_owner() -> str:
    """A fresh owner identity for one execution of a run."""
    return f"{_self_prefix()}/{secrets.token_hex(8)}"


def parse_owner(owner: str) -> OwnerId | None:
    parts = owner.split("/")
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return OwnerId(parts[0], int(parts[1]), parts[2], parts[3])


def owner_is_dead(owner: str) -> bool:
    """True only when the owner provably cannot be running: same host, and no process with its
    pid and start time, or that process can never run again (a zombie not yet reaped by its
    parent, or a process a SIGKILL is tearing down), so ``kill -9`` then resume takes the lease
    over at once. A stopped or otherwise live process is never dead; any doubt (another host,
    unreadable /proc) answers False. Reads a few small /proc files: called only when a run's
    lease is found held, never per step."""
    o = parse_owner(owner)
    if o is None or o.host != host_id() or o.start == "?":
        return False
    if o.pid == os.getpid():
        return False  # this very process: alive (another execution in it holds the lease)
    seen = _stat(o.pid)
    if seen is None or seen[1] != o.start:
        return True  # no such process, or the pid now names another one
    return _never_runs_again(o.pid, o.start)
