#!/usr/bin/env bash
# Installs neuron_lab the ways any PyTorch extension is installed, each into a fresh virtual
# environment that has only torch==2.13.0, and runs a smoke test in each (a tensor on neuron, a
# backward pass): `pip install .`, `pip install -e .`, and a wheel from `python -m build`.
# Each builds the C++ extension from scratch (about 5 minutes on 2 cores).
# Usage: bash scripts/check_install.sh [wheel|editable|build ...]   (default: all three)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive --format=tar HEAD | (mkdir -p "$work/src" && tar -x -C "$work/src")

smoke='
import torch
x = torch.ones(3, device="neuron", requires_grad=True)
(x * 2).sum().backward()
assert x.grad.device.type == "neuron" and x.grad.cpu().tolist() == [2.0, 2.0, 2.0], x.grad
import neuron_lab
print("ok:", torch.__version__, neuron_lab.__file__)
'

check() {
  local how=$1 venv="$work/venv-$1"
  echo "== $how" >&2
  "$PYTHON" -m venv "$venv"
  local pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
  "${pip[@]}" install torch==2.13.0
  case "$how" in
    wheel)    (cd "$work/src" && "${pip[@]}" install .) ;;
    editable) (cp -r "$work/src" "$work/src-editable" && cd "$work/src-editable" && "${pip[@]}" install -e .) ;;
    build)    "${pip[@]}" install build
              (cp -r "$work/src" "$work/src-build" && cd "$work/src-build" && "$venv/bin/python" -m build -q --wheel -o "$work/dist")
              "${pip[@]}" install "$work"/dist/neuron_lab-*.whl ;;
    *) echo "unknown: $how" >&2; return 2 ;;
  esac
  (cd "$work" && "$venv/bin/python" -c "$smoke")
}

for how in "${@:-wheel editable build}"; do
  for one in $how; do check "$one"; done
done
