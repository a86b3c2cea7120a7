"""horo.ray.HoroTrainer on a real Ray (a local cluster, ``ray.init(num_cpus=4)``): Ray Train's worker group
forms a horo world; ``ray.train.report``, checkpoints, Ray Data shards and ``FailureConfig`` work as with
Ray Train's own trainers."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("ray.train")
pytest.importorskip("torch")

import ray_helpers as h  # noqa: E402

from horo.ray import HoroConfig, HoroTrainer  # noqa: E402

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module", autouse=True)
def cluster():
    h.start_ray()
    yield
    ray.shutdown()


def _trainer(tmp_path, loop, config, mark, failures=0, timeout_s=60):
    run = ray.train.RunConfig(storage_path=str(tmp_path), name="run", worker_runtime_env={"env_vars": mark},
                              failure_config=ray.train.FailureConfig(max_failures=failures))
    return HoroTrainer(loop, train_loop_config={"out": str(tmp_path), **config},
                       horo_config=HoroConfig(timeout_s=timeout_s),
                       scaling_config=ray.train.ScalingConfig(num_workers=2), run_config=run,
                       datasets={"train": ray.data.from_items([{"x": float(i)} for i in range(16)])})


def test_reports_checkpoints_shards_and_a_restart_after_a_killed_worker(tmp_path):
    """Rank 1 is SIGKILLed in epoch 1 of 3: Ray Train starts a new worker group, which forms a new world and
    resumes from the checkpoint of epoch 0; the run ends as if nothing had happened."""
    mark = h.marked()
    result = _trainer(tmp_path, h.trainer_loop, {"epochs": 3, "kill_at": 1}, mark, failures=1).fit()
    killed = int((tmp_path / "killed").read_text())
    m = result.metrics
    assert (m["epoch"], m["start"]) == (2, 1), m  # resumed after epoch 0's checkpoint
    assert killed not in m["pids"] and len(set(m["pids"])) == 2, (killed, m["pids"])  # new workers
    assert m["weights"][0] == m["weights"][1], m["weights"]
    shards = m["seen"]
    assert sorted(shards[0] + shards[1]) == list(range(16)) and len(shards[0]) == 8, shards  # disjoint halves
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        import torch

        assert torch.load(f"{d}/state.pt")["epoch"] == 2
    h.assert_nothing_left([], mark["HORO_TEST_MARK"])  # workers (both groups), launchers, placeholders


@pytest.mark.slow  # a Ray Train run of its own; horo's side of a failing group is in the restart case above
def test_a_raising_worker_fails_the_fit_with_its_error(tmp_path):
    mark = h.marked()
    start = time.monotonic()
    with pytest.raises(ray.train.TrainingFailedError) as info:
        _trainer(tmp_path, h.trainer_raises, {}, mark, timeout_s=60).fit()
    assert "ValueError: scheduled failure on rank 1" in str(info.value)
    assert time.monotonic() - start < 120
    h.assert_nothing_left([], mark["HORO_TEST_MARK"])
