"""Elastic Lightning fits (``Trainer(strategy="horo")``, ``LightningState``, ``ElasticCallback``) through hororun,
and the elastic training sampler on its own.

The app (elastic_apps/lightning_train.py) trains 48 numbered samples in batches of 4 and logs every trained
batch's sample ids and world; a worker SIGKILLs itself at a chosen batch's start, and the discovery script gains
a host at a chosen batch's end. Checked: the world size of every epoch, each sample trained exactly once per
epoch across resets (the rest of an interrupted epoch goes over the new world), the global step, the learning
rate rescaled by the reset callback, and equal final weights on every rank.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_elastic import Job, _show, needs_ulfm, run_elastic

torch = pytest.importorskip("torch")
pytest.importorskip("lightning_utilities")

N = 48  # samples, in batches of 4


@pytest.mark.parametrize("n, size, shuffle, drop_last", [(48, 1, True, False), (50, 3, True, False),
                                                         (50, 3, False, True), (7, 2, True, False)])
def test_elastic_sampler_serves_what_torch_serves_until_a_reset(n: int, size: int, shuffle: bool,
                                                                  drop_last: bool) -> None:
    from torch.utils.data import DistributedSampler

    from horo.strategies.elastic_data import ElasticDistributedSampler

    for rank in range(size):
        theirs = DistributedSampler(range(n), num_replicas=size, rank=rank, shuffle=shuffle, seed=3,
                                    drop_last=drop_last)
        ours = ElasticDistributedSampler(range(n), size, rank, shuffle, 3, drop_last)
        for epoch in (0, 1, 2):
            theirs.set_epoch(epoch)
            ours.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs), (rank, epoch)


def test_elastic_sampler_serves_the_rest_of_an_epoch_over_a_new_world() -> None:
    """3 ranks train 2 batches of 4; over 2 ranks the other 26 of 50 samples are served, each once (the shorter
    share padded by one repeat); the length stays the whole epoch's share; the next epoch is whole again."""
    from horo.strategies.elastic_data import ElasticDistributedSampler, batches_in

    before = ElasticDistributedSampler(range(50), 3, 0, True, 0, False, epoch=4)
    history = before.history_after(2, 4)
    assert history == [[3, 2, 4]]
    done = set().union(*(share[:8] for share in before.shares()))
    after = [ElasticDistributedSampler(range(50), 2, r, True, 0, False, epoch=4, history=history) for r in range(2)]
    assert after[0].done == done and len(done) == 24
    served = [list(s) for s in after]
    assert sorted(set(served[0] + served[1])) == sorted(set(range(50)) - done)
    assert len(served[0]) == len(served[1]) == 13 and batches_in(13, 4, False) == 4 and batches_in(13, 4, True) == 3
    assert len(after[0]) == 25  # the epoch's whole share: Lightning counts the epoch's batches from it
    # a second pass: 1 batch more on 2 ranks, then 3 ranks serve the 18 samples left (no repeat of the 32 done)
    again = ElasticDistributedSampler(range(50), 3, 0, True, 0, False, epoch=4, history=after[0].history_after(1, 4))
    assert again.done == done | set(served[0][:4] + served[1][:4])
    assert sorted(set().union(*again.shares())) == sorted(set(range(50)) - again.done)
    after[0].set_epoch(4)  # Lightning sets the resumed epoch again: nothing changes
    assert list(after[0]) == served[0]
    after[0].set_epoch(5)
    assert len(list(after[0])) == 25 and not after[0].done


def test_resume_mid_epoch_keeps_the_counters_shape() -> None:
    """A commit at a batch end (ready = k, completed = k - 1): the epoch of 12 batches ends after ``rest`` more."""
    from horo.strategies.elastic_data import resume_mid_epoch

    def progress(k: int, lag: int) -> SimpleNamespace:
        return SimpleNamespace(current=SimpleNamespace(ready=k, started=k, processed=k, completed=k - lag))

    for rest, ready in ((3, 9), (12, 0), (0, 11)):
        p = progress(5, 1)
        resume_mid_epoch(p, 12, rest)
        assert (p.current.ready, p.current.started, p.current.processed, p.current.completed) == \
            (ready, ready, ready, ready - 1), rest
    p = progress(5, 0)
    resume_mid_epoch(p, 12, 4)
    assert p.current.completed == p.current.ready == 8


def test_elastic_lightning_refuses_bad_input_before_any_communication() -> None:
    L = pytest.importorskip("lightning")
    from horo.lightning import elastic
    from horo.strategies.elastic_state import committed_checkpoint

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    with pytest.raises(TypeError, match="Received: model of type Linear.*HINT"):
        elastic.LightningState(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match="Received: trainer=.*HINT"):
        elastic.LightningState(Net(), trainer=1)
    state = elastic.LightningState(Net(), epoch=0)
    with pytest.raises(RuntimeError, match="no fit is running. HINT"):
        state.commit()
    with pytest.raises(TypeError, match="Received: state of type dict"):
        elastic.ElasticCallback({})
    with pytest.raises(ValueError, match="commit_every_n_batches=0"):
        elastic.ElasticCallback(state, commit_every_n_batches=0)
    with pytest.raises(ValueError, match="does not hold.*HINT"):
        committed_checkpoint("horo-elastic://nothing")
    assert state.ckpt_path is None and committed_checkpoint("last.ckpt") is None
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[elastic.ElasticCallback(state)])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    with pytest.raises(ValueError, match="needs Trainer\\(strategy='horo'\\).*HINT"):
        trainer.fit(state.model, loader)


def _epochs(tmp_path: Path) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Every epoch's trained sample ids (all workers', the dead ones' included) and world sizes in order."""
    ids: dict[int, list[int]] = collections.defaultdict(list)
    steps: list[tuple[int, int, int]] = []  # (global step, epoch, size), from every worker's log
    for path in (tmp_path / "out").glob("log.*.jsonl"):
        for line in path.read_text().splitlines():
            epoch, _batch, size, _rank, batch_ids, lr, step = json.loads(line)
            ids[epoch] += batch_ids
            steps.append((step, epoch, size))
            assert lr == pytest.approx(0.01 * size), ("lr not rescaled to the world", epoch, size, lr)
    sizes: dict[int, list[int]] = collections.defaultdict(list)
    for _step, epoch, size in sorted(set(steps)):
        if not sizes[epoch] or sizes[epoch][-1] != size:
            sizes[epoch].append(size)
    return ids, sizes


def _check(job: Job, tmp_path: Path, sizes: dict[int, list[int]], steps: int, resets: list[int]) -> None:
    assert job.rc == 0, _show(job)
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1], _show(job)
    ids, seen = _epochs(tmp_path)
    assert seen == sizes, (seen, _show(job))
    for epoch, trained in ids.items():
        counts = collections.Counter(trained)
        assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}, (epoch, counts)
    for r in ranks.values():
        assert r["size"] == 2 and r["global_step"] == steps and r["lr"] == pytest.approx(0.02), r
        assert [size for size, _rank in r["resets"]] == resets, r
    assert ranks[0]["weights"] == ranks[1]["weights"], "weights differ between the ranks"
    assert "stalled" not in job.out and "has been blocked" not in job.out, _show(job)


@pytest.mark.mpi
@needs_ulfm
@pytest.mark.timeout(400)
@pytest.mark.parametrize("package", ["lightning", pytest.param("pytorch_lightning", marks=pytest.mark.slow)])
def test_lightning_fit_survives_a_kill_three_to_two(tmp_path: Path, package: str) -> None:
    """Rank 2 dies at the start of epoch 1's third batch: the two others roll back to the commit after the second,
    and finish epoch 1 on the 24 samples left (3 batches each), then epoch 2 on 2 workers."""
    pytest.importorskip(package)
    job = run_elastic(tmp_path, "lightning_train.py", ["-np", "3", "--min-np", "2", "--max-np", "3"],
                      {"ELASTIC_KILLS": "1:2:2:0", "EPOCHS": "3", "PACKAGE": package}, timeout=360)
    # 4 steps at 3 workers; 2 at 3 and 3 at 2; 6 at 2
    _check(job, tmp_path, {0: [3], 1: [3, 2], 2: [2]}, steps=4 + 5 + 6, resets=[2])
    assert "failed during the job" in job.out, _show(job)


# A worker spawned into the job imports torch and Lightning while the others wait: 1.5-3 min on this machine.
@pytest.mark.mpi
@needs_ulfm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_lightning_fit_grows_then_survives_a_kill(tmp_path: Path) -> None:
    """From 2 workers, discovery adds a third at epoch 1's third batch (the world grows at that batch's commit,
    and the 24 samples left of epoch 1 go over 3 workers); in epoch 2 the new worker dies at its second batch,
    and the two others finish epoch 2 on the 36 samples left."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    disc = tmp_path / "discover.sh"
    disc.write_text(f"#!/bin/sh\ncat {hosts}\n")
    disc.chmod(0o755)
    job = run_elastic(tmp_path, "lightning_train.py",
                      ["-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", str(disc)],
                      {"ELASTIC_GROW": f"1:2:{hosts}:localhost:2\\n127.0.0.1:1", "ELASTIC_KILLS": "2:1:2:1",
                       "EPOCHS": "3"}, timeout=560)
    # 6 steps at 2; 3 at 2 and 2 at 3; 1 at 3 and 5 at 2
    _check(job, tmp_path, {0: [2], 1: [2, 3], 2: [3, 2]}, steps=6 + 5 + 6, resets=[3, 2])
    assert "adding 1 worker(s) on ['127.0.0.1']" in job.out, _show(job)


@pytest.mark.mpi
@needs_ulfm
@pytest.mark.timeout(300)
# pytorch_lightning: in make test-slow-ci
@pytest.mark.parametrize("package", ["lightning", pytest.param("pytorch_lightning", marks=pytest.mark.slow)])
def test_lightning_commit_resumes_in_a_fresh_process_as_after_a_lost_host(tmp_path: Path, package: str) -> None:
    """A fit fails in the middle of epoch 1; a new model and state take its ``committed()`` through pickle (what
    hororun keeps for a restart after a lost host) and resume: the weights equal those of a fit never interrupted."""
    pytest.importorskip(package)
    job = run_elastic(tmp_path, "lightning_train.py", ["-np", "1"],
                      {"MODE": "roundtrip", "EPOCHS": "3", "PACKAGE": package}, timeout=240)
    assert job.rc == 0, _show(job)
    (only,) = job.results
    assert only["global_step"] == only["straight_step"] == 3 * N // 4, only
    assert only["resumed"] == only["straight"], "the resumed fit trained otherwise than the uninterrupted one"
    assert "does not resume from the last commit" in only["forgot"] and "HINT" in only["forgot"], only["forgot"]
