"""docs/support.md, the one support matrix, checked against the tests it names.

Every test the page names exists, with the case it names (collected by tests/static_ids.py: the test files are
parsed, never imported or run). Every cell of its tables names a test or says that none backs it; a cell that
names tests says where they ran (ranks, hosts, nodes, workers, processes or the GPU); a cell naming a case
marked ``slow`` says so, and one naming a GPU check says whether it ran on a GPU. The README and the home page
link to the matrix and hold no status table of their own, and the matrix keeps a row for each thing users ask
about.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from static_ids import collect

ROOT = Path(__file__).resolve().parent.parent
SUPPORT = ROOT / "docs" / "support.md"

#: A test named in the docs: `tests/FILE.py::TEST`, `tests/FILE.py::Class::TEST`, with an optional `[CASE]`
#: (a pattern: `[*]` is every case).
REF = re.compile(r"`(tests/[^`:\s]+\.py)::([A-Za-z_]\w*(?:::[A-Za-z_]\w*)?)(?:\[([^\]`]+)\])?`")
#: What a cell that names no test says instead.
NO_TEST = ("no test", "not supported", "not applicable")
#: Where a cell's tests ran.
WHERE = re.compile(r"\b(?:ranks?|hosts?|nodes?|workers?|process(?:es)?|H100)\b")
#: A cell naming a GPU check says whether it ran on the GPU.
GPU_RUN = ("H100", "not run on a GPU")
#: Rows the matrix keeps (first cells, in part).
ROWS = ("`horo`", "Keras 3 on TensorFlow", "Keras 3 on torch", "Keras 3 on JAX", "Keras 2", "`horo.tensorflow`",
        "`horo.torch`", "`torch.distributed`", "Lightning `Trainer", "Lightning `Fabric", "`horo.jax`", "`hororun`",
        "`mpiexec", "SLURM: `hororun`", "SLURM: `srun", "`torchrun`", "Ray `RayExecutor`", "Ray `HoroTrainer`",
        "Spark `horo.spark.run`", "Spark `horo.spark.run_elastic`", "Kubernetes", "Open MPI", "MPICH",
        "a site's own MPI", "Adasum", "mismatched calls", "hierarchical")


def _cells(line: str) -> list[str]:
    """The cells of a table row, split at pipes outside code spans."""
    cells, cell, in_code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return [*cells, cell.strip()]


def _rows(text: str) -> list[tuple[list[str], list[str]]]:
    """(header, cells) of every body row of every table."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
        elif not all(set(c) <= set("-: ") for c in cells):
            rows.append((header, cells))
    return rows


def _matrix() -> list[tuple[str, str, str]]:
    """(row, column, cell) for every cell of the support matrix but the rows' labels."""
    return [(cells[0], header[i], cell) for header, cells in _rows(SUPPORT.read_text(encoding="utf-8"))
            for i, cell in enumerate(cells) if i]


_collected: dict[Path, dict] = {}


def _cases(path: Path, name: str):
    if path not in _collected:
        _collected[path] = collect(path)
    return _collected[path].get(name, "missing")


def _problems_of(ref: re.Match[str]) -> list[str]:
    file, name, case = ref.groups()
    path = ROOT / file
    if not path.is_file():
        return [f"{ref.group(0)}: no file {file}"]
    cases = _cases(path, name)
    if cases == "missing":
        return [f"{ref.group(0)}: {file} has no test {name}"]
    if case is None:
        return []
    if cases is None:
        return [f"{ref.group(0)}: the cases of {name} cannot be worked out from {file} alone. HINT: name the "
                f"test without a case"]
    if not any(fnmatch.fnmatchcase(c.id, case) for c in cases):
        return [f"{ref.group(0)}: {name} has no case {case!r}; its cases: {[c.id for c in cases]}"]
    return []


def _slow_only(ref: re.Match[str]) -> bool:
    file, name, case = ref.groups()
    cases = _cases(ROOT / file, name)
    if not isinstance(cases, list):
        return False
    chosen = [c for c in cases if case is None or fnmatch.fnmatchcase(c.id, case)]
    return bool(chosen) and all(c.slow for c in chosen)


def test_every_named_test_exists() -> None:
    text = SUPPORT.read_text(encoding="utf-8")
    refs = list(REF.finditer(text))
    assert len(refs) > 50, "the support matrix names almost no test"
    problems = [p for ref in refs for p in _problems_of(ref)]
    spans = re.findall(r"`(tests/[^`]*::[^`]*)`", text)
    problems += [f"`{s}`: not a test name this check reads (tests/FILE.py::TEST[CASE])" for s in spans
                 if not REF.fullmatch(f"`{s}`")]
    assert not problems, "docs/support.md names tests that do not exist:\n" + "\n".join(problems)


def test_every_cell_names_a_test_or_says_none_does() -> None:
    bare = [f"{row} / {column}: {cell!r}" for row, column, cell in _matrix()
            if not REF.search(cell) and not any(w in cell for w in NO_TEST)]
    assert not bare, "cells that name no test and do not say 'no test' (or why there is none):\n" + "\n".join(bare)


def test_a_cell_says_where_its_tests_ran() -> None:
    vague = [f"{row} / {column}" for row, column, cell in _matrix() if REF.search(cell) and not WHERE.search(cell)]
    assert not vague, "cells that name tests but not where they ran (ranks, hosts, GPUs):\n" + "\n".join(vague)


def test_a_cell_naming_a_slow_case_says_so() -> None:
    unsaid = [f"{row} / {column}: {ref.group(0)}" for row, column, cell in _matrix()
              for ref in REF.finditer(cell) if _slow_only(ref) and "slow" not in cell]
    assert not unsaid, "cells naming cases only `make test-slow` runs, without saying so:\n" + "\n".join(unsaid)


def test_a_cell_naming_a_gpu_check_says_whether_it_ran_on_a_gpu() -> None:
    unsaid = [f"{row} / {column}" for row, column, cell in _matrix()
              if "`tests/gpu/" in cell and not any(w in cell for w in GPU_RUN)]
    assert not unsaid, f"cells naming GPU checks without saying {' or '.join(GPU_RUN)}:\n" + "\n".join(unsaid)


def test_the_matrix_keeps_its_rows_and_columns() -> None:
    text = SUPPORT.read_text(encoding="utf-8")
    labels = {cells[0] for _, cells in _rows(text)}
    missing = [r for r in ROWS if not any(label.startswith(r) for label in labels)]
    assert not missing, f"rows missing from docs/support.md: {missing}"
    columns = {c for header, _ in _rows(text) for c in header}
    assert {"CPU, one host", "CPU, several hosts", "GPU", "elastic"} <= columns, columns


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_front_pages_link_to_the_matrix_and_copy_no_status(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    assert re.search(r"\]\((?:docs/)?support\.md[#)]", text), f"{page} does not link to the support matrix"
    status = [" | ".join(cells) for _, cells in _rows(text)
              if re.search(r"\b(?:tested|not run|not supported|by hand|H100)\b", " ".join(cells))]
    assert not status, f"{page} holds a status table; link to docs/support.md instead:\n" + "\n".join(status)


def test_the_gpu_run_is_the_one_the_benchmarks_record() -> None:
    """The date, commit and result of the GPU run the matrix states are those of docs/benchmarks.md's GPU run."""
    said = re.search(r"\*\*GPU\*\*:.*?(20\d\d-\d\d-\d\d), commit ([0-9a-f]{7}); (\d+ passed, \d+ skipped)",
                     SUPPORT.read_text(encoding="utf-8"), re.DOTALL)
    assert said, "docs/support.md does not say when the GPU checks ran, at which commit, with what result"
    bench = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = bench.split("## The GPU path's host time per call", 1)[1].split("\n## ", 1)[0]
    assert f"| {said.group(1)} | {said.group(2)} |" in section, "docs/benchmarks.md records another GPU run"
    assert f"`pytest tests/gpu` in the same run: {said.group(3)}" in section, section[-400:]


SYNTHETIC = '''
import pytest

CASES = [pytest.param("a", 2, id="a-2"), pytest.param("b", 3, marks=pytest.mark.slow)]
pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

@pytest.mark.parametrize("limit", [5.0, pytest.param(20.0, marks=[pytest.mark.slow])], ids=["5s", "20s"])
@pytest.mark.parametrize("layout, cut", [("x", "y"), ("z", "w")], ids=["login", "other"])
def test_stacked(limit, layout, cut): pass

@pytest.mark.parametrize("n", [1, 2], ids=lambda n: f"np{n}")
def test_callable_ids(n): pass

@pytest.mark.parametrize("value", [{"k": 1}, "s", 2.5, None, True, 3])
def test_default_ids(value): pass

@pytest.mark.parametrize(("name", "n"), CASES)
def test_module_constant(name, n): pass

JOBS = [(n, b) for b in ("tf", "torch") for n in (1, 2)]

@pytest.mark.parametrize("n,b", JOBS, ids=[f"{b}-np{n}" for n, b in JOBS])
def test_comprehension_ids(n, b): pass

@pytest.mark.slow
def test_plain(): pass

class TestGroup:
    @pytest.mark.parametrize("x", [1, 2])
    def test_method(self, x): pass
'''


def test_static_ids_are_pytests_own(tmp_path: Path) -> None:
    """The static collection gives the ids and `slow` marks pytest's own collection gives."""
    path = tmp_path / "test_synthetic.py"
    path.write_text(SYNTHETIC)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # a caller's -v would change the listing
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n    timeout: timeout\n")
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    theirs = sorted(ln.split("::", 1)[1] for ln in listed.stdout.splitlines() if "::" in ln)
    ours = collect(path)
    assert sorted(f"{name}[{c.id}]" if c.id else name for name, cases in ours.items() for c in cases or []) \
        == theirs, listed.stdout
    slow = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", "slow", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    theirs_slow = sorted(ln.split("::", 1)[1] for ln in slow.stdout.splitlines() if "::" in ln)
    assert sorted(f"{name}[{c.id}]" if c.id else name for name, cases in ours.items() for c in cases or []
                  if c.slow) == theirs_slow, slow.stdout
