"""horo.ray.RayExecutor on a real Ray: a local cluster (``ray.init(num_cpus=4)``, one per module), real actors,
and horo worlds over MPI formed by the workers themselves (core.transport.adopt).

The two-host cluster is in tests/multihost/test_multihost_ray.py; HoroTrainer in tests/test_ray_train.py;
Horovod's own Ray cases, rewritten on horo, in tests/test_ray_horovod.py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

import ray_helpers as h  # noqa: E402
from security_helpers import PsScan  # noqa: E402

from horo.ray import RayExecutor, WorkerDiedError  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    h.start_ray()
    yield
    ray.shutdown()


def _executor(n: int, timeout_s: float = 60, env: dict | None = None, **kwargs) -> tuple[RayExecutor, str]:
    mark = h.marked()
    ex = RayExecutor(RayExecutor.create_settings(timeout_s=timeout_s), num_workers=n)
    ex.start(extra_env_vars={**mark, **(env or {})}, **kwargs)
    return ex, mark["HORO_TEST_MARK"]


def _shutdown(ex: RayExecutor, mark: str) -> None:
    pids, group = [m.pid for m in ex.members], ex.placement_group
    ex.shutdown()
    h.assert_nothing_left(pids, mark, group)


class TestOneWorldOfN:
    """n workers, one world, every call on the same workers: ranks, sizes and local ranks; Horovod's results for
    run, run_remote, execute (an executable class) and execute_single; training with horo's optimizers."""

    @pytest.fixture(scope="class", params=[2, 3, 4])
    def world(self, request):
        scan = PsScan() if request.param == 2 else None  # ps of every process: the world's key on no command line
        ex, mark = _executor(request.param, env={"KERAS_BACKEND": "torch"}, executable_cls=h.Executable,
                             executable_args=[3])
        if scan is not None:
            scan.check(expect=("HORO_JOIN_SECRET",))
        yield ex
        _shutdown(ex, mark)

    def test_ranks_sizes_and_local_ranks(self, world):
        n = world.num_workers
        rows = world.run(h.topology)
        assert [r["rank"] for r in rows] == list(range(n))
        for r in rows:
            assert (r["size"], r["local_size"], r["cross_rank"], r["cross_size"]) == (n, n, 0, 1), r
            assert r["local_rank"] == r["rank"], r
        assert [r["pid"] for r in rows] == [m.pid for m in world.members]  # the actors themselves, in rank order

    def test_run_run_remote_execute_and_execute_single(self, world):
        n = world.num_workers
        assert world.execute(lambda w: w.rank_epoch()) == [3 * r for r in range(n)]
        assert world.execute_single(lambda w: w.rank_epoch()) == 0
        assert world.run(h.affine, args=[2], kwargs={"k": 5}) == [2 * r + 5 for r in range(n)]
        refs = world.run_remote(h.allreduced, args=[1.5])
        assert ray.get(refs) == [1.5 * n * (n + 1) / 2] * n
        if n == 2:
            assert world.run(h.reinit) == [(0, 2), (1, 2)]  # init() after shutdown(): the same world
        assert [r["pid"] for r in world.run(h.topology)] == [m.pid for m in world.members]

    def test_torch_optimizer_equals_averaged_gradients_in_one_process(self, world):
        weights = world.run(h.torch_train)
        assert all(w == weights[0] for w in weights), "workers ended with different weights"
        np.testing.assert_allclose(weights[0], h.torch_reference(world.num_workers), rtol=1e-5, atol=1e-6)

    def test_a_keras_fit_ends_with_identical_weights(self, world):
        if world.num_workers != 2:
            pytest.skip("the Keras fit runs at 2 workers")
        pytest.importorskip("keras")
        weights = world.run(h.keras_fit)
        assert len(weights[0]) == 4 * 8 + 8 + 8 + 1 and weights[0] == weights[1]
        assert world.run(lambda: sys.modules["keras"].backend.backend()) == ["torch", "torch"]


def test_a_raising_worker_surfaces_in_the_driver_within_the_timeout():
    timeout_s = 30
    ex, mark = _executor(3, timeout_s=timeout_s)
    pids, group = [m.pid for m in ex.members], ex.placement_group
    try:
        start = time.monotonic()
        with pytest.raises(ValueError, match="scheduled failure on rank 1"):
            ex.run(h.raise_on, args=[1])
        assert time.monotonic() - start < timeout_s
        stopped = r"workers were stopped after worker rank 1 raised ValueError in run\(\)"
        with pytest.raises(RuntimeError, match=stopped):
            ex.run(h.topology)
        h.assert_nothing_left(pids, mark)  # the others were waiting in a collective: they are stopped
    finally:
        ex.shutdown()
    h.assert_nothing_left(pids, mark, group)


def test_a_killed_worker_ends_the_call_with_an_error_naming_it():
    ex, mark = _executor(3)
    pid = ex.members[2].pid
    try:
        with pytest.raises(WorkerDiedError, match=rf"worker rank 2 of 3 \(pid {pid} on .*\) died during run\(\)"):
            ex.run(h.sigkill_on, args=[2])
    finally:
        _shutdown(ex, mark)


def test_run_remote_references_resolve_when_a_worker_raises():
    ex, mark = _executor(2)
    try:
        refs = ex.run_remote(h.raise_on, args=[0])
        ready, _ = ray.wait(refs, num_returns=2, timeout=60)  # never a wait on the worker stuck in a collective
        assert len(ready) == 2
        with pytest.raises(ValueError, match="scheduled failure on rank 0"):
            ray.get(refs[0])
    finally:
        _shutdown(ex, mark)


@pytest.mark.parametrize("shape", [{"num_workers": 5}, {"num_hosts": 2, "num_workers_per_host": 1}],
                         ids=["5-workers", "2-hosts"])
def test_infeasible_placement_raises_a_timeout_error_naming_the_resources(shape):
    ex = RayExecutor(RayExecutor.create_settings(placement_group_timeout_s=2), **shape)
    with pytest.raises(TimeoutError, match=r"could not hold \d workers within 2 s.*asked for \d x \{'CPU': 1.0\} "
                                           r"\((PACK|STRICT_SPREAD)\); the cluster has \{'CPU': 4.0\} free"):
        ex.start()
    ex.shutdown()
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values())


def test_bad_arguments_raise_before_anything_starts():
    settings = RayExecutor.create_settings()
    for kwargs, match in [({}, "Received: num_workers=None, num_hosts=None"),
                          ({"num_workers": 2, "num_hosts": 1}, "Received: num_workers=2, num_hosts=1"),
                          ({"num_workers": 0}, "Received: num_workers=0"),
                          ({"num_workers": 2, "cpus_per_worker": -1}, "Received: cpus_per_worker=-1")]:
        with pytest.raises(ValueError, match=match):
            RayExecutor(settings, **kwargs)
    with pytest.raises(TypeError, match="Received: settings=3"):
        RayExecutor(3, num_workers=2)
    with pytest.raises(ValueError, match="Received: nics={'eth0'}"):
        RayExecutor.create_settings(nics={"eth0"})
    with pytest.raises(RuntimeError, match=r"run\(\) needs running workers. HINT: call start\(\) first"):
        RayExecutor(settings, num_workers=2).run(h.topology)


def test_ranks_go_host_by_host_and_gpus_are_shared_on_a_host():
    from horo.ray.world import Member, join_envs, rank_order

    members = [Member("b", "10.0.0.2", "hb", 1, ("3",)), Member("a", "10.0.0.1", "ha", 2, ("1",)),
               Member("b", "10.0.0.2", "hb", 3, ("2",)), Member("a", "10.0.0.1", "ha", 4, ("0",))]
    order = rank_order(members)
    assert order == [2, 0, 3, 1]  # host b first (it came first), each host's workers by their GPU
    envs = join_envs([members[i] for i in order], port=4242, timeout_s=30, launcher="horo.ray", share_gpus=True)
    assert [(e["HORO_JOIN_RANK"], e["HORO_JOIN_LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in envs] == [
        ("0", "0", "2,3"), ("1", "1", "2,3"), ("2", "0", "0,1"), ("3", "1", "0,1")]
    assert {(e["HORO_JOIN_SIZE"], e["HORO_JOIN_ADDR"], e["HORO_JOIN_PORT"], e["HORO_JOIN_SECRET"],
             e["HORO_JOIN_TIMEOUT"]) for e in envs} == {("4", "10.0.0.2", "4242", envs[0]["HORO_JOIN_SECRET"], "30")}
    assert len(envs[0]["HORO_JOIN_SECRET"]) == 64
    halves = [Member("a", "10.0.0.1", "ha", p, ("0",)) for p in (1, 2)]  # gpus_per_worker=0.5: one GPU, named once
    assert [e["CUDA_VISIBLE_DEVICES"] for e in join_envs(halves, 1, 30, "horo.ray", share_gpus=True)] == ["0", "0"]


def test_import_without_ray_names_the_extra():
    code = "import sys; sys.modules['ray'] = None\ntry:\n import horo.ray\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "horo.ray needs Ray, which is not installed" in out and "pip install 'horo-mpi[ray]'" in out, out
