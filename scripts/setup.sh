#!/usr/bin/env bash
# Sets up neuron_lab in ./.venv: Python venv, torch 2.13.0 (CPU build), the
# package in editable mode with its test extras, and its C++ extension.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${NEURON_LAB_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# The venv's ninja must be on PATH for the extension to compile in parallel.
export PATH="$PWD/$VENV/bin:$PATH"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

# torch first, pinned: the extension builds against it (no build isolation), and an
# unpinned torch would pull a multi-GB CUDA build instead of the local CPU wheel.
"${PIP[@]}" install "torch==2.13.0" setuptools wheel ninja
"${PIP[@]}" install --no-build-isolation -e ".[test]"
