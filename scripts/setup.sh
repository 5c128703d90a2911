#!/usr/bin/env bash
# Sets up neuron_lab in ./.venv: Python venv, torch 2.13.0 (CPU build), the
# package in editable mode with its test extras, its C++ extension, and Debian's
# chromium for the browser end-to-end test (tests/e2e; NEURON_LAB_SKIP_CHROMIUM=1 skips it).
# Idempotent: a second run only rebuilds what changed.
#
# Another supported combination (README, "Supported versions"), in a tree of its own
# since the extension is built in place:
#   PYTHON=python3.12 NEURON_LAB_TORCH=torch==2.14.1 bash scripts/setup.sh
# PYTHON: the interpreter the venv is made from (CPython 3.11-3.13); NEURON_LAB_TORCH: the
# torch requirement; NEURON_LAB_VENV: the venv's folder.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-$(command -v python3.11 || echo python3)}
VENV=${NEURON_LAB_VENV:-.venv}
TORCH_PIN=${NEURON_LAB_TORCH:-torch==2.13.0}

# An unsupported Python is refused here, before anything is installed (_build_backend.py).
"$PYTHON" -c '
import sys
sys.path.insert(0, ".")
from _build_backend import unsupported_python
reason = unsupported_python(sys.implementation.name, tuple(sys.version_info))
sys.exit(f"setup: {reason}" if reason else 0)'

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
UV=("$VENV/bin/uv" pip install -q --python "$VENV/bin/python")
# The venv's ninja must be on PATH for the extension to compile in parallel.
export PATH="$PWD/$VENV/bin:$PATH"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

# uv installs about 5x faster than pip here. torch itself is fetched by pip, whose
# configuration knows where the pinned CPU build lies (an unpinned torch would pull
# a multi-GB CUDA build), then installed by uv from that file. Any other torch (2.14.1, or
# 2.13.0 for another Python: CUDA builds, which run on the CPU too) is installed by pip
# itself, whose configuration may know where their CUDA libraries lie; uv's does not.
"${PIP[@]}" install uv
mkdir -p build/wheels
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  tag=$("$VENV/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  if [ "$TORCH_PIN" = "torch==2.13.0" ] && [ "$tag" = cp311 ]; then
    "${PIP[@]}" download --no-deps -d build/wheels "$TORCH_PIN"
  fi
  cpu_wheel=$(ls build/wheels/torch-"${TORCH_PIN#torch==}"+cpu-"$tag"-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$cpu_wheel" ] || ! "${UV[@]}" "$cpu_wheel" setuptools wheel ninja; then
    "${PIP[@]}" install "$TORCH_PIN" setuptools wheel ninja
  fi
fi

# The package and its other dependencies, in editable mode; NEURON_LAB_SKIP_EXTENSION
# keeps this step from compiling the extension, which is built next, in place, so that
# a rerun recompiles only what changed (objects stay in build/). Sequential on purpose:
# the build imports torch and numpy, which must not be half-installed at that moment.
if ! NEURON_LAB_SKIP_EXTENSION=1 "${UV[@]}" --no-build-isolation -e ".[test]"; then
  echo "setup: uv could not install the package; falling back to pip" >&2
  NEURON_LAB_SKIP_EXTENSION=1 "${PIP[@]}" install --no-build-isolation -e ".[test]"
fi
# Bytecode for every installed module: uv installs without it and PYTHONDONTWRITEBYTECODE
# (set in some containers) keeps Python from writing it, so every fresh process (a test
# worker, a notebook kernel, torchrun's ranks) would compile torch from source, ~1.5 s
# more per `import torch`. A no-op when the bytecode is current.
"$VENV/bin/python" -m compileall -q -j0 "$VENV/lib" > build/compileall.log 2>&1 || true
if ! "$VENV/bin/python" setup.py -q build_ext --inplace > build/extension.log 2>&1; then
  cat build/extension.log >&2
  echo "setup: building the C++ extension failed (log above)" >&2
  exit 1
fi

# Headless Chromium for the browser end-to-end test (tests/e2e): Debian's package, since
# Playwright's own browser download does not work here. Needs root (or passwordless sudo);
# without it the test skips locally, but CI (CI set) must have it, so there it is an error.
if [ -z "${NEURON_LAB_SKIP_CHROMIUM:-}" ] \
    && ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromium ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
  fi
  apt_install() {
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends chromium >> build/chromium-apt.log 2>&1
  }
  : > build/chromium-apt.log
  if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" -ne 0 ] && [ ${#SUDO[@]} -eq 0 ]; }; then
    msg="setup: chromium is missing and cannot be installed here (needs apt-get as root);"
    msg+=" install it with: apt-get install -y --no-install-recommends chromium"
    if [ -n "${CI:-}" ]; then echo "$msg" >&2; exit 1; fi
    echo "$msg (the browser end-to-end test will skip)" >&2
  elif ! apt_install \
      && ! { "${SUDO[@]}" apt-get update -qq >> build/chromium-apt.log 2>&1 && apt_install; }; then
    cat build/chromium-apt.log >&2
    msg="setup: installing chromium failed (apt log above);"
    msg+=" try: apt-get update && apt-get install -y --no-install-recommends chromium"
    if [ -n "${CI:-}" ]; then echo "$msg" >&2; exit 1; fi
    echo "$msg (the browser end-to-end test will skip)" >&2
  fi
fi
