"""The Ray backend, for real (no mocks): one local Ray cluster for the module (a head node,
plus a worker node that the node test kills). Kept few: each start costs seconds and memory.

Skipped, saying so, when Ray is not installed (``pip install -e '.[ray]'``; ``.[dev]`` has it).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from polyloop.batch import goal_run_id, run_batch
from polyloop.journal import SQLiteJournal
from tests.batch import world
from tests.batch.checks import check_batch, sql

ray = pytest.importorskip(
    "ray", reason="Ray is not installed: pip install -e '.[ray]' (or '.[dev]') to run these"
)
cluster_utils = pytest.importorskip("ray.cluster_utils")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    temp = tempfile.mkdtemp(prefix="plray", dir="/tmp")  # short: it holds unix sockets
    saved = {
        k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_USAGE_STATS_ENABLED", "RAY_TMPDIR")
    }
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=temp)
    os.makedirs(os.path.join(temp, "ray"))  # Ray writes its address file there
    c = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 2,
            "include_dashboard": False,
            "object_store_memory": 200 * 1024 * 1024,
            "temp_dir": os.path.join(temp, "ray"),
            # notice a dead node within about a second
            "_system_config": {"health_check_period_ms": 200, "health_check_failure_threshold": 3},
        },
    )
    pythonpath = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address=c.address,
        runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},  # workers import tests.batch
        log_to_driver=False,
    )
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def batch_goals(n: int) -> list[str]:
    return [*(f"task {i}" for i in range(n - 2)), "loop on ray", "talk on ray"]


async def test_a_batch_on_ray_completes(cluster: Any, tmp_path: Path) -> None:
    path, effects = tmp_path / "j.db", tmp_path / "effects"
    goals = batch_goals(12)
    make_loop = functools.partial(world.make_loop, effects=str(effects), latency_s=0.02)
    async with SQLiteJournal(path) as j:
        result = await run_batch(
            j, goals, make_loop, concurrency=6, backend="ray", actors=2, limits=world.LIMITS
        )
        assert result.complete, result.summary()
        assert result.by_stop_reason == {
            "task_completed": 10,
            "step_budget": 1,
            "agent_finished": 1,
        }
        pids = {e["pid"] for e in world.effects_of(effects)}
        assert os.getpid() not in pids and len(pids) == 2, "the runs ran in two Ray actors"
        again = await run_batch(
            j, goals, make_loop, concurrency=6, backend="ray", limits=world.LIMITS
        )
    assert again.by_status == {"already_ended": 12}
    check_batch(path, effects, goals, tmp_path)


async def _kill_mid_step(
    tmp_path: Path, kill: Any, *, actor_options: dict[str, Any] | None = None
) -> None:
    """A batch whose run ``victim`` hangs in its step-1 model call in a Ray worker; ``kill(pid)``
    takes that worker down; the batch must still end every run exactly once."""
    path, effects, calls = tmp_path / "j.db", tmp_path / "effects", tmp_path / "calls"
    pid_file = tmp_path / "victim.pid"
    goals = batch_goals(6)
    victim = goal_run_id(goals[1])
    make_loop = functools.partial(
        world.make_loop,
        effects=str(effects),
        calls=str(calls),
        latency_s=0.02,
        hang=(victim, 1, str(pid_file)),
    )
    async with SQLiteJournal(path) as j:
        task = asyncio.ensure_future(
            run_batch(
                j,
                goals,
                make_loop,
                concurrency=4,
                backend="ray",
                actors=1,
                actor_options=actor_options,
                limits=world.LIMITS,
            )
        )
        deadline = asyncio.get_running_loop().time() + 60
        while not pid_file.exists():
            assert not task.done(), task.result()
            assert asyncio.get_running_loop().time() < deadline, "the victim never started"
            await asyncio.sleep(0.02)
        pid = int(pid_file.read_text())
        kill(pid)
        result = await asyncio.wait_for(task, 90)
    assert result.complete, result.summary()
    victim_calls = [c for c in world.effects_of(calls) if c["run"] == victim]
    assert {c["pid"] for c in victim_calls if c["step"] == 1} - {pid}, "resumed elsewhere"
    check_batch(path, effects, goals, tmp_path)


async def test_a_worker_killed_mid_step_still_ends_every_run_once(
    cluster: Any, tmp_path: Path
) -> None:
    await _kill_mid_step(tmp_path, lambda pid: os.kill(pid, signal.SIGKILL))


async def test_a_node_killed_mid_step_is_recovered_on_another(cluster: Any, tmp_path: Path) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = cluster.add_node(num_cpus=1, object_store_memory=100 * 1024 * 1024)
    try:
        cluster.wait_for_nodes()
        strategy = NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=True)

        def kill(pid: int) -> None:
            assert _runs_under(pid, node), "the victim ran on the doomed node"
            cluster.remove_node(node, allow_graceful=False)

        await _kill_mid_step(tmp_path, kill, actor_options={"scheduling_strategy": strategy})
    finally:
        if node in cluster.worker_nodes:
            cluster.remove_node(node, allow_graceful=False)


def _runs_under(pid: int, node: Any) -> bool:
    """Whether process ``pid`` descends from one of the node's processes (its raylet)."""
    roots = {info.process.pid for infos in node.all_processes.values() for info in infos}
    while pid > 1:
        if pid in roots:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rpartition(")")[2].split()[1])  # the parent's pid
    return False


async def test_a_cancelled_ray_batch_detaches_its_runs_never_cancels_them(
    cluster: Any, tmp_path: Path
) -> None:
    path, effects = tmp_path / "j.db", tmp_path / "effects"
    goals = batch_goals(6)
    make_loop = functools.partial(world.make_loop, effects=str(effects), latency_s=0.1)
    async with SQLiteJournal(path) as j:
        task = asyncio.ensure_future(
            run_batch(
                j, goals, make_loop, concurrency=4, backend="ray", actors=1, limits=world.LIMITS
            )
        )
        deadline = asyncio.get_running_loop().time() + 60
        while not sql(path, "SELECT count(*) FROM steps")[0][0]:
            assert asyncio.get_running_loop().time() < deadline, "no step was ever written"
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        rows = await j.list_runs()
        assert all(r["owner"] is None for r in rows), "every lease released"
        assert not any(r["stop_reason"] == "cancelled" for r in rows), "detached, not cancelled"
        assert any(r["status"] == "running" and r["steps_used"] for r in rows), "paused mid-way"
        result = await run_batch(j, goals, make_loop, limits=world.LIMITS)  # finish locally
    assert result.complete
    check_batch(path, effects, goals, tmp_path)
