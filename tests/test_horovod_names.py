"""Every user-facing module and name of Horovod 0.28.1 exists under horo by the same path (horovod.X -> horo.X),
and under Horovod's own path through the opt-in import hook (the package ``horovod`` of ``horo-mpi-horovod``).

The list is data, ``tests/data/horovod_names.json``, read from Horovod's sources and ``docs/api.rst``: each
module's names. The names and packages horo leaves out, each with why and what to use, are ``horo._horovod``'s
``NAMES`` and ``PACKAGES``. One child process imports every module (torch, TensorFlow and Keras included: the
pytest process stays free of them) and reports which names exist, whether each is the very object its facade
exports (one implementation, many paths), whether ``horovod.X`` is the module ``horo.X`` itself, and what
importing a left-out name or package raises. The migration guide, docs/migrating.md, lists every name not
provided.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horo._horovod import NAMES, PACKAGES

REPO = Path(__file__).resolve().parents[1]
DATA = json.loads((REPO / "tests" / "data" / "horovod_names.json").read_text())
MODULES: dict[str, dict] = DATA["modules"]
NOT_PROVIDED: dict[str, str] = NAMES
PENDING: dict[str, str] = DATA["pending"]
GUIDE = REPO / "docs" / "migrating.md"
#: The source folder of the opt-in distribution horo-mpi-horovod: on sys.path, ``import horovod`` is its hook.
SHIM = REPO / "compat" / "horovod"

#: The facade each Horovod family's names come from, in horo.
FAMILIES = [("horovod.tensorflow.keras", "horo.keras"), ("horovod.keras", "horo.keras"),
            ("horovod.tensorflow", "horo.tensorflow"), ("horovod.torch", "horo.torch"), ("horovod.common", "horo"),
            ("horovod.ray", "horo.ray"), ("horovod.spark", "horo.spark")]

PROBE = r"""
import importlib, importlib.util, json, sys, types
modules, families, shim = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
names_left_out, packages_left_out = json.loads(sys.argv[4]), json.loads(sys.argv[5])
report = {"horovod_before_the_hook": importlib.util.find_spec("horovod") is not None, "modules": {},
          "refusals": {}}
for horovod_name, names in modules.items():
    path = "horo" + horovod_name[len("horovod"):]
    entry = report["modules"][horovod_name] = {"path": path, "error": None, "present": [], "other_object": [],
                                               "alias": None}
    try:
        mod = importlib.import_module(path)
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        continue
    facade = importlib.import_module(next(f for h, f in families if horovod_name.startswith(h)))
    for name in names:
        try:
            value = getattr(mod, name)
        except (AttributeError, ImportError):
            continue
        entry["present"].append(name)
        if mod is not facade and hasattr(facade, name) and not isinstance(value, types.ModuleType):
            if getattr(facade, name) is not value:
                entry["other_object"].append(name)
sys.path.insert(0, shim)
import horovod
for horovod_name, entry in report["modules"].items():
    if entry["error"] is None:
        entry["alias"] = importlib.import_module(horovod_name) is sys.modules[entry["path"]]
for key in names_left_out:
    module, name = key.rsplit(".", 1)
    try:
        exec(f"from {module} import {name}")
        report["refusals"][key] = None
    except ImportError as exc:
        report["refusals"][key] = f"{type(exc).__name__}: {exc}"
for key in packages_left_out:
    try:
        importlib.import_module(key)
        report["refusals"][key] = None
    except ImportError as exc:
        report["refusals"][key] = f"{type(exc).__name__}: {exc}"
report["aliases"] = sorted(k for k, m in sys.modules.items() if k.startswith("horovod.")
                           and m is not sys.modules.get("horo" + k[len("horovod"):]))
print("PROBE" + json.dumps(report))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    names = {m: spec["names"] for m, spec in MODULES.items()}
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(names), json.dumps(FAMILIES), str(SHIM),
                          json.dumps(sorted(NAMES)), json.dumps(sorted(PACKAGES))], env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert res.returncode == 0 and line, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads(line[len("PROBE"):])
    return {"shim": report, **report["modules"]}


def _missing(probe: dict) -> list[str]:
    return [f"{m}.{n}" for m, spec in MODULES.items() for n in spec["names"] if n not in probe[m]["present"]]


def _entries(probe: dict) -> dict[str, dict]:
    return {m: e for m, e in probe.items() if m != "shim"}


def test_every_missing_name_is_documented_as_not_provided(probe: dict) -> None:
    unexplained = [key for key in _missing(probe) if key not in NOT_PROVIDED and key not in PENDING]
    errors = {m: e["error"] for m, e in _entries(probe).items() if e["error"]}
    assert not unexplained, f"missing and not listed as not provided: {unexplained}; import errors: {errors}"


def test_at_least_95_percent_of_the_names_exist(probe: dict) -> None:
    total = sum(len(spec["names"]) for spec in MODULES.values())
    present = total - len(_missing(probe))
    planned = len([k for k in _missing(probe) if k in PENDING])
    print(f"{present} of {total} Horovod names exist under horo ({100 * present / total:.1f} %); "
          f"{planned} more are being built")
    assert present + planned >= 0.95 * total, (present, planned, total)


def test_the_lists_stay_true(probe: dict) -> None:
    """A name listed as not provided (or still to come) that exists must leave the list."""
    missing = set(_missing(probe))
    stale = [key for key in [*NOT_PROVIDED, *PENDING] if key not in missing]
    assert not stale, f"these exist now; remove them from not_provided/pending in horovod_names.json: {stale}"
    for key in [*NOT_PROVIDED, *PENDING]:
        module, name = key.rsplit(".", 1)
        assert name in MODULES[module]["names"], key


def test_each_name_is_the_facades_object(probe: dict) -> None:
    """horo.torch.mpi_ops.allreduce is horo.torch.allreduce, horo.common.exceptions.HorovodInternalError is
    horo.HorovodInternalError, ...: the module paths re-export, they do not implement again."""
    other = {m: e["other_object"] for m, e in _entries(probe).items() if e["other_object"]}
    assert not other, other


def test_the_migration_guide_lists_what_is_not_provided() -> None:
    text = GUIDE.read_text()
    for key in [*NOT_PROVIDED, *PACKAGES]:
        assert f"`{key}`" in text, f"docs/migrating.md does not name {key}"


def test_through_the_hook_horovods_paths_are_horos_modules_themselves(probe: dict) -> None:
    """``import horovod.torch as hvd`` gives ``horo.torch`` (no copy) for every module horo has; nothing named
    horovod is importable without the hook."""
    assert probe["shim"]["horovod_before_the_hook"] is False
    entries = _entries(probe)
    aliased = {m for m, e in entries.items() if e["error"] is None}
    for wanted in ("horovod.torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras", "horovod.ray",
                   "horovod.spark", "horovod.common.exceptions", "horovod.torch.elastic", "horovod.tensorflow.elastic"):
        assert wanted in aliased, (wanted, entries[wanted]["error"])
    not_same = {m: e["alias"] for m, e in entries.items() if m in aliased and e["alias"] is not True}
    assert not not_same, not_same
    assert probe["shim"]["aliases"] == [], f"copies of horo modules under Horovod's names: {probe['shim']['aliases']}"


def test_through_the_hook_what_horo_leaves_out_says_why(probe: dict) -> None:
    """``from horovod.ray import ElasticRayExecutor``, ``import horovod.mxnet``, ...: one line of ImportError that
    names the thing, says it is not provided and why, and ends with a HINT of what to use."""
    for key, error in probe["shim"]["refusals"].items():
        # A name inside a module horo leaves out (horovod.tensorflow.data.compute_service's) is refused as that
        # module is.
        named = next((p for p in PACKAGES if key.startswith(p + ".")), key)
        why = NAMES.get(named) or PACKAGES[named]
        assert error is not None, f"{key} imported"
        assert error.startswith(f"NotProvidedError: {named} is not provided by horo: "), error
        assert why in error and "HINT: " in why and "\n" not in error, error
