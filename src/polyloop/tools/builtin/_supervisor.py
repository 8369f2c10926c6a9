"""The supervisor a shell command runs under: it ends with nothing the command started running.

:func:`polyloop.tools.builtin._shell.run_shell` runs this file as a script, one process per
command (``python -I -S _supervisor.py PARENT_PID TIMEOUT_S PROGRAM COMMAND``), so it imports
the standard library only. Its stdin is a pipe from PolyLoop (nothing is written to it: end of
file means "stop"), its stdout the command's output pipe, its stderr the report pipe.

It starts ``PROGRAM -c COMMAND`` in a new process group (stdin ``/dev/null``, stderr into
stdout) and waits until the command exits, the timeout passes, or it is told to stop: end of
file on stdin (PolyLoop cancelled the call, or died) or SIGTERM, SIGINT or SIGHUP. Then it
kills what is left, with SIGKILL:

- On Linux it is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant whose parent
  dies is re-parented to it instead of to init, also one that made itself a new session with
  ``setsid``. So it kills all its children, waits for them (their children then become its
  own), and repeats until it has none left: then no descendant is left either. Only its own
  unreaped children are signalled, so a pid it signals cannot belong to an unrelated process.
  It also sets ``PR_SET_PDEATHSIG`` to SIGTERM, so when PolyLoop dies (even of SIGKILL) it
  kills the tree the same way before it exits.
- Elsewhere (or when ``prctl`` is refused) it kills the command's process group: a process
  that left the group survives, and nothing notices PolyLoop dying but the end of file on stdin.

A process it may not signal (one that changed user, e.g. through ``sudo``) is left running and
counted. The last line it writes on stderr is the report, one of::

    polyloop-supervisor exited CODE KILLED UNKILLABLE TREE
    polyloop-supervisor timeout - KILLED UNKILLABLE TREE
    polyloop-supervisor stopped - KILLED UNKILLABLE TREE
    polyloop-supervisor error MESSAGE

CODE is the command's exit code, or minus the signal that ended it (``-`` when the supervisor
killed it); ``timeout`` and ``stopped`` mean the supervisor killed the command itself (a command
that exited on its own first is reported as ``exited``). KILLED counts the processes that died
of the SIGKILL the supervisor sent (the command itself included); UNKILLABLE those it was not
permitted to signal; TREE is 1 when every descendant was found (Linux) and 0 when only the
command's process group was killed (then KILLED counts the command alone).

``python -I -S _supervisor.py --exec PARENT_PID PROGRAM [ARG...]`` is its other use, for a
process that must not outlive PolyLoop but needs its stdin (an MCP stdio server,
:mod:`polyloop.tools.mcp._stdio`): on Linux it sets ``PR_SET_PDEATHSIG`` to SIGKILL, checks
that PolyLoop is still its parent, and then *becomes* PROGRAM (``execvp``: the same pid, the
same pipes, the default dispositions of SIGPIPE and SIGXFSZ), which keeps the setting: when
PolyLoop dies, even of SIGKILL, PROGRAM gets SIGKILL. A program that is set-user-ID,
set-group-ID or has file capabilities loses it at ``exec``, and processes PROGRAM starts do not
inherit it. If ``prctl`` is refused it runs PROGRAM all the same (with a line on stderr); if
PROGRAM cannot be run it exits with status 127 and ``polyloop-supervisor error MESSAGE``.
"""

from __future__ import annotations

import os
import select
import sys
import time

TYPE_CHECKING = False  # importing typing would cost more start-up time than everything else
if TYPE_CHECKING:
    from typing import Any

# ``signal`` imports ``enum``, which alone would double the supervisor's start-up (a cost paid
# per command); ``_signal`` has the same functions, with plain int constants.
signal: Any = __import__("_signal")

_PREFIX = "polyloop-supervisor"
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _State:
    stop = False


def _on_stop(signum: int, frame: object) -> None:
    _State.stop = True


def _on_child(signum: int, frame: object) -> None:
    """Only here so that SIGCHLD writes to the wakeup pipe (its default is to be discarded)."""


def _prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` (Linux); False elsewhere or when it is refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    except (ImportError, OSError, AttributeError):  # no ctypes, no libc, or no prctl in it
        return False


def _become_subreaper() -> bool:
    """Whether this process is now a child subreaper that gets SIGTERM when its parent dies."""
    if not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        return False
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    return True


def _children(me: int) -> list[int]:
    """This process's children (zombies included), from /proc."""
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as f:
            return [int(pid) for pid in f.read().split()]
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: scan every process
        pass
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended meanwhile
            continue
        if int(stat.rsplit(b")", 1)[1].split()[1]) == me:
            found.append(int(name))
    return found


def _code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _died_of_kill(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


class _Supervisor:
    def __init__(self, command_pid: int, *, tree: bool) -> None:
        self.pid = command_pid
        self.status: int | None = None  # the command's wait status once it is reaped
        self.killed_command = False  # it died of the SIGKILL sent here
        self.tree = tree
        self.killed = 0
        self.unkillable: set[int] = set()

    def reap_exited(self) -> None:
        """Reap every child that has exited (the command, or an orphan that ended)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = status

    def kill_all(self) -> None:
        """Kill what is left of the command and everything it started (module docstring)."""
        if not self.tree:
            try:  # noqa: SIM105 (importing contextlib would cost start-up time)
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # no group, or a zombie leader (macOS)
                pass
            if self.status is None:
                self._wait(self.pid)
            return
        me = os.getpid()
        while True:
            signalled = []
            for pid in _children(me):
                if pid in self.unkillable:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                except PermissionError:
                    self.unkillable.add(pid)
                    continue
                signalled.append(pid)
            if not signalled:
                break
            for pid in signalled:  # once it is reaped, its children are this process's
                self._wait(pid)
        self.reap_exited()

    def _wait(self, pid: int) -> None:
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # already reaped
            return
        if _died_of_kill(status):
            self.killed += 1
            self.killed_command = self.killed_command or pid == self.pid
        if pid == self.pid:
            self.status = status


def _report(*fields: object) -> None:
    line = " ".join([_PREFIX, *map(str, fields)]) + "\n"
    try:  # noqa: SIM105 (importing contextlib would cost start-up time)
        os.write(2, line.encode("utf-8", "replace"))
    except OSError:  # PolyLoop is gone: nobody to tell
        pass


def exec_main(argv: list[str]) -> int:
    """``--exec PARENT_PID PROGRAM [ARG...]`` (module docstring); returns only on failure."""
    parent, command = int(argv[0]), argv[1:]
    if not _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL)):
        _report("warning", "no parent-death signal (prctl refused); running the program anyway")
    if os.getppid() != parent:  # PolyLoop died before the death signal was armed
        return 1
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; exec would keep that
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        _report("error", f"cannot run {command[0]!r}: {exc.strerror or exc}")
    return 127


def main(argv: list[str]) -> int:
    if argv[:1] == ["--exec"]:
        return exec_main(argv[1:])
    parent, timeout_s, program, command = int(argv[0]), float(argv[1]), argv[2], argv[3]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, _on_child)
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _on_stop)
    tree = _become_subreaper()
    if os.getppid() != parent:  # PolyLoop died before the death signal was armed
        return 1
    try:
        pid = os.posix_spawn(
            program,
            [program, "-c", command],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setpgroup=0,
            # Python ignores these; the command must get the defaults (``yes | head`` ends).
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    except OSError as exc:
        _report("error", exc.strerror or exc)
        return 1
    supervisor = _Supervisor(pid, tree=tree)
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while supervisor.status is None and not _State.stop:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([wake_r, 0], [], [], remaining)
        if 0 in ready and not os.read(0, 4096):
            _State.stop = True  # PolyLoop closed the pipe or died
        if wake_r in ready:
            os.read(wake_r, 4096)
        supervisor.reap_exited()
    for signum in _STOP_SIGNALS:  # the tree is being killed anyway
        signal.signal(signum, signal.SIG_IGN)
    supervisor.kill_all()
    if supervisor.status is None or supervisor.killed_command:  # (None: it was unkillable)
        outcome, code = ("timeout" if timed_out else "stopped"), "-"
    else:
        outcome, code = "exited", str(_code(supervisor.status))
    _report(outcome, code, supervisor.killed, len(supervisor.unkillable), int(supervisor.tree))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
