#!/usr/bin/env bash
# Sets up neuron_lab in ./.venv: Python venv, torch 2.13.0 (CPU build), the
# package in editable mode with its test extras, its C++ extension, and Debian's
# chromium for the browser end-to-end test (tests/e2e; NEURON_LAB_SKIP_CHROMIUM=1 skips it).
# Idempotent: a second run only rebuilds what changed. Says each step, its progress and
# its time as it goes (full logs in build/*.log).
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
STEPS=6
SETUP_START=$SECONDS
STEP_START=$SECONDS

step() {  # step N "what": starts a step
  STEP_START=$SECONDS
  echo "setup [$1/$STEPS] $2"
}
took() {  # took "result": ends a step with its time
  echo "setup       ${1:-done} ($((SECONDS - STEP_START)) s)"
}

# pip's and uv's own notes, shown as they come but without the noise: pip's warning about
# running as root (normal in a container, where this script is meant to run as root too)
# and its "new version available" notice.
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
indent() { sed -u 's/^/setup         /'; }

mkdir -p build
step 1 "Python virtual environment in $VENV ($("$PYTHON" --version 2>&1))"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  took "created"
else
  took "already there"
fi
PIP=("$VENV/bin/python" -m pip)
UV=("$VENV/bin/uv" pip install --python "$VENV/bin/python")
# The venv's ninja must be on PATH for the extension to compile in parallel.
export PATH="$PWD/$VENV/bin:$PATH"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

# uv installs about 5x faster than pip here. torch itself is fetched by pip, whose
# configuration knows where the pinned CPU build lies (an unpinned torch would pull
# a multi-GB CUDA build), then installed by uv from that file. Any other torch (2.14.1, or
# 2.13.0 for another Python: CUDA builds, which run on the CPU too) is installed by pip
# itself, whose configuration may know where their CUDA libraries lie; uv's does not.
step 2 "uv, the installer (pip install uv)"
"${PIP[@]}" install -q uv 2>&1 | indent
took "$("$VENV/bin/uv" --version)"

step 3 "$TORCH_PIN (the CPU build for CPython 3.11 and 2.13.0: a download of about 200 MB; others are CUDA builds of several GB)"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  tag=$("$VENV/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  mkdir -p build/wheels
  if [ "$TORCH_PIN" = "torch==2.13.0" ] && [ "$tag" = cp311 ]; then
    # pip's progress bar when this runs in a terminal; one line per file in a log.
    "${PIP[@]}" download --no-deps --progress-bar "$([ -t 1 ] && echo on || echo off)" -d build/wheels "$TORCH_PIN" \
      2>&1 | { grep -v -e '^Saved ' -e '^Successfully downloaded' || true; } | indent
  fi
  cpu_wheel=$(ls build/wheels/torch-"${TORCH_PIN#torch==}"+cpu-"$tag"-*.whl 2>/dev/null | head -1 || true)
  echo "setup         installing torch, setuptools, wheel, ninja"
  if [ -z "$cpu_wheel" ] || ! "${UV[@]}" "$cpu_wheel" setuptools wheel ninja 2>&1 | indent; then
    "${PIP[@]}" install "$TORCH_PIN" setuptools wheel ninja 2>&1 | indent
  fi
  took "$("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)') installed"
else
  took "$("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)') already installed"
fi

# The package and its other dependencies, in editable mode; NEURON_LAB_SKIP_EXTENSION
# keeps this step from compiling the extension, which is built next, in place, so that
# a rerun recompiles only what changed (objects stay in build/). Sequential on purpose:
# the build imports torch and numpy, which must not be half-installed at that moment.
step 4 "neuron_lab in editable mode with its test extras (JupyterLab, ipywidgets, transformers, ...)"
if ! NEURON_LAB_SKIP_EXTENSION=1 "${UV[@]}" --no-build-isolation -e ".[test]" 2>&1 | indent; then
  echo "setup: uv could not install the package; falling back to pip" >&2
  NEURON_LAB_SKIP_EXTENSION=1 "${PIP[@]}" install -q --no-build-isolation -e ".[test]" 2>&1 | indent
fi
# Bytecode for every installed module: uv installs without it and PYTHONDONTWRITEBYTECODE
# (set in some containers) keeps Python from writing it, so every fresh process (a test
# worker, a notebook kernel, torchrun's ranks) would compile torch from source, ~1.5 s
# more per `import torch`. A no-op when the bytecode is current.
echo "setup         byte-compiling the installed packages (once)"
"$VENV/bin/python" -m compileall -q -j0 "$VENV/lib" > build/compileall.log 2>&1 || true
took "installed"

# The extension: ninja prints [n/N] per file compiled; shown as "compiling [n/N] file.cpp".
step 5 "the C++ extension neuron_lab.device._C (MAX_JOBS=$MAX_JOBS; the first build compiles every file, a rerun only what changed)"
set +e
"$VENV/bin/python" setup.py -q build_ext --inplace 2>&1 | tee build/extension.log \
  | sed -u -n -E 's#^\[([0-9]+)/([0-9]+)\] .* -c (/[^ ]*/)?([^/ ]+\.cpp) .*#setup         compiling [\1/\2] \4#p'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  tail -50 build/extension.log >&2
  echo "setup: building the C++ extension failed (the end of build/extension.log above)" >&2
  exit 1
fi
if grep -q '^\[' build/extension.log; then took "built"; else took "up to date"; fi

# Headless Chromium for the browser end-to-end test (tests/e2e): Debian's package, since
# Playwright's own browser download does not work here. Needs root (or passwordless sudo);
# without it the test skips locally, but CI (CI set) must have it, so there it is an error.
step 6 "Chromium for the browser test (tests/e2e)"
if [ -n "${NEURON_LAB_SKIP_CHROMIUM:-}" ]; then
  took "skipped (NEURON_LAB_SKIP_CHROMIUM)"
elif command -v chromium >/dev/null 2>&1 || [ -x /usr/lib/chromium/chromium ]; then
  took "found"
else
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
  else
    echo "setup         installing Debian's chromium with apt-get (log: build/chromium-apt.log)"
    if ! apt_install \
        && ! { "${SUDO[@]}" apt-get update -qq >> build/chromium-apt.log 2>&1 && apt_install; }; then
      cat build/chromium-apt.log >&2
      msg="setup: installing chromium failed (apt log above);"
      msg+=" try: apt-get update && apt-get install -y --no-install-recommends chromium"
      if [ -n "${CI:-}" ]; then echo "$msg" >&2; exit 1; fi
      echo "$msg (the browser end-to-end test will skip)" >&2
    else
      took "installed"
    fi
  fi
fi
echo "setup: ready in $((SECONDS - SETUP_START)) s"
