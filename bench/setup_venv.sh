#!/usr/bin/env bash
# Create bench/.venv (its own virtualenv, separate from the project's .venv) with the benchmark peers
# from bench/requirements.txt, then the project itself in editable mode.
# Idempotent: each step is skipped when its stamp matches (hash of its inputs and the Python version).
# The project step is tolerant: if installing the project fails, it warns and the peers stay usable.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$here/.venv"
python="${PYTHON:-python3}"
pip_opts=(--disable-pip-version-check --quiet)

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

if [[ ! -x "$venv/bin/python" ]]; then
  echo "bench: creating $venv with $("$python" --version 2>&1)"
  "$python" -m venv "$venv"
fi
pyver="$("$venv/bin/python" -c 'import sys; print(sys.version)')"

req_stamp="$venv/.bench-requirements.stamp"
req_hash="$(hash_of "$here/requirements.txt")-$(printf '%s' "$pyver" | sha256sum | cut -c1-16)"
if [[ -f "$req_stamp" && "$(cat "$req_stamp")" == "$req_hash" ]]; then
  echo "bench: peers already installed (requirements unchanged)"
else
  echo "bench: installing peers from bench/requirements.txt"
  "$venv/bin/python" -m pip install "${pip_opts[@]}" -r "$here/requirements.txt"
  printf '%s' "$req_hash" >"$req_stamp"
fi

proj_stamp="$venv/.bench-project.stamp"
proj_hash="$(hash_of "$root/pyproject.toml")-$req_hash"
if [[ -f "$proj_stamp" && "$(cat "$proj_stamp")" == "$proj_hash" ]]; then
  echo "bench: project already installed (pyproject.toml unchanged)"
else
  echo "bench: installing the project (pip install -e $root)"
  if "$venv/bin/python" -m pip install "${pip_opts[@]}" -e "$root"; then
    printf '%s' "$proj_hash" >"$proj_stamp"
  else
    rm -f "$proj_stamp"
    echo "bench: WARNING: installing the project failed; the peers are installed, agentpost is not" >&2
  fi
fi

echo "bench: ready: $venv/bin/python bench/run_peers.py --help"
