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

# torch first, pinned, with pip (whose configuration knows the local CPU wheel): the
# extension builds against it (no build isolation), and an unpinned torch would pull
# a multi-GB CUDA build. The rest installs with uv, about 3x faster than pip here;
# it keeps the installed torch, which satisfies the package's range.
"${PIP[@]}" install "torch==2.13.0" setuptools wheel ninja uv
if ! "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --no-build-isolation -e ".[test]"; then
  echo "setup: uv could not install the package; falling back to pip" >&2
  "${PIP[@]}" install --no-build-isolation -e ".[test]"
fi
