"""Full conformance sweeps of the ``neuron`` device against PyTorch's own test databases.

* ``--db ops``: every OpInfo of ``op_db`` that supports float32 on the CPU (forward,
  backward, in-place variant; ``tests/opinfo_support.py``), all samples.
* ``--db modules``: every ModuleInfo of ``module_db`` (forward, gradients, buffers,
  state round trips, deepcopy, pickle; ``tests/module_db_support.py``), every input, in
  the default (adaptive) mode and in blocking mode.
* ``--db optims``: every optimizer of ``optim_db`` in each implementation (for-loop,
  foreach, fused, differentiable), every config, several steps
  (``tests/optim_db_support.py``), in both modes.

Prints the cases that do not pass (crashes first, with the first line of each error),
the exclusions with their reasons, and per mode the pass rate

    pass rate = passed / applicable,   applicable = all cases - exclusions

Cases run in worker subprocesses, so one that crashes the process or hangs is recorded
as CRASHED / TIMEOUT and the sweep goes on. Exits with status 1 when a pass rate is
below the threshold (99% by default), 0 otherwise.

Usage (from the repository root)::

    .venv/bin/python scripts/sweep.py --db ops                    # all samples
    .venv/bin/python scripts/sweep.py --db ops --samples 2        # CI-sized
    .venv/bin/python scripts/sweep.py --db modules --mode blocking --cases 'Conv' --verbose
    .venv/bin/python scripts/sweep.py --db optims --jobs 2 --json /tmp/optims.json
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import isolated  # noqa: E402

DATABASES = ("ops", "modules", "optims")


def _suite(db: str):
    """(module of the suite, every case id, whether cases take an execution mode)."""
    if db == "ops":
        import opinfo_support as support

        return support, support.all_op_ids(), False
    if db == "modules":
        import module_db_support as support

        return support, support.all_module_ids(), True
    import optim_db_support as support

    return support, support.all_case_ids(), True


def _main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=DATABASES, required=True, help="which database to sweep")
    parser.add_argument("--mode", choices=("adaptive", "blocking", "both"), default="both",
                        help="execution mode(s), for modules and optims (default both)")
    parser.add_argument("--samples", type=int, default=0, help="samples (inputs, configs) per case (default 0: all)")
    parser.add_argument("--cases", action="append", default=[], help="regex on case ids (repeatable)")
    parser.add_argument("--jobs", type=int, default=1, help="parallel worker processes")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    parser.add_argument("--json", help="write all results to this JSON file (one per mode: MODE is appended)")
    parser.add_argument("--verbose", action="store_true", help="print the full error of each failure")
    parser.add_argument("--threshold", type=float, default=99.0, help="minimum pass rate, percent")
    ns = parser.parse_args()

    support, case_ids, takes_mode = _suite(ns.db)
    samples = ns.samples or None
    modes = (["adaptive", "blocking"] if ns.mode == "both" else [ns.mode]) if takes_mode else [None]
    status = 0
    for mode in modes:
        if mode is None:
            def new_runner():
                return support.make_runner(samples, timeout=ns.timeout)
        else:
            def new_runner(mode: str = mode):
                return support.make_runner(samples, mode=mode, timeout=ns.timeout)
        title = (f"{ns.db} sweep on 'neuron'" + (f" in {mode} mode" if mode else "")
                 + f", {'all' if samples is None else samples} samples per case")
        json_path = f"{ns.json}.{mode}" if ns.json and mode else ns.json
        status |= isolated.sweep(title, case_ids, new_runner, jobs=ns.jobs, patterns=ns.cases, verbose=ns.verbose,
                                 threshold=ns.threshold, json_path=json_path,
                                 extra={"db": ns.db, "mode": mode, "samples": samples})
        print()
    return status


if __name__ == "__main__":
    sys.exit(_main())
