#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k memory`.
#
# In CI (CI set), or when NEURON_LAB_SECOND_COMBINATION=1, it then runs a second supported
# combination, CPython 3.11 with torch 2.14.1, in a fresh venv (scripts/matrix.py --suite ci:
# the core suite, TorchTitan's end-to-end test and a notebook); either failing fails the run.
# TorchTitan's test then runs only there: it needs torch 2.14, and in CI it fails rather than skip.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -z "${CI:-}" ] && [ "${NEURON_LAB_SECOND_COMBINATION:-0}" != 1 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
status=0
.venv/bin/python -m pytest --ignore=tests/distributed/test_torchtitan.py "$@" || status=$?
echo "test: the second combination, CPython 3.11 with torch 2.14.1 (scripts/matrix.py --suite ci), NEURON_LAB_LAUNCH_RUNNER=device_thread"
# The main combination runs with the default runner, auto, which on CI's machine (kernels take
# every CPU) runs launches on the host (neuron_lab/device/launches.py); the second on the
# streams' device threads, so that both ways are tested.
NEURON_LAB_LAUNCH_RUNNER=device_thread .venv/bin/python scripts/matrix.py --pythons 3.11 --torches 2.14.1 --suite ci --no-download \
  --work "${NEURON_LAB_MATRIX_WORK:-build/matrix}" || status=$((status ? status : 1))
exit "$status"
