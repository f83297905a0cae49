#!/usr/bin/env bash
# The model-based test of the promise (tests/integration/test_promise_model.py) run long: many more random
# interleavings per database than `make test` runs. EXAMPLES and STEPS set the size (default 2000 examples of
# up to 50 steps each: about 3 minutes on SQLite and 10 on PostgreSQL on 2 cores). PostgreSQL is reached at
# AGENTPOST_TEST_PG_URL (default: the local server), as in the test suite.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export AGENTPOST_STATEFUL_EXAMPLES="${EXAMPLES:-2000}"
export AGENTPOST_STATEFUL_STEPS="${STEPS:-50}"
exec .venv/bin/python -m pytest tests/integration/test_promise_model.py -k random_interleavings -q \
  -p no:cacheprovider --durations=0 "$@"
