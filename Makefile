# Two commands matter: `make run` (serve the bundled sample over stdio) and `make test` (the whole suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SAMPLE ?= sample-configs/quickstart.yaml

.PHONY: run test demo validate-samples bench bench-full conformance clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

run: $(STAMP)  ## serve the bundled sample over stdio (connect an MCP client; logs go to stderr)
	$(BIN)/aggregator validate $(SAMPLE)
	$(BIN)/aggregator serve $(SAMPLE)

demo: $(STAMP)  ## what an assistant sees: list and read the sample through the official MCP client
	$(BIN)/python -m aggregator.demo $(SAMPLE)

test: $(STAMP)  ## the whole test suite
	$(BIN)/python -m pytest $(PYTEST_ARGS)

validate-samples: $(STAMP)
	@for m in sample-configs/*.yaml; do $(BIN)/aggregator validate --offline $$m || exit 1; done

FASTMCP := benchmarks/.venv-fastmcp/.installed

$(FASTMCP):  # the fastmcp peer lives in its own venv: it brings its own mcp
	$(PYTHON) -m venv benchmarks/.venv-fastmcp
	benchmarks/.venv-fastmcp/bin/python -m pip install --quiet 'fastmcp>=2.12,<5'
	touch $@

bench: $(STAMP) $(FASTMCP)  ## quick benchmarks against the named peers (under 5 min); rewrites docs/benchmarks.md and .png
	$(BIN)/python -m benchmarks.run --quick
	$(BIN)/python -m benchmarks.templates
	$(BIN)/python -m benchmarks.live --rounds 5
	$(BIN)/python -m benchmarks.remote --objects 2000 --skip-listing
	$(BIN)/python -m benchmarks.http_load --rounds 2 --seconds 2

bench-full: $(STAMP) $(FASTMCP)  ## every size up to 100,000 files, 3 runs each; live-reload, remote-source and reliability figures
	$(BIN)/python -m benchmarks.run --full
	$(BIN)/python -m benchmarks.templates --repeat 3 --reads 2000 --budget 8
	$(BIN)/python -m benchmarks.live --rounds 20
	$(BIN)/python -m benchmarks.remote --objects 100000
	$(BIN)/python -m benchmarks.http_load --rounds 5 --seconds 5
	$(BIN)/python -m benchmarks.reliability

conformance: $(STAMP)  ## the official MCP conformance suite (Node 22 from npm) against `serve --http`, both wires
	PYTHON=$(BIN)/python .ci/conformance

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
