"""Horovod's own example scripts, unchanged, on horo: through the opt-in import hook (``compat/horovod``, the package
``horovod`` of ``horo-mpi-horovod``) and hororun, at 2 ranks on small settings.

Horovod's examples are Apache-2.0 code of another project, so they are not kept here: point
``HORO_HOROVOD_EXAMPLES`` at the ``examples`` folder of a Horovod 0.28 checkout (every case skips, saying so,
without it). ``HORO_HOROVOD_EXAMPLES_PYTHON`` names the interpreter the ranks run (default: this one); the torch
ones need torchvision, which horo does not install. The cases:

* ``pytorch/pytorch_synthetic_benchmark.py`` on ResNet-18 (also with ``--use-adasum --fp16-allreduce``);
* ``tensorflow2/tensorflow2_synthetic_benchmark.py`` and ``tensorflow2_keras_synthetic_benchmark.py`` on
  MobileNetV2, on Keras 2 (``TF_USE_LEGACY_KERAS=1``, ``tf_keras``): they call Keras 2's APIs
  (``opt.variables()``, ``compile(experimental_run_tf_function=...)``), which Keras 3 removed;
* ``elastic/pytorch/pytorch_synthetic_benchmark_elastic.py`` and
  ``elastic/tensorflow2/tensorflow2_synthetic_benchmark_elastic.py`` under ``hororun --min-np --max-np
  --host-discovery-script``; the torch one also on three one-slot hosts (localhost, 127.0.0.1 and this host's
  name) with one worker SIGKILLed mid-benchmark: the job finishes on the two left.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_mpi_suites import REPO, _kill_group

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

EXAMPLES = os.environ.get("HORO_HOROVOD_EXAMPLES")
PYTHON = os.environ.get("HORO_HOROVOD_EXAMPLES_PYTHON", sys.executable)
SHIM = REPO / "compat" / "horovod"
TORCH_SMALL = ["--model", "resnet18", "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter",
               "2", "--num-iters", "2"]
TF_SMALL = ["--model", "MobileNetV2", "--batch-size", "4", "--num-batches-per-iter", "2", "--num-iters", "2"]


def _example(path: str) -> Path:
    if not EXAMPLES:
        pytest.skip("set HORO_HOROVOD_EXAMPLES to the examples folder of a Horovod 0.28 checkout")
    script = Path(EXAMPLES) / path
    if not script.is_file():
        pytest.skip(f"{script} does not exist (HORO_HOROVOD_EXAMPLES={EXAMPLES})")
    return script


def _needs(*modules: str) -> None:
    code = "; ".join(f"import {m}" for m in modules)
    res = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"{PYTHON} cannot import {', '.join(modules)} ({last}); set HORO_HOROVOD_EXAMPLES_PYTHON")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="3",
               TF_NUM_INTEROP_THREADS="1", TF_NUM_INTRAOP_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM), str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    return env


def _hororun(args: list[str], script: Path, script_args: list[str], tmp_path: Path, timeout: float, env: dict[str, str],
             on_line=None) -> tuple[int, str]:
    """hororun ARGS PYTHON SCRIPT SCRIPT_ARGS, its process group killed on timeout; (status, output).
    ``on_line(line)`` sees each line as it comes."""
    cmd = [sys.executable, "-m", "horo.run", *args, PYTHON, str(script), *script_args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reader.join(10)
        pytest.fail(f"{cmd} ran past {timeout:.0f} s and was killed:\n{''.join(lines)[-6000:]}")
    reader.join(30)
    return proc.returncode, "".join(lines)


def _discovery(tmp_path: Path, *hosts: str) -> str:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {h}\n" for h in hosts))
    script.chmod(0o755)
    return str(script)


def _rank_pid(rank: int, script: Path) -> int | None:
    """The pid of the process that is rank ``rank`` of the job running ``script``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if str(script).encode() in cmdline and b"horo.run" not in cmdline \
                and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(entry)
    return None


@pytest.mark.timeout(700)
@pytest.mark.parametrize("flags", [[], pytest.param(["--use-adasum", "--fp16-allreduce"], marks=pytest.mark.long)],
                         ids=["average", "adasum-fp16"])
def test_pytorch_synthetic_benchmark(tmp_path: Path, flags: list[str]) -> None:
    script = _example("pytorch/pytorch_synthetic_benchmark.py")
    _needs("torch", "torchvision")
    rc, out = _hororun(["-np", "2"], script, [*TORCH_SMALL, *flags], tmp_path, 600, _env())
    assert rc == 0, out[-6000:]
    assert "Total img/sec on 2 CPU(s)" in out, out[-6000:]


@pytest.mark.timeout(700)
@pytest.mark.parametrize("name", ["tensorflow2_synthetic_benchmark.py", "tensorflow2_keras_synthetic_benchmark.py"])
def test_tensorflow2_synthetic_benchmarks_on_keras_2(tmp_path: Path, name: str) -> None:
    script = _example(f"tensorflow2/{name}")
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("needs tf_keras (pip install 'horo-mpi[tensorflow-cpu,tf-keras]')")
    rc, out = _hororun(["-np", "2"], script, TF_SMALL, tmp_path, 600, _env(TF_USE_LEGACY_KERAS="1"))
    assert rc == 0, out[-6000:]
    assert "Total img/sec on 2 " in out, out[-6000:]


@pytest.mark.timeout(700)
def test_pytorch_elastic_synthetic_benchmark(tmp_path: Path) -> None:
    script = _example("elastic/pytorch/pytorch_synthetic_benchmark_elastic.py")
    _needs("torch", "torchvision")
    args = ["-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
            _discovery(tmp_path, "localhost:2")]
    rc, out = _hororun(args, script, TORCH_SMALL, tmp_path, 600, _env())
    assert rc == 0, out[-6000:]
    assert "Total img/sec on 2 CPU(s)" in out, out[-6000:]


@pytest.mark.timeout(700)
@pytest.mark.long
def test_tensorflow2_elastic_synthetic_benchmark_on_keras_2(tmp_path: Path) -> None:
    script = _example("elastic/tensorflow2/tensorflow2_synthetic_benchmark_elastic.py")
    if importlib.util.find_spec("tf_keras") is None:
        pytest.skip("needs tf_keras (pip install 'horo-mpi[tensorflow-cpu,tf-keras]')")
    args = ["-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
            _discovery(tmp_path, "localhost:2")]
    small = ["--model", "MobileNetV2", "--batch-size", "4", "--num-warmup-batches", "1", "--num-batches-per-iter", "2",
             "--num-iters", "2"]
    rc, out = _hororun(args, script, small, tmp_path, 600, _env(TF_USE_LEGACY_KERAS="1"))
    assert rc == 0, out[-6000:]
    assert "Total img/sec on 2 " in out, out[-6000:]


@pytest.mark.timeout(800)
def test_pytorch_elastic_synthetic_benchmark_goes_on_without_a_killed_worker(tmp_path: Path) -> None:
    """Three one-slot hosts; once the benchmark runs, rank 1 is SIGKILLed: the survivors roll back to the last
    commit and finish the benchmark as a world of 2."""
    script = _example("elastic/pytorch/pytorch_synthetic_benchmark_elastic.py")
    _needs("torch", "torchvision")
    hosts = ["localhost:1", "127.0.0.1:1", f"{socket.gethostname()}:1"]
    args = ["-np", "3", "--min-np", "2", "--max-np", "3", "--host-discovery-script", _discovery(tmp_path, *hosts)]
    killed: list[int] = []

    def kill_once(line: str) -> None:
        if not killed and line.startswith("Iter #0"):
            deadline = time.monotonic() + 10
            while not killed and time.monotonic() < deadline:
                pid = _rank_pid(1, script)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                else:
                    time.sleep(0.2)

    small = [*TORCH_SMALL[:-1], "6"]  # six iterations: the kill lands in the middle
    rc, out = _hororun(args, script, small, tmp_path, 700, _env(), on_line=kill_once)
    assert killed, f"no rank 1 process was found to kill:\n{out[-6000:]}"
    assert rc == 0, out[-6000:]
    assert f"worker pid {killed[0]} on host" in out and "failed" in out, out[-6000:]
    assert "Total img/sec on 2 CPU(s)" in out, out[-6000:]
