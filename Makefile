# One entry point for everything: `make test` on a fresh machine creates .venv here,
# installs the pinned dependencies into it, and runs the tests.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# Python caches compiled modules (__pycache__/, ignored by git) whatever the shell says:
# each rank, task and command is a new interpreter, and without the cache every one of
# the suite's thousand or so compiles dagtrain's modules (and the tests') again
unexport PYTHONDONTWRITEBYTECODE
VENV   := .venv
BIN    := $(VENV)/bin
SAGA   := .venv-saga

.PHONY: setup horovod browser multihost-setup multihost run up ui demo test test-durations lint format bench bench-parse bench-schedule compose clean

setup: $(VENV)/.installed

# pip installs uv (pinned), uv the project: the same pins, resolved and installed in
# seconds where pip takes minutes. uv does not read pip's configuration, so the
# machine's pip find-links (here the CPU build of torch on disk) and index (a mirror)
# are handed to it.
PIP_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
PIP_INDEX = $(or $(PIP_INDEX_URL),$(shell $(PYTHON) -m pip config get global.index-url 2>/dev/null))
UV_FROM = $(addprefix --find-links ,$(PIP_LINKS)) $(addprefix --index-url ,$(PIP_INDEX))
UV_PIP = VIRTUAL_ENV=$(abspath $(VENV)) $(BIN)/uv pip install --quiet -c constraints.txt $(UV_FROM)

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(UV_PIP) -e '.[dev]'
	touch $@

# Horovod 0.28.1 from source (about 10 minutes once per machine; the wheel is cached in
# ~/.cache/dagtrain/wheels). The tests need it; the main job's default backend (MPI)
# does not, and a config that asks for horovod builds it on first use.
horovod: $(VENV)/.horovod

$(VENV)/.horovod: $(VENV)/.installed tools/horovod.sh
	tools/horovod.sh $(VENV) $(UV_FROM)
	touch $@

# The main job: the digits pipeline through Airflow (embedded, SQLite under .dagtrain/):
# prepare_data -> train (2 MPI ranks) -> evaluate -> promote; prints the test accuracy.
run: setup
	$(BIN)/dagtrain run dags/digits_retraining.yaml

# Airflow's api-server, scheduler, dag-processor and triggerer on this project's DAGs;
# prints the web UI's address and login (`ui` is the same).
up ui: setup
	$(BIN)/dagtrain up

# Airflow with the CeleryExecutor in Docker: PostgreSQL, Redis, api-server, scheduler,
# dag-processor, triggerer and two Celery workers, the image of docker/Dockerfile (built
# on first use). Needs Docker with Compose v2; see docs/deployment.md.
compose:
	docker compose -f docker/docker-compose.yaml up

# The executor alone: a simulated training step replayed, with a Perfetto trace.
demo: setup
	$(BIN)/python -m dagtrain.taskgraph

# Headless Chromium from Debian's packages for the browser test of the training page
# (playwright drives it; it never downloads a browser of its own). Where apt cannot
# install it, the browser test is skipped and says why.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
	  || echo "no chromium here: the browser test will be skipped"

# What tests/multihost needs from the machine (PostgreSQL, redis-server, ip netns),
# from Debian's packages; as root. Elsewhere the multi-host tests skip, saying why.
multihost-setup:
	tools/multihost-setup.sh

# Airflow on PostgreSQL + Redis with two Celery workers on network-namespace "hosts"
# (and a third host for ranks only), the training ranks spanning them (mpirun and
# torchrun), an elastic run losing and taking back a host; a few minutes.
multihost: setup multihost-setup
	$(BIN)/python -m pytest -q -m multihost tests/multihost

# The tests in two pytest runs: first every test not marked `alone`, on TEST_WORKERS
# pytest-xdist processes (the tests of a module that share a fixture stay on one: their
# xdist_group, see tests/conftest.py), then those marked `alone` (collective deadlines,
# faults timed against progress, benchmark smoke runs), one at a time with nothing
# beside them. Two workers: in clean-clone runs on this 2-core machine they took the
# shared run from 1694 s (one worker) to 1140 s of pytest (see tests/README.md). Each
# run writes a JUnit report to TEST_REPORTS; the end of the output is the slowest
# tests, each folder's time and one closing line for both.
TEST_WORKERS ?= 2
TEST_REPORTS := .dagtrain/test-reports

test: setup horovod browser multihost-setup
	@rm -rf $(TEST_REPORTS) && mkdir -p $(TEST_REPORTS)
	@status=0; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not alone" \
	  --junitxml=$(TEST_REPORTS)/shared.xml || status=$$?; \
	$(BIN)/python -m pytest -q -m alone \
	  --junitxml=$(TEST_REPORTS)/alone.xml || status=$$?; \
	$(BIN)/python tools/test_durations.py $(TEST_REPORTS)/shared.xml $(TEST_REPORTS)/alone.xml \
	  --slowest 15 || status=$$?; \
	exit $$status

# tests/README.md's generated part (each folder's time, the 30 slowest tests, every
# test by folder) from the reports of the last `make test`
test-durations:
	$(BIN)/python tools/test_durations.py $(TEST_REPORTS)/shared.xml $(TEST_REPORTS)/alone.xml \
	  --readme tests/README.md

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff check --fix .

# Executor overhead, METG, the 1M-task run and makespans vs the lower bound.
bench: setup
	$(BIN)/python benchmarks/taskgraph_overhead.py
	$(BIN)/python benchmarks/dag_parse.py

# How long Airflow takes to parse each example DAG file, against an empty DAG's.
bench-parse: setup
	$(BIN)/python benchmarks/dag_parse.py

# Static schedules vs the anrg-saga package's HEFT and CPoP, in a venv of its own
# (saga and its dependencies weigh about 800 MB; they never enter the project's venv).
$(SAGA)/.installed: benchmarks/saga-constraints.txt
	$(PYTHON) -m venv $(SAGA)
	$(SAGA)/bin/python -m pip install --quiet --disable-pip-version-check -r benchmarks/saga-constraints.txt
	touch $@

bench-schedule: $(SAGA)/.installed
	PYTHONPATH=$(CURDIR) $(SAGA)/bin/python benchmarks/schedule_vs_saga.py

clean:
	rm -rf $(VENV) $(SAGA) .pytest_cache .ruff_cache .hypothesis .dagtrain
