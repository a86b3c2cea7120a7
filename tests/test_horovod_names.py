"""Every user-facing module and name of Horovod 0.28.1 exists under horo by the same path (horovod.X -> horo.X).

The list is data, ``tests/data/horovod_names.json``, read from Horovod's sources and ``docs/api.rst``: each
module's names, the names horo does not provide with the reason, and whole packages horo leaves out. One child
process imports every module (torch, TensorFlow and Keras included: the pytest process stays free of them) and
reports which names exist and whether each is the very object its facade exports (one implementation, many
paths). The migration guide, docs/migrating.md, lists every name not provided.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = json.loads((REPO / "tests" / "data" / "horovod_names.json").read_text())
MODULES: dict[str, dict] = DATA["modules"]
NOT_PROVIDED: dict[str, str] = DATA["not_provided"]
PENDING: dict[str, str] = DATA["pending"]
GUIDE = REPO / "docs" / "migrating.md"

#: The facade each Horovod family's names come from, in horo.
FAMILIES = [("horovod.tensorflow.keras", "horo.keras"), ("horovod.keras", "horo.keras"),
            ("horovod.tensorflow", "horo.tensorflow"), ("horovod.torch", "horo.torch"), ("horovod.common", "horo"),
            ("horovod.ray", "horo.ray"), ("horovod.spark", "horo.spark")]

PROBE = r"""
import importlib, json, sys, types
modules, families = json.loads(sys.argv[1]), json.loads(sys.argv[2])
report = {}
for horovod_name, names in modules.items():
    path = "horo" + horovod_name[len("horovod"):]
    entry = report[horovod_name] = {"path": path, "error": None, "present": [], "other_object": []}
    try:
        mod = importlib.import_module(path)
    except Exception as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
        continue
    facade = importlib.import_module(next(f for h, f in families if horovod_name.startswith(h)))
    for name in names:
        if not hasattr(mod, name):
            continue
        entry["present"].append(name)
        value = getattr(mod, name)
        if mod is not facade and hasattr(facade, name) and not isinstance(value, types.ModuleType):
            if getattr(facade, name) is not value:
                entry["other_object"].append(name)
print("PROBE" + json.dumps(report))
"""


@pytest.fixture(scope="module")
def probe() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    names = {m: spec["names"] for m, spec in MODULES.items()}
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(names), json.dumps(FAMILIES)], env=env,
                         capture_output=True, text=True, timeout=240, check=False)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("PROBE")), None)
    assert res.returncode == 0 and line, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads(line[len("PROBE"):])


def _missing(probe: dict) -> list[str]:
    return [f"{m}.{n}" for m, spec in MODULES.items() for n in spec["names"] if n not in probe[m]["present"]]


def test_every_missing_name_is_documented_as_not_provided(probe: dict) -> None:
    unexplained = [key for key in _missing(probe) if key not in NOT_PROVIDED and key not in PENDING]
    errors = {m: e["error"] for m, e in probe.items() if e["error"]}
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
    other = {m: e["other_object"] for m, e in probe.items() if e["other_object"]}
    assert not other, other


def test_the_migration_guide_lists_what_is_not_provided() -> None:
    text = GUIDE.read_text()
    for key in [*NOT_PROVIDED, *DATA["packages_not_provided"]]:
        assert f"`{key}`" in text, f"docs/migrating.md does not name {key}"
