#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh, which says each step as it goes) and opens the
# workbench: JupyterLab on notebooks/.
# Extra arguments go to jupyter lab, e.g. `bash scripts/lab.sh --no-browser --port 8899`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# Jupyter refuses to start as root unless told; root is normal in a container or a cloud VM.
as_root=()
if [ "$(id -u)" = "0" ]; then as_root=(--allow-root); fi
echo "lab: starting JupyterLab on notebooks/ (it prints its address below; Ctrl-C stops it)"
exec .venv/bin/jupyter lab --notebook-dir=notebooks "${as_root[@]}" "$@"
