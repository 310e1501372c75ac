# One entry point for everything: `make test` on a fresh machine creates .venv here,
# installs the pinned dependencies into it, and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
SAGA   := .venv-saga

.PHONY: setup run demo test lint format bench bench-schedule clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt tools/horovod.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	tools/horovod.sh $(VENV)
	touch $@

# The main job for now: digits trained on 2 ranks (MPI), test accuracy printed.
# (The Airflow pipeline that will run it comes with the operators.)
run: setup
	$(BIN)/python -m dagtrain.training --ranks 2 --backend mpi --epochs 3 --quiet

# The executor alone: a simulated training step replayed, with a Perfetto trace.
demo: setup
	$(BIN)/python -m dagtrain.taskgraph

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .

# Executor overhead, METG, the 1M-task run and makespans vs the lower bound.
bench: setup
	$(BIN)/python benchmarks/taskgraph_overhead.py

# Static schedules vs the anrg-saga package's HEFT and CPoP, in a venv of its own
# (saga and its dependencies weigh about 800 MB; they never enter the project's venv).
$(SAGA)/.installed: benchmarks/saga-constraints.txt
	$(PYTHON) -m venv $(SAGA)
	$(SAGA)/bin/python -m pip install --quiet --disable-pip-version-check -r benchmarks/saga-constraints.txt
	touch $@

bench-schedule: $(SAGA)/.installed
	PYTHONPATH=$(CURDIR) $(SAGA)/bin/python benchmarks/schedule_vs_saga.py

clean:
	rm -rf $(VENV) $(SAGA) .pytest_cache .ruff_cache .hypothesis
