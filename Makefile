# txn_offsets developer commands. On a fresh machine: `make demo`, `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
STACK_DIR ?= .stack
LAB_DIR ?= .lab
BIN := $(VENV)/bin
# exports the local stack's connection settings (written by `make stack-up`): TXN_OFFSETS_DATABASE_URL
# is the run role (what jobs run as), TXN_OFFSETS_OWNER_DATABASE_URL the database's owner
WITH_ENV := set -a; . $(STACK_DIR)/env; set +a;
# the benchmarks and chaos administer the store (schemas, tables, grants): they connect as its owner
# (the tests do so by themselves: tests/fix_services.py)
AS_OWNER := $(WITH_ENV) export TXN_OFFSETS_DATABASE_URL="$$TXN_OFFSETS_OWNER_DATABASE_URL";
PYTEST_ARGS ?=
DEMO_ARGS ?=
BENCH_ARGS ?=
# POOLER=pgbouncer: stack-up also starts PgBouncer (transaction pooling, pool of 2) in front of PostgreSQL
POOLER ?=
# TLS=1: stack-up also turns on PostgreSQL's ssl and a Kafka SASL_SSL listener (TXN_OFFSETS_TLS_* in the env file)
TLS ?=
# REPLICA=1: stack-up also starts a streaming replica (hot standby) of PostgreSQL (TXN_OFFSETS_HA_DATABASE_URL)
REPLICA ?=
# smoke (seconds, part of make test) | full (1e6 records per topic; long on 2 cores)
BENCH_SIZE ?= full
# e.g. CHAOS_ARGS="--scenarios F1,F3 --runs 10"; CHAOS_SEED / CHAOS_RUNS / CHAOS_MESSAGES in the environment
CHAOS_ARGS ?=
# make chaos's lab part (make chaos-lab CHAOS_ARGS=...), e.g. LAB_CHAOS_ARGS="--scenarios L1,L5"
LAB_CHAOS_ARGS ?=
LINT_PATHS := $(wildcard txn_offsets migrations setup.py tests examples benchmarks chaos)

.PHONY: help install dist stack-up stack-down stack-status lint test test-unit demo chaos bench clean job-env job-env-stream lab-up lab-down lab-status test-lab chaos-lab

help:
	@echo "make demo        bring the local stack up and run the demo job (DEMO_ARGS=--connect: on Spark Connect)"
	@echo "make test        install, bring the stack up, lint, run the tests (not the slow ones)"
	@echo "make dist        build the wheel and the sdist into dist/ (pip install dist/txn_offsets-*.whl)"
	@echo "make lint        ruff + mypy --strict"
	@echo "make stack-up    start PostgreSQL + Kafka on loopback (idempotent); settings in $(STACK_DIR)/env"
	@echo "                 POOLER=pgbouncer: and PgBouncer in front of PostgreSQL (TXN_OFFSETS_POOLED_DATABASE_URL)"
	@echo "                 TLS=1: PostgreSQL ssl on + a Kafka SASL_SSL listener (TXN_OFFSETS_TLS_* in the env file)"
	@echo "                 REPLICA=1: and a streaming replica beside it (multi-host TXN_OFFSETS_HA_DATABASE_URL)"
	@echo "make stack-down  stop exactly the processes stack-up started"
	@echo "make chaos       the full fault-injection suite (slow), then the lab's scenarios (root; LAB_CHAOS_ARGS for them)"
	@echo "make bench       txn_offsets vs Structured Streaming, at-least-once and the read/write limits (BENCH_SIZE=smoke|full)"
	@echo "make lab-up      (root) the lab: kafka-1..3, pg-1 + replica pg-2 + PgBouncer, Spark master + 2 workers, a driver,"
	@echo "                 each host a network namespace on 10.47.45.0/24; settings in $(LAB_DIR)/env (LAB_NODE_PYTHON: the workers' Python)"
	@echo "make lab-down    kill every lab process, remove its namespaces and names; fails naming anything left"
	@echo "make lab-status  each lab host and service: up or not"
	@echo "make test-lab    the tests that need the whole lab (pytest -m lab; they bring up and remove their own)"
	@echo "make chaos-lab   (root) the lab's chaos scenarios L1-L8 (CHAOS_ARGS=--scenarios L1,L3): the running lab, else one for the session"
	@echo "make job-env     dist/job-env.tar.gz: the packed environment spark-submit ships (LAB_NODE_PYTHON: the nodes' Python)"

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "txn_offsets needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	@# byte-compiled here, on every core (pip compiles one file after another: 73 s against 33 + 21 s):
	@# with PYTHONDONTWRITEBYTECODE set (as on the CI machine) a module not compiled here is compiled
	@# again by every process that imports it (each Spark Python worker, each CLI run: +250 s of make test)
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null || echo "compileall: some files did not compile (pip ignores those too)"
	@# Spark's Python workers import pyspark from its pyspark.zip, never from the package: bytecode
	@# beside its sources there too (txn_offsets/devstack/pyspark_bytecode.py; ~1 s of CPU per process)
	$(BIN)/python -m txn_offsets.devstack.pyspark_bytecode
	touch $@

install: $(BIN)/.installed
	@# the console's browser tests drive Debian's chromium through its chromedriver (never a download):
	@# installed here when running as root with apt-get and either is missing, as devstack installs PostgreSQL
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! { [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; }; then \
		echo "installing chromium and chromium-driver (the console's browser tests)"; \
		apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		{ apt-get update -q >/dev/null && apt-get install -y -q chromium chromium-driver >/dev/null; }; fi

# what a user installs into a virtualenv of their own (README: Install): the wheel and the sdist
dist: install
	rm -rf dist
	$(BIN)/python -m build --outdir dist .

# the packed job environment for spark-submit --archives (docs/operations.md#the-packed-job-environment):
# rebuilt only when the wheel's sources or the node Python ($LAB_NODE_PYTHON, default /usr/bin/python3) changed
job-env: install
	$(BIN)/python -m txn_offsets.devstack.lab.jobenv --out dist/job-env.tar.gz

# the same with pyarrow, which open_stream's source needs on the nodes (the lab's stream scenario, L6)
job-env-stream: install
	$(BIN)/python -m txn_offsets.devstack.lab.jobenv --out dist/job-env-stream.tar.gz --with pyarrow

# the lab (docs/operations.md#the-lab): root, its own namespaces (txo-*) and files ($(LAB_DIR), rebuilt by lab-up)
lab-up: install
	$(BIN)/python -m txn_offsets.devstack.lab up --lab-dir $(LAB_DIR)

lab-down:
	@if [ -x $(BIN)/python ]; then $(BIN)/python -m txn_offsets.devstack.lab down --lab-dir $(LAB_DIR); \
	elif ip netns list 2>/dev/null | grep -q '^txo-'; then echo "lab namespaces exist but $(BIN)/python is missing: run make install, then make lab-down"; exit 1; \
	else echo "lab down: nothing to remove"; fi

lab-status: install
	$(BIN)/python -m txn_offsets.devstack.lab status --lab-dir $(LAB_DIR)

test-lab: install
	$(BIN)/pytest -m lab -s tests/lab tests/integration/devstack/test_jobenv_build.py tests/integration/devstack/test_jobenv_submit.py $(PYTEST_ARGS)

stack-up: install
	$(BIN)/txn-offsets dev up --stack-dir $(STACK_DIR) $(if $(POOLER),--pooler $(POOLER)) $(if $(TLS),--tls) $(if $(REPLICA),--replica)

stack-down:
	@if [ -x $(BIN)/txn-offsets ]; then $(BIN)/txn-offsets dev down --stack-dir $(STACK_DIR); else echo "nothing to stop"; fi

stack-status: install
	$(BIN)/txn-offsets dev status --stack-dir $(STACK_DIR)

lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

# the tests run once through PgBouncer too (tests/integration/store/test_pgbouncer.py): POOLER=pgbouncer;
# and over TLS + SASL_SSL (tests/integration/test_tls_sasl.py): TLS=1
# two workers, a test file at a time, the files that take minutes handed out first (tests/conftest.py);
# TEST_WORKERS= runs them all in this process
TEST_WORKERS ?= -n 2 --dist loadfile --no-loadscope-reorder
# lint and the stack's start run side by side (Kafka's JVM and initdb wait on their disks while
# mypy works); either failing fails the target
test: install
	@# beside lint and the stack's start: the Spark JVMs' class-data archive, once (tests/jvm_archive.py)
	$(MAKE) stack-up POOLER=pgbouncer TLS=1 & up=$$!; $(BIN)/python -m tests.jvm_archive & cds=$$!; \
		lint=0; $(MAKE) lint || lint=$$?; wait $$up || exit $$?; wait $$cds || exit $$?; exit $$lint
	$(WITH_ENV) $(BIN)/pytest -m "not slow and not lab" --durations=40 $(TEST_WORKERS) $(PYTEST_ARGS)

test-unit: install
	$(BIN)/pytest -m unit $(PYTEST_ARGS)

demo: install stack-up
	$(WITH_ENV) $(BIN)/python -m examples.demo $(DEMO_ARGS)

chaos: install stack-up
	$(AS_OWNER) $(BIN)/python -m chaos $(CHAOS_ARGS)
	$(WITH_ENV) $(BIN)/pytest tests/integration/commit/test_commit_model.py -m slow -q
	$(MAKE) --no-print-directory chaos-lab CHAOS_ARGS="$(LAB_CHAOS_ARGS)"

# the lab's scenarios (docs/reliability.md#on-the-lab): the running lab, else one up for the session and down after
chaos-lab: install job-env job-env-stream
	$(BIN)/python -m chaos --lab $(CHAOS_ARGS)

bench: install stack-up
	$(AS_OWNER) BENCH_SIZE=$(BENCH_SIZE) $(BIN)/python -m benchmarks.bench $(BENCH_ARGS)

clean: stack-down lab-down
	rm -rf $(STACK_DIR) $(LAB_DIR) $(VENV) dist .pytest_cache .mypy_cache .ruff_cache .hypothesis
