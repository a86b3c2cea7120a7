"""``strategy="horo"`` against ``strategy="ddp"`` as a Lightning user sees them: the same script
(tests/scripts/lightning_parity.py) under DDP over gloo (torchrun), under horo from hororun, and under horo
started as ``python script.py`` with ``devices=N``, on the unified ``lightning`` package and on
``pytorch_lightning``, at 2 and 3 ranks.

Compared per rank: the gradients ``on_after_backward`` sees (averaged, before the hook), a gradient zeroed there
staying zero, the logged validation accuracy equal to rank 0's saved model on the whole validation set, a
parameter no rank uses unchanged under AdamW with weight decay (``grad`` None), a ``p.grad`` reference kept
across steps unchanged, ``reduce``/``all_reduce`` in place, the final weights and buffers; and how many
processes ran the code before ``Trainer()`` (N, the launching process being rank 0). The 3-rank runs use small
gradient buckets (several per step, some started while backward runs), the 2-rank runs horo's defaults. Each
launch costs Lightning's import on every rank, so ``make test`` runs two of the four cases with one horo launch
each (hororun at 2 ranks, self-launch at 3); ``make test-slow`` runs all four with both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mpi_suites import _kill_group

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "lightning_parity.py"
TIMEOUT = 240.0
BOTH = ("horo", "self")
CASES = [pytest.param("lightning", 2, ("horo",), id="lightning-2"),
         pytest.param("pytorch_lightning", 3, ("self",), id="pytorch_lightning-3", marks=[pytest.mark.slow]),
         pytest.param("lightning", 3, BOTH, id="lightning-3", marks=[pytest.mark.slow, pytest.mark.long]),
         pytest.param("pytorch_lightning", 2, BOTH, id="pytorch_lightning-2",
                      marks=[pytest.mark.slow, pytest.mark.long])]


def _launch(cmd: list[str], out: Path, env: dict[str, str]) -> None:
    proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        log, _ = proc.communicate()
        pytest.fail(f"timed out after {TIMEOUT:.0f} s: {cmd}\n{log[-6000:]}")
    finally:
        if proc.poll() is None:  # pragma: no cover
            _kill_group(proc)
    assert proc.returncode == 0, f"{cmd}\n{log[-8000:]}"


def _close(a: list, b: list, tol: float = 1e-6) -> float:
    fa = [x for row in a for x in (row if isinstance(row, list) else [row])]
    fb = [x for row in b for x in (row if isinstance(row, list) else [row])]
    assert len(fa) == len(fb)
    return max((abs(x - y) for x, y in zip(fa, fb)), default=0.0)


@pytest.mark.mpi
@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize(("package", "n", "launches"), CASES)
def test_horo_as_ddp(package: str, n: int, launches: tuple[str, ...], tmp_path: Path) -> None:
    pytest.importorskip(package)
    py = sys.executable
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p))
    for var in ("HORO_SELF_LAUNCHED", "HORO_LAUNCHER", "HORO_BUCKET_BYTES", "HORO_FIRST_BUCKET_BYTES"):
        env.pop(var, None)
    horo_env = dict(env, HORO_BUCKET_BYTES="64", HORO_FIRST_BUCKET_BYTES="64") if n == 3 else env
    base = [str(SCRIPT), "--package", package, "--out", str(tmp_path)]
    _launch([py, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *base, "--strategy", "ddp"],
            tmp_path, env)
    if "horo" in launches:
        _launch([str(Path(py).parent / "hororun"), "-np", str(n), py, *base, "--strategy", "horo"], tmp_path,
                horo_env)
    if "self" in launches:
        _launch([py, *base, "--strategy", "horo", "--devices", str(n), "--tag", "self"], tmp_path, horo_env)

    for tag in ("ddp", *launches):
        assert len(list(tmp_path.glob(f"started.{tag}.*"))) == n, tag  # the launching process is rank 0
    for tag in launches:
        for r in range(n):
            ddp = json.loads((tmp_path / f"ddp.rank{r}.json").read_text())
            horo = json.loads((tmp_path / f"{tag}.rank{r}.json").read_text())
            t, d = horo["trainer"], ddp["trainer"]
            where = f"{tag} rank {r}"
            assert _close(t["seen"], d["seen"]) < 1e-6, where  # the hook sees the averaged gradients
            assert t["zeroed_stayed"] == d["zeroed_stayed"] == [True] * len(d["zeroed_stayed"]), where
            assert t["logged"] == pytest.approx(d["logged"], abs=1e-6), where
            if r == 0:  # the logged metric is that of the model rank 0 saved, on the whole validation set
                assert t["logged"] == pytest.approx(t["saved_whole"], abs=1e-6), where
                assert d["logged"] == pytest.approx(d["saved_whole"], abs=1e-6), where
            assert t["unused_same"] and t["unused_grad_none"] and d["unused_same"] and d["unused_grad_none"], where
            assert t["kept_same"] and d["kept_same"], where
            assert t["reduce"] == d["reduce"] == [n * (n + 1) / 2, True], where
            assert _close(t["state"], d["state"]) < 1e-5, where  # weights and buffers, this rank's
            f, g = horo["fabric"], ddp["fabric"]
            assert _close(f["seen"], g["seen"]) < 1e-6, where
            assert f["unused_same"] and g["unused_same"], where
            assert f["grad_none"] == g["grad_none"] == [True] * 4, where  # unused layer, model the loss left out
            assert f["kept_same"] and g["kept_same"], where
            assert f["reduce"] == g["reduce"] == [n * (n + 1) / 2, True], where
            assert _close(f["state"], g["state"]) < 1e-5, where


def test_ddp_timeout_is_the_stall_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP's ``timeout`` becomes ``HORO_STALL_SHUTDOWN_TIME_SECONDS`` when the strategy is made before horo starts
    (as in a script: horo reads it when it starts, on rank 0, for every rank)."""
    pytest.importorskip("lightning")
    import datetime

    import horo
    from horo.lightning import HoroFabricStrategy, HoroStrategy

    if horo.is_initialized():  # pragma: no cover - this process never starts horo itself
        pytest.skip("horo already started in this process")
    monkeypatch.setenv("HORO_STALL_SHUTDOWN_TIME_SECONDS", "0")  # restored afterwards
    HoroStrategy(timeout=datetime.timedelta(minutes=3))
    assert os.environ["HORO_STALL_SHUTDOWN_TIME_SECONDS"] == "180.0"
    HoroFabricStrategy(timeout=datetime.timedelta(seconds=45))
    assert os.environ["HORO_STALL_SHUTDOWN_TIME_SECONDS"] == "45.0"
    with pytest.raises(ValueError, match="timeout must be a positive datetime.timedelta"):
        HoroStrategy(timeout=30)
