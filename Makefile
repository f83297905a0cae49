# The two commands a new user needs: `make run` (set up and start everything) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp

.PHONY: install run test test-fast lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(STAMP) $(NODE_STAMP)

run: install
	$(BIN)/agentpost up

test: install
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "unit"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

bench: install
	bash bench/run.sh

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache
