"""Horovod's variable names (``HOROVOD_FUSION_THRESHOLD``, ...) work unchanged as aliases of ``HORO_*``.

Unit tests of the mapping in ``horo.core.base.config``, then real jobs through ``hororun`` at 1, 2 and 3 ranks
whose launch line uses only Horovod's names: the engine reports the threshold it runs with, and the
timeline (itself asked for by ``HOROVOD_TIMELINE``) shows no fused call larger than that threshold allows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from horo.core.base import config as cfg

SCRIPT = Path(__file__).resolve().parent / "scripts" / "env_aliases.py"
JOB_TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test sees the once-per-process warning anew, and none of this process's own variables.
    monkeypatch.setattr(cfg, "_warned", set())
    monkeypatch.setattr(cfg, "_copied", {})


@pytest.mark.parametrize("horovod,horo", [
    ("HOROVOD_FUSION_THRESHOLD", "HORO_FUSION_THRESHOLD"),
    ("HOROVOD_CYCLE_TIME", "HORO_CYCLE_TIME"),
    ("HOROVOD_CACHE_CAPACITY", "HORO_CACHE_CAPACITY"),
    ("HOROVOD_TIMELINE", "HORO_TIMELINE"),
    ("HOROVOD_TIMELINE_MARK_CYCLES", "HORO_TIMELINE_MARK_CYCLES"),
    ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HORO_STALL_CHECK_TIME_SECONDS"),
    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HORO_STALL_SHUTDOWN_TIME_SECONDS"),
    ("HOROVOD_STALL_CHECK_DISABLE", "HORO_STALL_CHECK_DISABLE"),
    ("HOROVOD_HIERARCHICAL_ALLREDUCE", "HORO_HIERARCHICAL_ALLREDUCE"),
    ("HOROVOD_HIERARCHICAL_ALLGATHER", "HORO_HIERARCHICAL_ALLGATHER"),
    ("HOROVOD_AUTOTUNE", "HORO_AUTOTUNE"),
    ("HOROVOD_AUTOTUNE_LOG", "HORO_AUTOTUNE_LOG"),
    ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "HORO_AUTOTUNE_WARMUP_SAMPLES"),
])
def test_families_map_by_prefix(horovod: str, horo: str) -> None:
    assert cfg.horo_name(horovod) == horo


@pytest.mark.parametrize("name", ["HOROVOD_RANK", "HOROVOD_TIMELINES", "HOROVOD_AUTOTUNER", "HORO_FUSION_THRESHOLD",
                                  "FUSION_THRESHOLD", "HOROVOD_GLOO_TIMEOUT_SECONDS"])
def test_other_names_are_not_aliases(name: str) -> None:
    assert cfg.horo_name(name) is None


def test_alias_alone_sets_the_knob() -> None:
    got = cfg.read_env({"HOROVOD_FUSION_THRESHOLD": "8192", "HOROVOD_CYCLE_TIME": "7.5"})
    assert got.int("HORO_FUSION_THRESHOLD") == 8192
    assert got["HORO_CYCLE_TIME"] == 7.5


def test_horo_name_wins_with_one_warning(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"HORO_FUSION_THRESHOLD": "16384", "HOROVOD_FUSION_THRESHOLD": "8192"}
    for _ in range(3):
        assert cfg.read_env(env).int("HORO_FUSION_THRESHOLD") == 16384
    err = capsys.readouterr().err
    assert err.count("warning") == 1, err
    assert "HORO_FUSION_THRESHOLD='16384'" in err and "HOROVOD_FUSION_THRESHOLD='8192'" in err


def test_equal_values_do_not_warn(capsys: pytest.CaptureFixture[str]) -> None:
    cfg.read_env({"HORO_CYCLE_TIME": "5", "HOROVOD_CYCLE_TIME": "5"})
    assert capsys.readouterr().err == ""


def test_only_launcher_rank0_warns(capsys: pytest.CaptureFixture[str]) -> None:
    env = {"HORO_CYCLE_TIME": "5", "HOROVOD_CYCLE_TIME": "6", "OMPI_COMM_WORLD_RANK": "1"}
    assert cfg.read_env(env)["HORO_CYCLE_TIME"] == 5.0
    assert capsys.readouterr().err == ""


def test_bad_alias_value_names_the_alias() -> None:
    with pytest.raises(ValueError, match=r"Received: HOROVOD_FUSION_THRESHOLD='64MB'.*HINT"):
        cfg.read_env({"HOROVOD_FUSION_THRESHOLD": "64MB"})


def test_apply_aliases_follows_a_changed_alias() -> None:
    env: dict[str, str] = {"HOROVOD_TIMELINE": "/data/a.json"}
    assert cfg.apply_aliases(env) == {"HORO_TIMELINE": "/data/a.json"}
    assert env["HORO_TIMELINE"] == "/data/a.json"
    # A user's own HORO_ value is never overwritten.
    env = {"HOROVOD_TIMELINE": "/data/a.json", "HORO_TIMELINE": "/data/mine.json"}
    assert cfg.apply_aliases(env) == {}
    assert env["HORO_TIMELINE"] == "/data/mine.json"


# ------------------------------------------------------------------------------------------- real jobs


def _hororun(n: int, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``hororun -np n python env_aliases.py`` with only ``env`` changed, killed as a group on timeout."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    full.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **env)
    cmd = [sys.executable, "-m", "horo.run", "-np", str(n), sys.executable, str(SCRIPT)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full, cwd=cwd,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"job at n={n} hung for {JOB_TIMEOUT:.0f}s:\n{out}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the job may outlive it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def _settings(out: str) -> list[dict[str, object]]:
    return sorted((json.loads(ln.split("SETTING ", 1)[1]) for ln in out.splitlines() if "SETTING " in ln),
                  key=lambda r: r["rank"])


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_horovod_launch_line_takes_effect(n: int, tmp_path: Path) -> None:
    timeline = tmp_path / "tl.json"
    res = _hororun(n, {"HOROVOD_FUSION_THRESHOLD": "8192", "HOROVOD_CYCLE_TIME": "7",
                       "HOROVOD_TIMELINE": str(timeline)}, tmp_path)
    assert res.returncode == 0, res.stdout
    got = _settings(res.stdout)
    assert [r["rank"] for r in got] == list(range(n)), res.stdout
    for r in got:
        assert r["threshold"] == 8192 and r["cycle_ms"] == 7.0 and r["timeline"] == str(timeline), r
    assert "warning" not in res.stdout
    # 4000-byte tensors under an 8192-byte threshold: at most two share a call. (The default, 1 MiB, lets
    # all six share one; the same script without the variable is the control below.)
    events = json.loads(timeline.read_text())
    fused = [e["args"]["fused"] for e in events if e.get("name") == "ALLREDUCE" and "fused" in e.get("args", {})]
    assert fused and max(fused) == 2, fused


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_default_threshold_fuses_more(tmp_path: Path) -> None:
    timeline = tmp_path / "tl.json"
    res = _hororun(2, {"HOROVOD_TIMELINE": str(timeline)}, tmp_path)
    assert res.returncode == 0, res.stdout
    assert all(r["threshold"] == 1 << 20 for r in _settings(res.stdout)), res.stdout
    events = json.loads(timeline.read_text())
    fused = [e["args"]["fused"] for e in events if e.get("name") == "ALLREDUCE" and "fused" in e.get("args", {})]
    assert fused and max(fused) > 2, fused


@pytest.mark.mpi
@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_horo_name_wins_in_a_job_and_warns_once(tmp_path: Path) -> None:
    res = _hororun(3, {"HOROVOD_FUSION_THRESHOLD": "8192", "HORO_FUSION_THRESHOLD": "16384"}, tmp_path)
    assert res.returncode == 0, res.stdout
    assert [r["threshold"] for r in _settings(res.stdout)] == [16384] * 3, res.stdout
    assert res.stdout.count("horo: warning: both HORO_FUSION_THRESHOLD") == 1, res.stdout
