"""Owner identities for leases: unique per execution, and provably dead when the process is.

An owner string is ``<host id>/<pid>/<process start time>/<token>``. The host id combines the
kernel's boot id with the pid-namespace id, so two containers sharing a hostname differ, and
a reboot changes it. The random token makes two executions in one process (two ``Loop`` runs)
different owners.
"""

from __future__ import annotations

import os
import secrets
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


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if no such process."""
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    # Field 22; the command name (field 2) may contain spaces, so split after its ")".
    rest = stat.rpartition(")")[2].split()
    return rest[19] if len(rest) > 19 else None


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
    pid and start time. Any doubt (another host, unreadable /proc) answers False."""
    o = parse_owner(owner)
    if o is None or o.host != host_id() or o.start == "?":
        return False
    if o.pid == os.getpid():
        return False  # this very process: alive (another execution in it holds the lease)
    return process_start(o.pid) != o.start
