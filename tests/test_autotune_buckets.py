"""Autotune's bucket size knob: horo.torch's gradient buckets re-formed while a job runs.

The tuner searches ``bucket_bytes`` only once gradient buckets that follow it went through the engine, and
never when the user set ``HORO_BUCKET_BYTES`` by hand. The real jobs (tests/scripts/autotune_buckets_job.py,
through hororun at 1, 2 and 3 ranks, the tiny budget of test_autotune.py) check that every rank re-forms
its buckets at the same step, that results stay exact, and that a step starts one exchange per bucket.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_autotune import TUNE_ENV, read_log, run_job

from horo.core.api.bucket_knob import BUCKET_KNOB_PREFIX
from horo.core.scheduling.autotune import AutotuneOptions, Knobs, Manager, explicit_knobs

pytest.importorskip("torch")

JOB = "autotune_buckets_job.py"
# 128 KiB parameters, a 256 KiB first bucket: each bucket size the search tries gives its own bucket count.
BUCKET_ENV = {**TUNE_ENV, "HORO_FIRST_BUCKET_BYTES": "262144"}


def _manager(fixed: dict[str, float], names: list[str]) -> Manager:
    """A manager that has seen its first sample of ``names`` (one step per sample, no warm-up)."""
    pytest.importorskip("sklearn")
    m = Manager(AutotuneOptions(enabled=True, steps_per_sample=1, warmup_samples=0, max_samples=6), Knobs(),
                fixed, {"world_size": 2})
    m.applied()
    for t in range(3):
        m.record([(n, "<f4", 1 << 20) for n in names], float(t))
    return m


def test_bucket_size_is_searched_only_where_buckets_follow_it() -> None:
    assert "bucket_bytes" not in _manager({}, ["grad.0", "grad.1"]).search.dims
    assert "bucket_bytes" in _manager({}, [f"{BUCKET_KNOB_PREFIX}0.ab12", "grad.1"]).search.dims
    held = _manager({"bucket_bytes": 1 << 20}, [f"{BUCKET_KNOB_PREFIX}0.ab12"])
    assert "bucket_bytes" not in held.search.dims and held.current.bucket_bytes == 1 << 20


def test_a_bucket_size_set_by_hand_is_explicit() -> None:
    assert explicit_knobs({"HORO_BUCKET_BYTES": "4194304"}) == {"bucket_bytes": 4194304.0}
    assert Knobs().bucket_bytes == 25 << 20  # the default of HORO_BUCKET_BYTES: an untuned job's setting


def _steps(records: list[dict]) -> list[list]:
    """The per-step notes, the same on every rank: [step, bucket size, buckets, layout digest, exchanges]."""
    notes = records[0]["notes"]
    assert all(r["notes"] == notes for r in records), "ranks formed different buckets at some step"
    assert all(r["exact"] for r in records)
    assert all(n[4] == n[2] for n in notes), notes  # one exchange per bucket, not per parameter
    return notes


@pytest.mark.timeout(400)
@pytest.mark.parametrize("n", [1, 2, pytest.param(3, marks=pytest.mark.slow)])  # 3: in make test-slow-ci
def test_buckets_reformed_at_the_same_step_everywhere(tmp_path: Path, n: int) -> None:
    log = tmp_path / "log.csv"
    records, _ = run_job(tmp_path, n, {**BUCKET_ENV, "HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": str(log)},
                         job=JOB)
    notes = _steps(records)
    sizes = [s for _, s, *_ in notes]
    changes = sum(a != b for a, b in zip(sizes, sizes[1:]))
    assert len(set(sizes)) >= 3 and len({c for _, _, c, *_ in notes}) >= 2, notes  # really re-formed
    assert all(r["reforms"] == changes for r in records)
    assert records[0]["frozen_at"] is not None and sizes[-1] == records[0]["knobs"]["bucket_bytes"]
    # The log shows the knob, row by row as tried.
    rows = read_log(log)
    assert [int(r["bucket_bytes"]) for r in rows] == [t["knobs"]["bucket_bytes"] for t in records[0]["trials"]]
    assert len({r["bucket_bytes"] for r in rows}) >= 3


@pytest.mark.timeout(300)
def test_bucket_size_set_by_hand_stays_fixed(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    records, _ = run_job(tmp_path, 2, {**BUCKET_ENV, "HORO_BUCKET_BYTES": "524288", "HORO_AUTOTUNE": "1",
                                       "HORO_AUTOTUNE_LOG": str(log)}, job=JOB)
    notes = _steps(records)
    assert {(s, c, d) for _, s, c, d, _ in notes} == {tuple(notes[0][1:4])} and notes[0][1] == 524288
    assert all(r["reforms"] == 0 for r in records)
    rows = read_log(log)
    assert {r["bucket_bytes"] for r in rows} == {"524288"}
    assert len({r["tensor_fusion_threshold"] for r in rows}) >= 3  # the other knobs are still tuned


@pytest.mark.timeout(300)
def test_bucket_size_passed_in_code_is_not_searched(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    records, _ = run_job(tmp_path, 2, {**BUCKET_ENV, "HORO_AUTOTUNE": "1", "HORO_AUTOTUNE_LOG": str(log)},
                         job=JOB, args=("--bucket-bytes", "524288"), steps=30)
    notes = _steps(records)
    assert {n[1] for n in notes} == {524288} and all(r["reforms"] == 0 for r in records)
    assert {r["bucket_bytes"] for r in read_log(log)} == {str(25 << 20)}  # held at the default: nothing follows it
