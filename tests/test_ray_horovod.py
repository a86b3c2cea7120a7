"""Horovod's own Ray cases (its test/single/test_ray.py: local, init, exec_func, exec_remote_func, executable,
horovod_train, horovod_train_in_pg), written afresh on horo.ray's public API and run on a real local Ray
cluster of 4 CPUs, in Horovod's two layouts: ``num_workers=4``, and ``num_hosts=1, num_workers_per_host=4``.

The cases that only call functions share one started executor per layout (later calls reuse its world, as
Horovod's users do); the executable and placement-group cases start their own.
"""

from __future__ import annotations

import socket

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

import ray_helpers as h  # noqa: E402
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: E402

from horo.ray import RayExecutor  # noqa: E402

pytestmark = pytest.mark.timeout(300)
# The num_hosts layout differs only in its placement group (one bundle of 4 workers, STRICT_SPREAD): slow.
LAYOUTS = [{"num_workers": 4},
           pytest.param({"num_hosts": 1, "num_workers_per_host": 4}, marks=pytest.mark.slow)]
IDS = ["num_workers", "num_hosts"]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    h.start_ray()
    yield
    ray.shutdown()


def _start(layout: dict, **kwargs) -> tuple[RayExecutor, str]:
    mark = h.marked()
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=60), **layout)
    ex.start(extra_env_vars=mark, **kwargs)
    return ex, mark["HORO_TEST_MARK"]


def _stop(ex: RayExecutor, mark: str) -> None:
    pids, group = [m.pid for m in ex.members], ex.placement_group
    ex.shutdown()
    h.assert_nothing_left(pids, mark, group)


class TestOneStartedExecutor:
    @pytest.fixture(scope="class", params=LAYOUTS, ids=IDS)
    def started(self, request):
        ex, mark = _start(request.param)
        yield ex
        _stop(ex, mark)

    def test_local(self, started):
        assert len(set(started.execute(lambda _: socket.gethostname()))) == 1

    def test_init(self, started):
        assert sorted(started.execute(h.hvd_rank)) == [0, 1, 2, 3]

    def test_exec_func(self, started):
        assert set(started.run(h.hvd_rank_times, args=[0])) == {0}

    def test_exec_remote_func(self, started):
        assert set(ray.get(started.run_remote(h.hvd_rank_times, args=[0]))) == {0}

    def test_horovod_train(self, started):
        assert set(started.execute(h.hvd_train)) == {0, 1, 2, 3}


@pytest.mark.slow  # a start of its own; tests/test_ray.py starts executable classes at 2, 3 and 4 workers
@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_executable(layout):
    ex, mark = _start(layout, executable_cls=h.Executable, executable_args=[2])
    try:
        assert set(ex.execute(lambda w: w.rank_epoch())) == {0, 2, 4, 6}
    finally:
        _stop(ex, mark)


def test_horovod_train_in_pg():
    group = ray.util.placement_group([{"CPU": 1}] * 4, strategy="PACK")
    ray.get(group.ready(), timeout=60)
    mark = h.marked()
    try:
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_capture_child_tasks=True)
        actor = ray.remote(h.InGroup).options(num_cpus=0, scheduling_strategy=strategy).remote()
        local_ranks, same_group, pids = ray.get(actor.run.remote(mark), timeout=240)
        assert local_ranks == {0, 1, 2, 3}
        assert same_group, "the executor made a placement group of its own inside the current one"
        ray.kill(actor)
        h.assert_nothing_left(pids, mark["HORO_TEST_MARK"])
    finally:
        ray.util.remove_placement_group(group)
