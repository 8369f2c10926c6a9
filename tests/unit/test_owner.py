"""Owner identities: unique per execution, naming this process, and a forked child its own;
provably dead exactly when the process can never run again (killed, a zombie, gone)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import platform
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import polyloop
from polyloop.journal._owner import new_owner, owner_is_dead, parse_owner, process_start


def _child_owner(queue: multiprocessing.Queue[str]) -> None:
    queue.put(new_owner())


def test_an_owner_names_this_host_process_and_its_start_and_is_fresh_each_time() -> None:
    a, b = new_owner(), new_owner()
    assert a != b
    pa, pb = parse_owner(a), parse_owner(b)
    assert pa is not None and pb is not None
    assert pa.pid == os.getpid() and pa.start == process_start(os.getpid())
    assert (pa.host, pa.pid, pa.start) == (pb.host, pb.pid, pb.start)
    assert not owner_is_dead(a)


def test_a_forked_child_gets_an_owner_with_its_own_pid_and_start() -> None:
    new_owner()  # fill this process's cache before the fork
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[str] = ctx.Queue()
    child = ctx.Process(target=_child_owner, args=(queue,))
    child.start()
    owner = queue.get(timeout=30)
    child.join(30)
    parsed = parse_owner(owner)
    assert parsed is not None
    assert parsed.pid == child.pid != os.getpid()
    assert parsed.start != "?"
    assert owner_is_dead(owner)  # the child has exited: provably dead on this host


# -- a killed, a stopped and a half-exited child, as /proc shows them ---------------------------

_SRC = str(Path(polyloop.__file__).resolve().parents[1])

# Prints its owner identity, then waits for its stdin to close. The large (untouched) buffer
# makes the kernel's teardown after a SIGKILL long enough to be seen, as a real run's is.
_CHILD = """
import sys
from polyloop.journal._owner import new_owner
ballast = bytearray(256 << 20)
print(new_owner(), flush=True)
sys.stdin.read()
"""

# The same, but its main thread then exits alone (the exit system call, not exit_group), while
# another thread goes on running: the leader shows as a zombie, the process is alive.
_HALF_EXITED_CHILD = """
import ctypes, platform, sys, threading
from polyloop.journal._owner import new_owner
SYS_EXIT = {"x86_64": 60, "aarch64": 93}[platform.machine()]
print(new_owner(), flush=True)
threading.Thread(target=sys.stdin.read).start()
ctypes.CDLL(None).syscall(SYS_EXIT, 0)
"""


@contextlib.contextmanager
def child(code: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process and its owner identity; killed and reaped at the end, not before."""
    env = {**os.environ, "PYTHONPATH": _SRC}
    pipe = subprocess.PIPE
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=pipe, stdout=pipe, stderr=pipe, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        owner = proc.stdout.readline().strip() if ready else ""
        assert parse_owner(owner) is not None, owner
        yield proc, owner
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def state(pid: int) -> str:
    """The state letter /proc shows for a process (R, S, T, Z, ...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rpartition(")")[2].split()[0]


def wait_for_state(pid: int, letters: str) -> None:
    """Until the process shows one of ``letters`` (bounded: a signal acts in microseconds)."""
    deadline = time.monotonic() + 30
    while state(pid) not in letters:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {letters}"
        time.sleep(0.001)


def wait_for_exit(pid: int) -> None:
    """Until the process has exited, without reaping it (it stays a zombie)."""
    fd = os.pidfd_open(pid)
    try:
        assert select.select([fd], [], [], 30)[0], f"pid {pid} did not exit"
    finally:
        os.close(fd)


def test_a_killed_child_is_dead_from_the_moment_kill_returns_until_it_is_reaped() -> None:
    with child(_CHILD) as (proc, owner):
        assert not owner_is_dead(owner)
        os.kill(proc.pid, signal.SIGKILL)
        assert owner_is_dead(owner)  # being torn down: no instruction of it runs again
        wait_for_exit(proc.pid)
        assert state(proc.pid) == "Z" and proc.returncode is None  # exited, not reaped
        assert owner_is_dead(owner)
        assert proc.wait(30) == -signal.SIGKILL
        assert owner_is_dead(owner)  # gone


def test_a_stopped_child_is_alive_until_it_is_killed() -> None:
    with child(_CHILD) as (proc, owner):
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for_state(proc.pid, "T")
        assert not owner_is_dead(owner)
        os.kill(proc.pid, signal.SIGCONT)
        wait_for_state(proc.pid, "RS")
        assert not owner_is_dead(owner)
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for_state(proc.pid, "T")
        os.kill(proc.pid, signal.SIGKILL)
        assert owner_is_dead(owner)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="exit syscall no.")
def test_a_process_whose_main_thread_exited_is_alive_while_another_thread_runs() -> None:
    with child(_HALF_EXITED_CHILD) as (proc, owner):
        wait_for_state(proc.pid, "Z")  # the leader; the other thread still reads stdin
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        assert not owner_is_dead(owner)
        os.kill(proc.pid, signal.SIGKILL)
        assert owner_is_dead(owner)
