# The two commands the README leads with: `make demo` and `make test`.
# Each creates .venv, installs the project into it, then runs. Needs only Python >= 3.10 and make.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
# `make demo` adds the CUDA libraries when the NVIDIA driver sees a GPU.
CUDA   := $(shell nvidia-smi -L >/dev/null 2>&1 && echo ,and-cuda)

.PHONY: demo test test-fast coverage lint env clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.dev: $(BIN)/python setup.cfg pyproject.toml
	$(BIN)/python -m pip install -q -e ".[dev$(CUDA)]"
	touch $@

demo: $(VENV)/.dev
	$(BIN)/tfgpu env
	$(BIN)/tfgpu demo $(ARGS)

# Four workers (pytest-xdist), each test file on one of them: the subprocess, multi-worker and
# time-budgeted tests wait much of the time (on a 2-core Intel Xeon, pytest alone: two workers
# 642 s, three 574-618 s, four 539 s); the longest files go first (tests/conftest.py). The
# whole suite also measures which lines and branches of tfgpu/ ran (in this process and the
# workers, not in the subprocesses tests start) and fails under the floor; a run narrowed
# with ARGS is not held to it.
SUITE := $(BIN)/python -m pytest -n 4 --dist loadfile --no-loadscope-reorder
COV   := --cov=tfgpu --cov-branch
FLOOR := $(if $(ARGS),,--cov-fail-under=90)
test: $(VENV)/.dev
	$(SUITE) --durations=15 $(COV) --cov-report= $(FLOOR) $(ARGS)

# The same, with the figure of each module and its missed lines.
coverage: $(VENV)/.dev
	$(SUITE) $(COV) --cov-report=term-missing:skip-covered $(FLOOR) $(ARGS)

# The edit-test loop: every test not marked `slow` (no subprocesses, no multi-second training).
test-fast: $(VENV)/.dev
	$(BIN)/python -m pytest -m "not slow and not gpu" -q $(ARGS)

lint: $(VENV)/.dev
	$(BIN)/ruff check tfgpu tests examples benchmarks
	$(BIN)/ruff format --check tfgpu tests examples benchmarks
	$(BIN)/mypy

env: $(VENV)/.dev
	$(BIN)/tfgpu env

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .coverage .coverage.*
