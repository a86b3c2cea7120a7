"""Horovod's eight elastic scenarios, through hororun, on horo's API (elastic_apps/scenario_train.py).

Each scenario runs one training script under hororun's elastic flags, with ``localhost`` and ``127.0.0.1``
as two hosts (the driver keeps logical hosts, as Horovod does), and checks the world of every epoch from the
line rank 0 logs at its end: size, the start rank and host of rank 0, and how often the training function
was entered. A discovery script lists hosts by how many epochs were logged, so host changes follow epochs;
the script's rank 0 waits at an epoch's end until hororun offers the hosts it expects, so each change lands
at the next commit. Each job has a hard time limit, and no process of it may be left (``run_elastic``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_elastic import Job, _show, needs_ulfm, run_elastic

pytestmark = pytest.mark.mpi

A, B = "localhost", "127.0.0.1"
# FRAMEWORK=torch: a DistributedOptimizer whose gradients travel in three buckets, the first smaller than the
# rest (as DDP's), so that a world change meets bucket state kept from the old world.
TORCH = {"FRAMEWORK": "torch", "HORO_FIRST_BUCKET_BYTES": "64", "HORO_BUCKET_BYTES": "128"}
FRAMEWORKS = [pytest.param({}, id="numpy"), pytest.param(TORCH, id="torch-buckets")]
# The costlier torch variants of two scenarios run in `make test-slow-ci`, a stage of CI.
FRAMEWORKS_CI = [pytest.param({}, id="numpy"), pytest.param(TORCH, id="torch-buckets", marks=pytest.mark.slow)]


def _discovery(tmp_path: Path, log: Path, schedule: list[tuple[int | None, list[str]]]) -> Path:
    """A discovery script printing ``schedule``'s hosts for the number of lines in ``log`` (the last entry
    for every later count)."""
    lines = ["#!/bin/sh", "n=0", f'[ -f "{log}" ] && n=$(wc -l < "{log}")', 'case "$n" in']
    for epoch, hosts in schedule:
        echo = "; ".join(f"echo {h}" for h in hosts)
        lines.append(f"  {'*' if epoch is None else epoch}) {echo} ;;")
    lines.append("esac")
    path = tmp_path / "discover.sh"
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def scenario(tmp_path: Path, *, np: int = 2, min_np: int = 2, max_np: int | None = 4,
             schedule: list[tuple[int | None, list[str]]] | None = None, hosts: str | None = None,
             exits: dict[tuple[int, int], list[int]] | None = None, exit_mode: str = "exception",
             expect: dict[int, list[str]] | None = None, extra: list[str] | None = None,
             env: dict[str, str] | None = None, timeout: float = 150.0,
             app: str = "scenario_train.py") -> tuple[Job, list[dict]]:
    """Run ``app`` as Horovod's elastic_common ``_run`` does; returns the job and the epoch lines."""
    log = tmp_path / "epochs.jsonl"
    args = ["-np", str(np), "--min-np", str(min_np)]
    if hosts is not None:
        args += ["-H", hosts]
    else:
        assert schedule
        args += ["--host-discovery-script", str(_discovery(tmp_path, log, schedule))]
    if max_np is not None and hosts is None:
        args += ["--max-np", str(max_np)]
    if expect is None and schedule:
        # As Horovod's script waits for the driver's notice: at each epoch whose next epoch has other hosts.
        listed = {e: sorted(h) for e, h in schedule if e is not None}
        final = sorted(schedule[-1][1])
        expect = {e: listed.get(e + 1, final) for e in range(10) if listed.get(e, final) != listed.get(e + 1, final)}
    full_env = {"LOGFILE": str(log), "EXITS": json.dumps({f"{e},{b}": r for (e, b), r in (exits or {}).items()}),
                "EXIT_MODE": exit_mode, "EXPECT": json.dumps(expect or {}), **(env or {})}
    job = run_elastic(tmp_path, app, [*args, *(extra or [])], full_env, timeout=timeout)
    lines = [json.loads(t) for t in log.read_text().splitlines()] if log.exists() else []
    return job, lines


def _world(line: dict) -> tuple[int, int, str, int]:
    return line["size"], line["start_rank"], line["hostname"], line["rendezvous"]


def _finished_equal(job: Job, size: int) -> None:
    """The final world's workers all finished, with equal weights."""
    assert job.rc == 0, _show(job)
    assert sorted(r["rank"] for r in job.results) == list(range(size)), _show(job)
    assert len({json.dumps(r["weights"]) for r in job.results}) == 1, [r["weights"] for r in job.results]


@needs_ulfm
@pytest.mark.timeout(400)
@pytest.mark.parametrize("framework", FRAMEWORKS_CI)
@pytest.mark.parametrize("slots, np_, min_np, max_np",
                         [(2, 2, 2, 4), pytest.param(1, 1, 1, 2, marks=pytest.mark.slow)], ids=["2-slots", "1-slot"])
def test_hosts_added_and_removed(tmp_path: Path, slots: int, np_: int, min_np: int, max_np: int,
                                 framework: dict[str, str]) -> None:
    """Discovery lists localhost, then localhost and 127.0.0.1, then 127.0.0.1 alone: the world grows onto
    127.0.0.1 at a commit, then localhost's workers leave at a commit and 127.0.0.1's first worker is rank 0.
    Nothing is rolled back (the function is entered once per change)."""
    job, lines = scenario(tmp_path, np=np_, min_np=min_np, max_np=max_np,
                          schedule=[(0, [f"{A}:{slots}"]), (1, [f"{A}:{slots}", f"{B}:{slots}"]),
                                    (None, [f"{B}:{slots}"])], env=framework)
    assert [_world(w) for w in lines] == [(slots, 0, A, 1), (2 * slots, 0, A, 2), (slots, slots, B, 3)], _show(job)
    _finished_equal(job, slots)
    assert {r["start_rank"] for r in job.results} == set(range(slots, 2 * slots))
    assert "failed during the job" not in job.out, _show(job)
    assert f"{slots} worker(s) leave at this reset: {A} (no longer listed by host discovery)" in job.out, _show(job)
    assert [line["commits"] for line in lines] == [10, 21, 32], "a commit was redone or lost"


@needs_ulfm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("exit_mode", ["exception", pytest.param("kill", marks=pytest.mark.slow)])
def test_single_rank_failure(tmp_path: Path, exit_mode: str) -> None:
    """Rank 0 raises (or is killed) at epoch 1, batch 0: its host, localhost, is excluded, so its other
    worker leaves too; 127.0.0.1's two workers roll back to the last commit and finish as ranks 0 and 1."""
    job, lines = scenario(tmp_path, schedule=[(None, [f"{A}:2", f"{B}:2"])], exits={(1, 0): [0]},
                          exit_mode=exit_mode)
    assert [_world(w) for w in lines] == [(4, 0, A, 1), (2, 2, B, 2), (2, 2, B, 2)], _show(job)
    _finished_equal(job, 2)
    assert "worker pid" in job.out and f"on host {A}" in job.out and f"{A} is excluded" in job.out, _show(job)
    if exit_mode == "exception":
        assert "RuntimeError: scheduled failure at epoch 1 batch 0 (start rank 0)" in job.out, _show(job)
        assert "leaves the job alone" in job.out, _show(job)
    assert "1 worker(s) failed during the job" in job.out, _show(job)


@needs_ulfm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("exit_mode", ["exception", pytest.param("kill", marks=pytest.mark.slow)])
def test_fault_tolerance_without_scaling(tmp_path: Path, exit_mode: str) -> None:
    """The same with a fixed host list (-H) and no --max-np: every slot is used from the start."""
    job, lines = scenario(tmp_path, hosts=f"{A}:2,{B}:2", max_np=None, exits={(1, 0): [0]}, exit_mode=exit_mode)
    assert [_world(w) for w in lines] == [(4, 0, A, 1), (2, 2, B, 2), (2, 2, B, 2)], _show(job)
    _finished_equal(job, 2)


@needs_ulfm
@pytest.mark.timeout(200)
def test_all_ranks_failure(tmp_path: Path) -> None:
    """Every worker raises at epoch 1: the job ends non-zero, saying no worker finished."""
    job, lines = scenario(tmp_path, schedule=[(None, [f"{A}:2", f"{B}:2"])], exits={(1, 0): [0, 1, 2, 3]})
    assert job.rc != 0, _show(job)
    assert "no worker finished the training" in job.out, _show(job)
    assert "4 worker(s) failed during the job" in job.out, _show(job)
    for rank in range(4):
        assert f"RuntimeError: scheduled failure at epoch 1 batch 0 (start rank {rank})" in job.out, _show(job)
    assert [_world(w) for w in lines] == [(4, 0, A, 1)] and not job.results, _show(job)


@needs_ulfm
@pytest.mark.timeout(200)
def test_all_hosts_excluded(tmp_path: Path) -> None:
    """One worker on each host raises: both hosts are excluded, no worker can go on, the job ends non-zero
    naming both hosts."""
    job, lines = scenario(tmp_path, schedule=[(None, [f"{A}:2", f"{B}:2"])], exits={(1, 0): [0, 2]})
    assert job.rc != 0, _show(job)
    assert "every host of the job must leave" in job.out, _show(job)
    assert f"{A}: excluded after a failure" in job.out and f"{B}: excluded after a failure" in job.out, _show(job)
    assert not job.results, _show(job)


@needs_ulfm
@pytest.mark.timeout(200)
def test_min_np_timeout(tmp_path: Path) -> None:
    """--min-np 4 and rank 0 raises: localhost is excluded, 2 workers are left, and after --elastic-timeout
    (1 s) without new slots the job ends non-zero saying so."""
    job, lines = scenario(tmp_path, np=4, min_np=4, schedule=[(None, [f"{A}:2", f"{B}:2"])],
                          exits={(1, 0): [0]}, extra=["--elastic-timeout", "1"])
    assert job.rc != 0, _show(job)
    assert "fewer than --min-np=4, for 1 s (--elastic-timeout)" in job.out, _show(job)
    assert not job.results and [_world(w) for w in lines] == [(4, 0, A, 1)], _show(job)


RESET_SCHEDULE = [(0, [f"{A}:2"]), (1, [f"{A}:2", f"{B}:2"]), (None, [f"{B}:2"])]


@needs_ulfm
@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework", FRAMEWORKS_CI)
def test_reset_limit(tmp_path: Path, framework: dict[str, str]) -> None:
    """The hosts-added-and-removed schedule resets twice (growth, then removal): --reset-limit 1 ends the job
    non-zero at the second reset."""
    job, lines = scenario(tmp_path, schedule=RESET_SCHEDULE, extra=["--reset-limit", "1"], env=framework)
    assert job.rc != 0, _show(job)
    assert "the job was reset 2 times, more than --reset-limit allows. Received: reset_limit=1" in job.out, _show(job)
    assert [_world(w) for w in lines] == [(2, 0, A, 1), (4, 0, A, 2)] and not job.results, _show(job)


@needs_ulfm
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_reset_limit_lets_that_many_resets_pass(tmp_path: Path) -> None:
    """The same schedule with --reset-limit 2 finishes, with the first scenario's worlds."""
    job, lines = scenario(tmp_path, schedule=RESET_SCHEDULE, extra=["--reset-limit", "2"])
    assert [_world(w) for w in lines] == [(2, 0, A, 1), (4, 0, A, 2), (2, 2, B, 3)], _show(job)
    _finished_equal(job, 2)


# Two cool-downs and two growths: about 35 s on an idle machine, so `slow`; test_elastic_unit.py checks the
# driver's cool-down (Horovod's back-off, a host offered again when it ends) in the default run.
@needs_ulfm
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_excluded_host_comes_back_after_its_cooldown(tmp_path: Path) -> None:
    """--blacklist-cooldown-range 1 2; the worker with start rank 3 (on 127.0.0.1) raises at epoch 1 and,
    spawned again there, at epoch 3. Each time 127.0.0.1 is excluded for its cool-down (both its workers
    leave), then offered again and grown onto; the job finishes with the host back.

    Horovod's own test checks epochs 0-2 and 4; at 4 it expects 2 workers because its job happens to end
    before the second cool-down does. Here rank 0 waits for the host at the end of epochs 2 and 3, so the
    host's return is part of the test. In which epoch the host returns depends on how long the re-forming
    took against the 2 s cool-down (on a loaded machine, longer), so the worlds are checked in the order
    hororun's driver saw them, and the epochs at their ends."""
    job, lines = scenario(tmp_path, schedule=[(None, [f"{A}:2", f"{B}:2"])], exits={(1, 0): [3], (3, 0): [3]},
                          expect={2: [f"{A}:2", f"{B}:2"], 3: [f"{A}:2", f"{B}:2"]}, env={"EPOCHS": "5",
                                                                                      "EPOCH_WAIT": "0.25"},
                          extra=["--blacklist-cooldown-range", "1", "2"])
    worlds = re.findall(r"hororun: elastic: world now has (\d+) worker", job.out)
    assert worlds == ["4", "3", "2", "4", "3", "2", "4"], _show(job)  # fail, leave, back; twice
    assert len(lines) == 5 and _world(lines[0]) == (4, 0, A, 1) and _world(lines[-1])[:3] == (4, 0, A), _show(job)
    assert all(_world(w)[1:3] == (0, A) and w["size"] in (2, 4) for w in lines), _show(job)
    _finished_equal(job, 4)
    assert job.out.count(f"{B} is excluded for 2 s") == 2, _show(job)
    assert "2 worker(s) failed during the job" in job.out, _show(job)


# Keras fit with KerasState and the elastic callbacks, on the TF and torch backends: one host removal (after
# a growth) and one raising worker. Every worker imports its framework (spawned ones one after another): 45-85 s
# each here, so `slow`; test_elastic.py's test_keras_fit_survives_a_kill covers KerasState in the default run.
# CI (make test-slow-ci) runs the TensorFlow backend; the torch backend is `long`.
KERAS_BACKENDS = ["tensorflow", pytest.param("torch", marks=pytest.mark.long)]


@pytest.mark.slow
@needs_ulfm
@pytest.mark.timeout(500)
@pytest.mark.parametrize("backend", KERAS_BACKENDS)
def test_keras_fit_hosts_added_and_removed(tmp_path: Path, backend: str) -> None:
    job, lines = scenario(tmp_path, schedule=[(0, [f"{A}:2"]), (1, [f"{A}:2", f"{B}:2"]), (None, [f"{B}:2"])],
                          app="keras_scenario.py", env={"KERAS_BACKEND": backend}, timeout=420)
    assert [_world(w) for w in lines] == [(2, 0, A, 1), (4, 0, A, 2), (2, 2, B, 3)], _show(job)
    assert [line["commits"] for line in lines] == [10, 21, 32], "a commit was redone or lost"
    _finished_equal(job, 2)
    for r in job.results:
        assert r["epoch"] == 3 and r["lr"] == pytest.approx(0.02), r
        assert r["resets"] == [[2, r["rank"]]], r  # spawned at the growth, reset at the removal


@pytest.mark.slow
@needs_ulfm
@pytest.mark.timeout(500)
@pytest.mark.parametrize("backend", KERAS_BACKENDS)
def test_keras_fit_single_rank_failure(tmp_path: Path, backend: str) -> None:
    job, lines = scenario(tmp_path, schedule=[(None, [f"{A}:2", f"{B}:2"])], exits={(1, 0): [0]},
                          app="keras_scenario.py", env={"KERAS_BACKEND": backend}, timeout=420)
    assert [_world(w) for w in lines] == [(4, 0, A, 1), (2, 2, B, 2), (2, 2, B, 2)], _show(job)
    _finished_equal(job, 2)
    assert "RuntimeError: scheduled failure at epoch 1 batch 0 (start rank 0)" in job.out, _show(job)
    for r in job.results:
        assert r["epoch"] == 3 and r["lr"] == pytest.approx(0.02), r
        assert r["resets"] == [[2, r["rank"]]], r


# A Lightning fit (LightningState, ElasticCallback) on the first scenario's schedule. The two workers spawned at the
# growth import torch and Lightning one after the other while the others wait: minutes here, so `slow`;
# test_elastic_lightning.py covers a kill and a growth in a fit.
@pytest.mark.slow
@needs_ulfm
@pytest.mark.timeout(700)
def test_lightning_fit_hosts_added_and_removed(tmp_path: Path) -> None:
    job, lines = scenario(tmp_path, schedule=[(0, [f"{A}:2"]), (1, [f"{A}:2", f"{B}:2"]), (None, [f"{B}:2"])],
                          app="lightning_scenario.py", timeout=640)
    assert [_world(w) for w in lines] == [(2, 0, A, 1), (4, 0, A, 2), (2, 2, B, 3)], _show(job)
    # 10 batches an epoch on 2 workers, 5 on 4: a commit after each but the last, and one at each epoch's end
    assert [line["commits"] for line in lines] == [9, 9 + 1 + 4, 9 + 1 + 4 + 1 + 9], "a commit was redone or lost"
    _finished_equal(job, 2)
    assert "failed during the job" not in job.out, _show(job)
    for r in job.results:
        assert r["epoch"] == 3 and r["lr"] == pytest.approx(0.02), r
        # spawned at the growth, they adapt to the world of 4 as the others do; then localhost's workers leave
        assert r["resets"] == [[4, r["start_rank"]], [2, r["rank"]]], r


@pytest.mark.slow
@needs_ulfm
@pytest.mark.timeout(500)
def test_lightning_fit_single_rank_failure(tmp_path: Path) -> None:
    """Rank 0 raises inside trainer.fit at epoch 1: Lightning tears its fit down and re-raises, the worker leaves
    alone, and 127.0.0.1's two workers resume the interrupted epoch from its start's commit."""
    job, lines = scenario(tmp_path, schedule=[(None, [f"{A}:2", f"{B}:2"])], exits={(1, 0): [0]},
                          app="lightning_scenario.py", timeout=420)
    assert [_world(w) for w in lines] == [(4, 0, A, 1), (2, 2, B, 2), (2, 2, B, 2)], _show(job)
    _finished_equal(job, 2)
    assert "RuntimeError: scheduled failure at epoch 1 batch 0 (start rank 0)" in job.out, _show(job)
    for r in job.results:
        assert r["epoch"] == 3 and r["lr"] == pytest.approx(0.02), r
        assert r["resets"] == [[2, r["rank"]]], r
