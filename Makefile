# Two commands matter: `make run` (serve the bundled sample over stdio) and `make test` (the whole suite).
# Each installs what it needs into .venv and no more: `make run`/`make demo` the package alone, `make test` its
# test extra, `make bench` the bench extra too. A stamp per install, so `make run` then `make test` adds the rest.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SAMPLE ?= sample-configs/quickstart.yaml
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench
# -q: no progress lines; the version check is a network call whose advice is not ours to give. pip's warnings stay
# (PIP_QUIET=-qq hides them too, e.g. a pip configuration naming index locations that do not exist). The build
# backend's UserWarning is setuptools' caution about folders named like the package: here that folder is the package.
PIP_QUIET ?= -q
PIP := PYTHONWARNINGS=ignore::UserWarning $(BIN)/python -m pip install $(PIP_QUIET) --disable-pip-version-check

.PHONY: run test test-quick test-random typecheck demo validate-samples bench bench-full bench-scale conformance image image-check clean

$(BIN)/python:  # a current pip: the one a venv starts with (23.2 on Python 3.11.7) gives up resolving the test extra
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) -e '.[test]'
	touch $@ $(RUN_STAMP)

$(BENCH_STAMP): pyproject.toml | $(BIN)/python
	$(PIP) -e '.[test,bench]'
	touch $@ $(TEST_STAMP) $(RUN_STAMP)

run: $(RUN_STAMP)  ## serve the bundled sample over stdio (connect an MCP client; logs go to stderr)
	@$(BIN)/aggregator validate $(SAMPLE) >&2
	@$(BIN)/aggregator serve $(SAMPLE)

demo: $(RUN_STAMP)  ## what an assistant sees: list and read the sample through the official MCP client
	$(BIN)/python -m aggregator.demo $(SAMPLE)

# The suite runs on parallel workers (pytest-xdist; tests/isolation.py keeps their ports and databases apart), each
# test to the first free worker (worksteal). Four workers on two cores: much of a test's time is spent waiting on
# the servers and processes it started, and two more workers keep both cores busy (docs/testing.md has figures).
# Bytecode is written whatever PYTHONDONTWRITEBYTECODE says: every `aggregator` process the suite starts (hundreds)
# would compile the package again, and each worker rewrite the tests' asserts again.
TEST_WORKERS ?= 4
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest
PARALLEL = -n $(TEST_WORKERS) --dist worksteal

test: $(TEST_STAMP)  ## the whole test suite, on parallel workers
	$(PYTEST) $(PARALLEL) $(PYTEST_ARGS)

test-quick: $(TEST_STAMP)  ## the inner loop: the suite less the tests marked slow (real balancers, replicas, browser)
	$(PYTEST) $(PARALLEL) -m "not slow" $(PYTEST_ARGS)

# Every worker shuffles with the same seed (xdist needs them to agree on the tests); a failure names it: rerun with
# `make test-random RANDOM_SEED=N`.
RANDOM_SEED ?= $(shell date +%s)

test-random: $(TEST_STAMP)  ## the whole suite on parallel workers in a random order: hunting order-dependent tests
	$(PYTEST) $(PARALLEL) --random-order-bucket=global --random-order-seed=$(RANDOM_SEED) $(PYTEST_ARGS)

typecheck: $(TEST_STAMP)  ## mypy over the package ([tool.mypy] in pyproject.toml); any error fails
	$(BIN)/python -m mypy

validate-samples: $(RUN_STAMP)
	@for m in sample-configs/*.yaml; do $(BIN)/aggregator validate --offline $$m || exit 1; done

FASTMCP := benchmarks/.venv-fastmcp/.installed

$(FASTMCP):  # the fastmcp peer lives in its own venv: it brings its own mcp
	$(PYTHON) -m venv benchmarks/.venv-fastmcp
	benchmarks/.venv-fastmcp/bin/python -m pip install $(PIP_QUIET) --disable-pip-version-check 'fastmcp>=2.12,<5'
	touch $@

bench: $(BENCH_STAMP) $(FASTMCP)  ## quick benchmarks against the named peers (under 5 min); rewrites docs/benchmarks.md and .png
	$(BIN)/python -m benchmarks.run --quick
	$(BIN)/python -m benchmarks.templates
	$(BIN)/python -m benchmarks.live --rounds 5
	$(BIN)/python -m benchmarks.remote --objects 2000 --skip-listing
	$(BIN)/python -m benchmarks.http_load --rounds 2 --seconds 2
	$(BIN)/python -m benchmarks.cold_reads --rounds 3 --reads 500 --modes auto
	$(BIN)/python -m benchmarks.replicas --seconds 2 --rounds 10

bench-full: $(BENCH_STAMP) $(FASTMCP)  ## every size up to 100,000 files, 3 runs each; live-reload, remote-source, replicas-on-Redis, reliability, search and console figures
	$(BIN)/python -m benchmarks.run --full
	$(BIN)/python -m benchmarks.templates --repeat 3 --reads 2000 --budget 8
	$(BIN)/python -m benchmarks.live --rounds 20
	$(BIN)/python -m benchmarks.remote --objects 100000
	$(BIN)/python -m benchmarks.http_load --rounds 5 --seconds 5
	$(BIN)/python -m benchmarks.cold_reads --rounds 5 --reads 2000
	$(BIN)/python -m benchmarks.replicas --seconds 5 --rounds 20
	$(BIN)/python -m benchmarks.cluster
	$(BIN)/python -m benchmarks.reliability
	$(BIN)/python -m benchmarks.search
	$(BIN)/python -m benchmarks.console

SCALE_SIZES ?= 10k,100k,1M
SCALE_ARGS ?=

# Files are made once per size under ~/.cache/aggregator-bench ($$AGGREGATOR_BENCH_CACHE): 4.5 GB and 1M inodes at 1M.
bench-scale: $(BENCH_STAMP)  ## aggregator beside a stdlib floor at 10k/100k/1M files: ready, listing, RSS, reads, live, churn (about 25 min, 1M most of it)
	$(BIN)/python -m benchmarks.scale --sizes $(SCALE_SIZES) $(SCALE_ARGS)

conformance: $(RUN_STAMP)  ## the official MCP conformance suite (Node 22 from npm) against `serve --http`, both wires
	PYTHON=$(BIN)/python .ci/conformance

image:  ## build deploy/Dockerfile with podman on a Debian bookworm base made here by mmdebstrap (no daemon, no registry)
	.ci/image build

image-check: image $(RUN_STAMP)  ## then check inside it: size, Python packages, validate, serve --http smoke on both wires
	PYTHON=$(BIN)/python .ci/image check

clean:
	rm -rf $(VENV) .venv-run .pytest_cache build *.egg-info
