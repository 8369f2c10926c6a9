"""Owner identities: unique per execution, naming this process, and a forked child its own."""

from __future__ import annotations

import multiprocessing
import os

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
