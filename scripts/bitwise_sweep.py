"""Bitwise sweep: every OpInfo op on ``neuron`` gives the CPU's bits, in every mode.

Runs ``tests/bitwise_support.py``'s check (forward results and input gradients of a fixed
random cotangent, bit for bit, NaN matching NaN) for every OpInfo of ``op_db`` that
supports float32 on the CPU, every sample, in each execution mode, and prints the ops that
do not pass, then a summary of pass counts per mode. CI runs a deterministic sample of the
ops (``tests/ops/test_bitwise.py``). Exits with status 1 if any op fails in any mode.

Usage (from the repository root)::

    .venv/bin/python scripts/bitwise_sweep.py                         # all ops, samples, modes
    .venv/bin/python scripts/bitwise_sweep.py --mode eager --cases '^nn\\.functional\\.' --verbose
    .venv/bin/python scripts/bitwise_sweep.py --samples 2 --jobs 2 --json /tmp/bits.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import bitwise_support as support  # noqa: E402
import isolated  # noqa: E402


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=(*support.MODES, "all"), default="all", help="execution mode(s)")
    parser.add_argument("--samples", type=int, default=0, help="samples per op (default 0: all)")
    parser.add_argument("--cases", action="append", default=[], help="regex on op ids (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per op")
    parser.add_argument("--json", help="write every result to this JSON file ({mode: results})")
    parser.add_argument("--verbose", action="store_true", help="print every failing check")
    ns = parser.parse_args()

    modes = list(support.MODES) if ns.mode == "all" else [ns.mode]
    samples = ns.samples or None
    results: dict[str, dict] = {}
    status = 0
    for mode in modes:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            status |= isolated.sweep(
                f"bitwise sweep on 'neuron' in {mode} mode, {'all' if samples is None else samples} samples per op",
                support.all_op_ids(), lambda mode=mode: support.make_runner(samples, mode=mode, timeout=ns.timeout),
                jobs=ns.jobs, patterns=ns.cases, verbose=ns.verbose, threshold=100.0, json_path=out.name,
                extra={"mode": mode, "samples": samples})
            with open(out.name) as f:
                results[mode] = json.load(f)
        print()

    print("Summary (ops; a failed op has results or input gradients that are not the CPU's bits):")
    print(f"{'mode':10} {'ops':>5} {'passed':>7} {'failed':>7} {'crashed':>8} {'skipped':>8} {'excluded':>9} "
          f"{'samples':>8} {'checks':>7} {'seconds':>8}")
    for mode in modes:
        rows = results[mode]["results"]
        by = {s: sum(1 for r in rows if r["status"] == s) for s in
              ("passed", "failed", "crashed", "timeout", "error", "skipped", "excluded")}
        checks = sum(v for r in rows for k, v in r["checks"].items() if k in ("forward", "gradient"))
        print(f"{mode:10} {len(rows):5} {by['passed']:7} {by['failed']:7} "
              f"{by['crashed'] + by['timeout'] + by['error']:8} {by['skipped']:8} {by['excluded']:9} "
              f"{sum(r['samples'] for r in rows):8} {checks:7} {results[mode]['seconds']:8.0f}")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(_main())
