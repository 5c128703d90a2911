"""Full sweep of the elementwise host kernels' result layouts against the CPU.

Random add, sub, mul, where, & and | calls of small dense operands whose size-1 dims carry
other strides (tests/elementwise_layouts.py makes and checks them): in each mode the
dtype, shape, strides and bits must equal the CPU's. CI runs 150 calls a mode
(tests/fastpath/test_host_kernels.py); this runs as many as asked, prints the first problems and
exits 1 if there is any.

Usage (from the repository root)::

    .venv/bin/python scripts/sweep_elementwise_layouts.py --calls 5000 --seed 1
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import neuron_lab  # noqa: E402
from elementwise_layouts import check_elementwise_case, elementwise_sweep_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="adaptive,eager,blocking")
    args = parser.parse_args()
    failed = 0
    for mode in args.modes.split(","):
        rng = random.Random(args.seed)
        ran = problems = 0
        with neuron_lab.mode(mode):
            for _ in range(args.calls):
                outcome = check_elementwise_case(*elementwise_sweep_case(rng))
                ran += outcome.kernel_ran
                if outcome.problem is not None:
                    problems += 1
                    if problems <= 10:
                        print(f"  {mode}: {outcome.problem}")
        print(f"{mode}: {args.calls} calls, {ran} taken by a host kernel, {problems} differ from the CPU")
        failed += problems
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
