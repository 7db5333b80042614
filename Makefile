# Two commands matter: `make run` (serve the bundled sample over stdio) and `make test` (the whole suite).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SAMPLE ?= sample-configs/quickstart.yaml

.PHONY: run test demo validate-samples bench clean

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

bench: $(STAMP)  ## quick benchmark against the protocol floor; rewrites docs/benchmarks.md
	$(BIN)/python -m benchmarks.run --quick

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
