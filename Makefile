# The two commands a new user needs: `make run` (set up and start everything) and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
NODE_STAMP := node_modules/.installed-stamp

.PHONY: install run test test-fast lint typecheck bench clean

# One line per step instead of library noise: pip and npm print only errors (npm's summary on stdout is
# dropped, and so is its "new version of npm available" notice, which is about the user's npm, not this
# project), and warnings Python tools print while building the editable install (setuptools' build
# backend) are silenced for the install alone.
QUIET_PIP := PYTHONWARNINGS=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 $(BIN)/python -m pip install --quiet --quiet --progress-bar off

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "creating the Python environment in $(VENV)…"; $(PYTHON) -m venv $(VENV); }
	@echo "installing Python packages (about a minute on a fresh machine)…"
	@$(QUIET_PIP) --upgrade pip
	@$(QUIET_PIP) -e '.[test]'
	@touch $@

$(NODE_STAMP): package.json package-lock.json
	@echo "installing the Claude Code CLI (pinned in package.json)…"
	@NO_UPDATE_NOTIFIER=1 npm ci --no-audit --no-fund --no-update-notifier --loglevel=error >/dev/null
	@touch $@

install: $(STAMP) $(NODE_STAMP)

# After a successful `up` (it exits non-zero, naming the cause, when a process does not start), the next
# steps: the command is not on PATH, so name it as it must be typed.
run: install
	@echo "starting agentpost…"
	@$(BIN)/agentpost up
	@echo ""
	@echo "Next: the agentpost command is $(BIN)/agentpost (not on your PATH; or run: . $(BIN)/activate)"
	@echo "  $(BIN)/agentpost init               write a starter settings.toml (agents, channels) to edit"
	@echo "  $(BIN)/agentpost doctor             check settings, the agents' CLI and login, channels"
	@echo "  $(BIN)/agentpost send -w \"hello\"     send a message to the default agent and wait for the reply"
	@echo "  $(BIN)/agentpost down               stop everything (make run starts it again)"

# Side by side by default: six pytest-xdist workers (each with its own temporary folders, PostgreSQL database,
# ports and Redis prefix; the tests mostly wait on processes, so six keep two cores busy), then the few
# tests marked serial alone (they change what every test shares, or time a latency). Both parts run; the
# target fails if either does. TEST_WORKERS=1 runs everything one at a time, in one pytest.
TEST_WORKERS ?= 6
test: install
	@if [ "$(TEST_WORKERS)" = 1 ]; then $(BIN)/python -m pytest; else \
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not serial"; side_by_side=$$?; \
	$(BIN)/python -m pytest -m serial; alone=$$?; \
	test $$side_by_side -eq 0 && test $$alone -eq 0; fi

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
