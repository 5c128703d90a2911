#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh) and runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k memory`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
