"""Install as users do: the distribution's name, metadata ranges, ``horo.__version__``, and the built wheel in a
fresh venv.

The distribution is ``horo-mpi`` (the import name is ``horo``; ``horo`` on the package index is another project).
The wheel test builds the sdist and the wheel (``python -m build``), installs the distribution by its name with
the ``lightning`` extra into a new venv (``pip install --find-links DIST 'horo-mpi[lightning]==VERSION'``, with
constraints.txt, so torch stays this machine's CPU build), and runs examples/lightning_fit.py on 2 ranks through
the venv's own ``hororun``. Then the opt-in ``horo-mpi-horovod`` (``compat/horovod``, built as ``make dist`` does):
before it nothing named ``horovod`` imports; after it, ``horovod.torch`` is ``horo.torch``, and a script that
names Horovod only runs on 2 ranks.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

import horo

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
WHEEL_TIMEOUT = 900.0
FRAMEWORKS = ("torch", "tensorflow", "tensorflow-cpu", "keras", "tf-keras", "lightning", "pytorch-lightning", "jax",
              "optax", "flax", "mpi4jax")


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


DIST = PYPROJECT["project"]["name"]
WHEEL_STEM = DIST.replace("-", "_")  # a wheel's and an sdist's file names normalise the name (PEP 427, PEP 625)
SHIM_DIR = REPO / "compat" / "horovod"
SHIM = tomllib.loads((SHIM_DIR / "pyproject.toml").read_text())["project"]


def test_distribution_name() -> None:
    assert DIST == horo.DISTRIBUTION == "horo-mpi"


def test_version_matches_metadata() -> None:
    assert horo.__version__ == importlib.metadata.version(DIST) == PYPROJECT["project"]["version"]


def test_extras_state_ranges_and_constraints_pin() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, reqs in extras.items():
        for req in reqs:
            if _name(req) in FRAMEWORKS:
                assert "==" not in req and ">=" in req, f"horo-mpi[{extra}] pins {req!r}: state a tested range"
    # The TF extras must not force the CPU build on a GPU machine: only the explicit one names it.
    assert not any(_name(r) == "tensorflow-cpu" for e, rs in extras.items() if e != "tensorflow-cpu" for r in rs)
    assert any(_name(r) == "tensorflow" for r in extras["tensorflow"])
    pins = {_name(ln): ln for ln in (REPO / "constraints.txt").read_text().splitlines()
            if ln.strip() and not ln.startswith("#")}
    assert pins["torch"].startswith("torch==")
    assert all(pins[n].startswith(f"{n}==") for n in ("jax", "jaxlib", "optax", "flax", "tf-keras"))
    # Keras 2 is in the development venv, so `make test` runs the Keras suites under both Kerases.
    assert "tf-keras" in (REPO / "Makefile").read_text().split("EXTRAS ?=", 1)[1].splitlines()[0].split(",")
    # CI's venv has JAX, so the JAX suites run; mpi4jax (compiled at install) stays out of it.
    makefile = (REPO / "Makefile").read_text()
    extras_line = next(ln for ln in makefile.splitlines() if ln.startswith("EXTRAS"))
    assert "jax" in extras_line.split("=", 1)[1].split(",") and "mpi4jax" not in extras_line
    assert "-c $(CONSTRAINTS)" in (REPO / "Makefile").read_text()


def test_the_horovod_names_distribution_follows_horo_mpi() -> None:
    """horo-mpi-horovod has horo-mpi's version and requires exactly that horo-mpi; it holds the package horovod
    only, which horo-mpi does not."""
    version = PYPROJECT["project"]["version"]
    assert SHIM["name"] == "horo-mpi-horovod" and SHIM["version"] == version
    assert SHIM["dependencies"] == [f"{DIST}=={version}"]
    assert sorted(p.name for p in SHIM_DIR.iterdir() if (p / "__init__.py").is_file()) == ["horovod"]
    assert not (REPO / "src" / "horovod").exists()


def _run(cmd: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own process group; the whole group is killed on timeout and afterwards."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            start_new_session=True, **kw)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout:.0f}s: {cmd}\n{out[-6000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing it started may outlive it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(WHEEL_TIMEOUT + 60)
def test_wheel_in_fresh_venv_runs_lightning_example(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="pip install 'horo-mpi[test]' (python -m build)")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HORO_SELF_LAUNCHED")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    dist = tmp_path / "dist"
    res = _run([sys.executable, "-m", "build", "--outdir", str(dist), str(REPO)], 300, env=env)
    assert res.returncode == 0, res.stdout[-6000:]
    res = _run([sys.executable, "-m", "build", "--outdir", str(dist), str(SHIM_DIR)], 300, env=env)  # as make dist
    assert res.returncode == 0, res.stdout[-6000:]
    version = PYPROJECT["project"]["version"]
    wheel, sdist = dist / f"{WHEEL_STEM}-{version}-py3-none-any.whl", dist / f"{WHEEL_STEM}-{version}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())
    with tarfile.open(sdist) as tar:  # the sdist can run the suite: tests, examples, pins
        names = set(tar.getnames())
    for part in ("constraints.txt", "tests/mpi/test_allreduce.py", "examples/lightning_fit.py",
                 "src/horo/tensorflow/wait_kernel.cc"):
        assert f"{WHEEL_STEM}-{version}/{part}" in names, part
    with zipfile.ZipFile(wheel) as whl:  # the TF kernel's source, compiled on first use; no package horovod
        assert "horo/tensorflow/wait_kernel.cc" in whl.namelist()
        assert not any(n.startswith("horovod/") for n in whl.namelist())
    with zipfile.ZipFile(dist / f"horo_mpi_horovod-{version}-py3-none-any.whl") as whl:
        assert {n for n in whl.namelist() if not n.startswith("horo_mpi_horovod-")} == {"horovod/__init__.py"}

    venv = tmp_path / "venv"
    try:
        _install_and_run(venv, dist, version, env, tmp_path)
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # about 1 GB with torch; pytest keeps recent tmp dirs


def _install_and_run(venv: Path, dist: Path, version: str, env: dict[str, str], tmp_path: Path) -> None:
    res = _run([sys.executable, "-m", "venv", str(venv)], 120, env=env)
    assert res.returncode == 0, res.stdout
    py = str(venv / "bin" / "python")
    # By the distribution's name, as users install it; --find-links offers the wheel just built.
    res = _run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-c", str(REPO / "constraints.txt"),
                "--find-links", str(dist), f"{DIST}[lightning]=={version}"], 600, env=env)
    assert res.returncode == 0, res.stdout[-6000:]
    probe = ("import importlib.metadata as m, horo, torch; "
             f"print('PROBE', horo.__version__, m.version({DIST!r}), torch.__version__, horo.__file__)")
    res = _run([py, "-c", probe], 120, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout
    _, ver, meta, torch_version, where = next(ln for ln in res.stdout.splitlines() if ln.startswith("PROBE")).split()
    assert ver == meta == version
    assert where.startswith(str(venv)), where  # the wheel's copy, not this checkout's
    pin = next(ln for ln in (REPO / "constraints.txt").read_text().splitlines() if ln.startswith("torch=="))
    assert torch_version.split("+")[0] == pin.split("==")[1], torch_version

    res = _run([str(venv / "bin" / "hororun"), "-np", "2", py, str(REPO / "examples" / "lightning_fit.py")], 300,
               env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-6000:]
    sums = dict(re.findall(r"rank (\d)/2: weights checksum (\S+)", res.stdout))
    assert set(sums) == {"0", "1"} and sums["0"] == sums["1"], res.stdout[-6000:]

    # Horovod's import names: nothing named horovod until the opt-in distribution is installed.
    res = _run([py, "-c", "import horovod"], 120, env=env, cwd=tmp_path)
    assert res.returncode != 0 and "No module named 'horovod'" in res.stdout, res.stdout[-3000:]
    res = _run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", "-c", str(REPO / "constraints.txt"),
                "--find-links", str(dist), f"horo-mpi-horovod=={version}"], 600, env=env)
    assert res.returncode == 0, res.stdout[-6000:]
    probe = ("import horovod, horovod.torch as hvd, horovod.torch.elastic, horo.torch, horo.torch.elastic; "
             "from horovod.common.exceptions import HorovodInternalError; import horo; "
             "assert hvd is horo.torch and horovod.torch.elastic is horo.torch.elastic; "
             "assert HorovodInternalError is horo.HorovodInternalError; print('PROBE', horovod.__file__)")
    res = _run([py, "-c", probe], 120, env=env, cwd=tmp_path)
    assert res.returncode == 0 and f"PROBE {venv}" in res.stdout, res.stdout[-3000:]
    script = REPO / "tests" / "horovod_scripts" / "synthetic_torch.py"
    res = _run([str(venv / "bin" / "hororun"), "-np", "2", py, str(script)], 300, env=env, cwd=tmp_path)
    assert res.returncode == 0 and "HOROVOD SCRIPT OK on 2 ranks" in res.stdout, res.stdout[-6000:]


@pytest.mark.parametrize("module,backend", [("horo.keras", "tensorflow"), ("horo.keras", "torch"),
                                            ("horo.keras", "jax"), ("horo.jax", "jax"),
                                            ("horo.tensorflow", "tensorflow")])
def test_missing_framework_is_named_at_import(module: str, backend: str) -> None:
    # The extras leave TensorFlow's build (tensorflow or tensorflow-cpu) to the user; without either, the
    # import must say what to install. A None entry in sys.modules makes `import <name>` fail as if absent.
    blocked = backend
    code = f"import sys; sys.modules[{blocked!r}] = None; import {module}"
    env = dict(os.environ, KERAS_BACKEND=backend)
    res = _run([sys.executable, "-c", code], 120, env=env)
    assert res.returncode != 0
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), res.stdout[-3000:]
    if blocked == "tensorflow":
        assert "neither tensorflow nor tensorflow-cpu is installed" in last and "pip install tensorflow" in last
    elif blocked == "jax":
        assert ("jax is not installed" in last or "import jax failed" in last) and "horo-mpi[jax]" in last, last
    else:
        assert "torch is not installed" in last and "pip install torch" in last
