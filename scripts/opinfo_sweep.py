"""Full OpInfo conformance sweep of the ``neuron`` device.

Runs every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db``
that supports float32 on the CPU through the checks of ``tests/opinfo_support.py``
(forward, backward, in-place variant; CPU is the reference), prints a table of
the ops that fail (with the first line of each error), and the pass rate

    pass rate = passed / applicable,   applicable = all ops - EXCLUSIONS

Ops run in worker subprocesses, so an op that crashes the process (segfault,
abort) or hangs is recorded as CRASHED / TIMEOUT and the sweep goes on.
Crashes are listed first. Exits with status 1 when the pass rate is below the
threshold (99% by default), 0 otherwise.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python scripts/opinfo_sweep.py                 # all samples
    PYTHONPATH=. .venv/bin/python scripts/opinfo_sweep.py --samples 2     # CI-sized
    PYTHONPATH=. .venv/bin/python scripts/opinfo_sweep.py --ops 'nn.functional.conv' --verbose
    PYTHONPATH=. .venv/bin/python scripts/opinfo_sweep.py --jobs 2 --json /tmp/sweep.json

Options: ``--samples N`` (samples per op; default: all), ``--ops REGEX``
(only ops whose id matches, repeatable), ``--jobs N`` (parallel workers),
``--timeout S`` (seconds per op before its worker is killed), ``--json PATH``
(write every result), ``--verbose`` (full error text of each failure),
``--threshold PCT`` (minimum pass rate, default 99).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from dataclasses import asdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import opinfo_support as support  # noqa: E402


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=0, help="samples per op (default 0: all)")
    parser.add_argument("--ops", action="append", default=[], help="regex on op ids (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per op")
    parser.add_argument("--json", help="write all results to this JSON file")
    parser.add_argument("--verbose", action="store_true", help="print the full error of each failure")
    parser.add_argument("--threshold", type=float, default=99.0, help="minimum pass rate, percent")
    ns = parser.parse_args()

    ids = support.all_op_ids()
    if ns.ops:
        pats = [re.compile(p) for p in ns.ops]
        ids = [i for i in ids if any(p.search(i) for p in pats)]
    max_samples = ns.samples or None
    print(f"OpInfo sweep on '{support.DEVICE}': {len(ids)} ops, "
          f"{'all' if max_samples is None else max_samples} samples per op, {ns.jobs} worker(s)", flush=True)

    results: dict[str, support.OpResult] = {}
    queue = list(ids)
    lock = threading.Lock()
    start = time.perf_counter()

    def work() -> None:
        runner = support.OpRunner(max_samples, ns.timeout)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    key = queue.pop(0)
                res = runner.run(key)
                with lock:
                    results[key] = res
                    done = len(results)
                    if res.status not in ("passed", "excluded"):
                        print(f"  [{done}/{len(ids)}] {res.status.upper():8} {key}: {res.first_line[:150]}",
                              flush=True)
                    elif done % 50 == 0:
                        print(f"  [{done}/{len(ids)}] ... {time.perf_counter() - start:.0f}s", flush=True)
        finally:
            runner.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, ns.jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start

    ordered = [results[i] for i in ids]
    by_status: dict[str, list[support.OpResult]] = {}
    for r in ordered:
        by_status.setdefault(r.status, []).append(r)
    excluded = by_status.get("excluded", [])
    passed = by_status.get("passed", [])
    skipped = by_status.get("skipped", [])
    applicable = len(ordered) - len(excluded)
    bad = [r for r in ordered if r.status in ("crashed", "timeout", "failed", "error")]
    bad.sort(key=lambda r: (["crashed", "timeout", "error", "failed"].index(r.status), r.op_id))

    if bad:
        width = max(len(r.op_id) for r in bad)
        print(f"\n{'op':{width}}  status    first error")
        print(f"{'-' * width}  --------  {'-' * 60}")
        for r in bad:
            print(f"{r.op_id:{width}}  {r.status:8}  {r.first_line[:200]}")
            if ns.verbose:
                for line in r.message.strip().splitlines()[1:]:
                    print(f"{'':{width}}            {line}")
    if excluded:
        print(f"\nExcluded ({len(excluded)}):")
        for r in excluded:
            print(f"  {r.op_id}: {r.message}")
    if skipped:
        print(f"\nSkipped, not counted as passed ({len(skipped)}):")
        for r in skipped:
            print(f"  {r.op_id}: {r.message}")

    rate = 100.0 * len(passed) / applicable if applicable else 100.0
    counts = ", ".join(f"{k}={len(v)}" for k, v in sorted(by_status.items()))
    print(f"\n{counts}; {elapsed:.0f}s")
    print(f"pass rate: {len(passed)}/{applicable} = {rate:.2f}% (threshold {ns.threshold:g}%)")

    if ns.json:
        with open(ns.json, "w") as f:
            json.dump({"samples": max_samples, "seconds": elapsed, "pass_rate": rate,
                       "results": [asdict(r) for r in ordered]}, f, indent=1)
    return 0 if rate >= ns.threshold else 1


if __name__ == "__main__":
    sys.exit(_main())
