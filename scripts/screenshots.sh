#!/usr/bin/env bash
# Regenerates the documentation's JupyterLab pictures: runs the browser tests (tests/e2e:
# a private JupyterLab in headless Chromium, see tests/e2e/conftest.py), which check what
# they picture, then copies the pictures into a folder (default docs/img/).
#   bash scripts/screenshots.sh                 # all pictures into docs/img/
#   bash scripts/screenshots.sh /tmp/pictures   # somewhere else
# Needs the set-up (scripts/setup.sh) and Chromium (`apt-get install -y chromium`).
# PYTHON names another interpreter (default: .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-docs/img}"
python="${PYTHON:-.venv/bin/python}"
artifacts="$(mktemp -d)"
trap 'rm -rf "$artifacts"' EXIT
# Each picture and the test that takes it.
pictures=(
  "late_error.png tests/e2e/test_notebook_pictures.py"
  "compare.png tests/e2e/test_notebook_pictures.py"
  "live_panel.png tests/e2e/test_live_panel.py"
  "live_panel_docked.png tests/e2e/test_live_panel.py"
  "dashboard.png tests/e2e/test_browser.py"
  "profile_table.png tests/e2e/test_browser.py"
  "timeline.png tests/e2e/test_timeline.py"
)
tests=$(printf '%s\n' "${pictures[@]}" | cut -d' ' -f2 | sort -u)
echo "screenshots: running $(echo "$tests" | wc -l) browser tests (about a minute)"
# CI=1: a missing Chromium or Playwright is an error here, not a skip.
# shellcheck disable=SC2086
CI=1 NEURON_LAB_TEST_ARTIFACTS="$artifacts" "$python" -m pytest -q -p no:cacheprovider -o addopts="" $tests
mkdir -p "$dest"
for entry in "${pictures[@]}"; do
  name="${entry%% *}"
  cp "$artifacts/e2e/$name" "$dest/$name"
  echo "screenshots: $dest/$name"
done
