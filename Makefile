# Everything runs from a fresh clone with only python3: the venv is created and filled on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.horo-installed
EXTRAS ?= keras,lightning,test
NP     ?= 2
export OMP_NUM_THREADS ?= 1

.PHONY: install test test-fast demo bench lint clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -q -e '.[$(EXTRAS)]' ruff 2>&1 | grep -v "is ignored: it is neither" || true
	@$(PY) -c "import horo, mpi4py" && touch $(STAMP)

install: $(STAMP)

# The suite runs up to 3 ranks on 2 cores: let MPICH yield the core instead of busy-polling.
test: export MPIR_CVAR_ENABLE_HEAVY_YIELD ?= 1
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: $(STAMP)
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/collectives_demo.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/keras_fit.py
	$(VENV)/bin/hororun -np $(NP) $(PY) examples/lightning_fit.py

bench: $(STAMP)
	$(VENV)/bin/hororun -np 2 $(PY) -m horo.bench allreduce

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
