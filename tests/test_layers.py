"""The core in layers: the layers contract, no import circle, and horo modules imported at module level.

* ``lint-imports`` (import-linter, the ``test`` extra) checks pyproject.toml's contracts: inside ``horo.core``
  the layers api > scheduling > transport > base import only downward, counting imports inside functions,
  and the core imports neither a facade of horo nor a deep-learning framework (docs/design-engine.md).
* ``tools/import_graph.py`` finds no cycle in ``src/horo``'s import graph, with or without the imports inside
  functions (a module that reads names back from its own package is in a circle with it), and no
  function-level import of a horo module except the commented lazy ones of modules that load a heavy optional
  dependency.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_graph  # noqa: E402 - from tools/, put on the path above

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


def test_the_layers_contract_holds() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("import-linter is not installed (pip install 'horo-mpi[test]')")
    res = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout, res.stdout


@pytest.mark.parametrize("module_level", [False, True], ids=["every-import", "module-level"])
def test_the_import_graph_has_no_cycle(module_level: bool) -> None:
    edges = import_graph.graph(ROOT / "src", module_level=module_level)
    assert "horo.core.scheduling.engine.engine" in edges and "horo.elastic.runner" in edges
    assert import_graph.cycles(edges) == []


def test_horo_modules_are_imported_at_module_level_unless_heavy_and_commented() -> None:
    assert import_graph.rule_breaks(ROOT / "src") == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The cycle finder and the rule, on a made-up package: a circle through a function, an uncommented lazy
    import of a light module, a commented one of a heavy module."""
    pkg = tmp_path / "horo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n")
    (pkg / "heavy.py").write_text("import torch\n")
    (pkg / "c.py").write_text("def g():\n    from . import heavy  # lazy: imports torch\n")
    (pkg / "d.py").write_text("def h():\n    from . import heavy\n")
    every = import_graph.graph(tmp_path)
    assert import_graph.cycles(every) == [["horo.a", "horo.b"]]
    assert import_graph.cycles(import_graph.graph(tmp_path, module_level=True)) == []
    breaks = import_graph.rule_breaks(tmp_path)
    assert len(breaks) == 2, breaks
    assert any("b.py:2" in b and "module level" in b for b in breaks), breaks
    assert any("d.py:2" in b and "# lazy:" in b for b in breaks), breaks


def test_the_script_prints_the_graph() -> None:
    res = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py")], capture_output=True, text=True,
                         timeout=120)
    assert "horo.core.api.collectives -> " in res.stdout
    assert "no cycle (all imports" in res.stdout and "no cycle (module-level imports)" in res.stdout, res.stdout
    assert res.returncode == 0, res.stdout[-4000:]


def test_a_module_reading_its_package_back_is_a_cycle(tmp_path: Path) -> None:
    """``from . import Name`` in a module its package imports is a circle (counted inside a function too);
    ``from . import submodule`` is an edge to the submodule alone."""
    pkg = tmp_path / "horo" / "facade"
    pkg.mkdir(parents=True)
    (tmp_path / "horo" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .ops import op\nfrom . import names, lazy, plain\nValue = 1\n")
    (pkg / "ops.py").write_text("def op():\n    pass\n")
    (pkg / "names.py").write_text("from . import Value\n")
    (pkg / "lazy.py").write_text("def f():\n    from .. import facade  # lazy: reads the package on first use\n")
    (pkg / "plain.py").write_text("from . import ops\n")
    every = import_graph.graph(tmp_path)
    assert every["horo.facade.plain"] == {"horo.facade.ops"}
    assert import_graph.cycles(every) == [["horo.facade", "horo.facade.lazy", "horo.facade.names"]]
    assert import_graph.cycles(import_graph.graph(tmp_path, module_level=True)) == [["horo.facade",
                                                                                      "horo.facade.names"]]
