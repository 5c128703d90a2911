"""What each family of fast host kernels (neuron_lab.fastpath) gains, on named workloads, at an
equal thread budget: the keep/delete table of issue 47.

For each workload and thread count, one process builds the workload on the ``neuron`` device
and times it in alternating rounds; each round runs every configuration, in a rotating order:
one untimed step after the switch, then ``--inner`` timed steps, waiting for all device work
at the end of the timed region:

  ``on``          every family on (the default);
  ``off``         NEURON_LAB_FASTPATH=off (ATen's kernels only);
  ``-FAMILY``     every family on but FAMILY.

A family's gain on a workload is the median over rounds of time(-FAMILY) / time(on) - 1,
paired within a round (the machine's noise moves both alike). A family that gains under 5%
on every workload pays for nothing it was written for.

    python benchmarks/bench_fastpath.py                      # every workload, default and 1 thread
    python benchmarks/bench_fastpath.py --rounds 7 --workloads gpt2_tiny
    python benchmarks/bench_fastpath.py --json out.json

The two thread rows: torch's default threads (what a notebook gets) and one thread, with the
process pinned to one core (the device's host thread records while its device thread runs
kernels: without the pin the 1-thread row would use two cores). The workloads are
bench_training.py's (benchmarks/training_workloads.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import training_workloads  # noqa: E402  (the workloads of bench_training.py)
from bench_training import pin_to_cores  # noqa: E402

# Generation, transformers training, a CNN and a UNet (the 6-layer 512-wide models: --workloads).
WORKLOADS = ["llama_generate", "gpt2_tiny", "llama_tiny", "resnet18", "unet"]


def _sync() -> None:
    import torch

    torch.accelerator.synchronize()


def measure(workload: str, threads: int | None, rounds: int, warmup: int, inner: int) -> dict:
    """In this process: the timed rounds of one workload (see the module's docstring)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    import neuron_lab  # noqa: F401
    from neuron_lab import fastpath

    step = training_workloads.build(workload, "neuron")
    families = fastpath.families()
    configs = ["on", "off"] + [f"-{f}" for f in families]

    def apply(config: str) -> None:
        if config == "off":
            fastpath.set_mode("off")
            return
        fastpath.set_mode("on")
        for f in families:
            fastpath.set_family_enabled(f, config != f"-{f}")

    for config in configs:  # warm every configuration (recorded graphs, caches)
        apply(config)
        for _ in range(warmup):
            step()
        _sync()
    times: dict[str, list[float]] = {c: [] for c in configs}
    cpu_times: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for config in order:
            apply(config)
            step()  # untimed: the first step after a switch finds its recorded graphs again
            _sync()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(inner):
                step()
            _sync()
            times[config].append((time.perf_counter() - start) / inner)
            cpu_times[config].append((time.process_time() - cpu_start) / inner)
    apply("on")
    return {"workload": workload, "threads": threads or torch.get_num_threads(), "times": times,
            "cpu_times": cpu_times}


def summarise(result: dict, key: str = "times") -> dict[str, float]:
    """Per configuration: the median over rounds of its time over 'on''s in the same round
    (``key``: "times", wall-clock, or "cpu_times", the process's CPU time, every thread's)."""
    times = result[key]
    on = times["on"]
    return {c: statistics.median(t / o for t, o in zip(ts, on)) for c, ts in times.items() if c != "on"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="*", default=WORKLOADS, choices=training_workloads.WORKLOADS)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--inner", type=int, default=3, help="timed steps per configuration and round")
    parser.add_argument("--threads", nargs="*", default=["default", "1"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:  # the child process of one (workload, threads)
        workload, threads = args.one
        pin_to_cores(threads)  # N threads: N cores for the host and the device thread together
        result = measure(workload, None if threads == "default" else int(threads), args.rounds, args.warmup, args.inner)
        print(json.dumps(result))
        return 0

    results = []
    for threads in args.threads:
        for workload in args.workloads:
            print(f"# {workload}, threads {threads}", file=sys.stderr, flush=True)
            proc = subprocess.run(
                [sys.executable, __file__, "--one", workload, threads, "--rounds", str(args.rounds),
                 "--warmup", str(args.warmup), "--inner", str(args.inner)], capture_output=True, text=True, env=os.environ.copy())
            if proc.returncode != 0:
                reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
                print(f"#   skipped: {reason}", file=sys.stderr)
                results.append({"workload": workload, "threads": threads, "skipped": reason})
                continue
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))

    ran = [r for r in results if "skipped" not in r]
    configs = sorted({c for r in ran for c in summarise(r)}, key=lambda c: (c != "off", c))
    for key, title in (("times", "wall-clock"), ("cpu_times", "process CPU time (all threads)")):
        print(f"\n{title}\n")
        print("| workload | threads | median on (s) | " + " | ".join(configs) + " |")
        print("|---|---|---|" + "---|" * len(configs))
        for r in results:
            if "skipped" in r:
                print(f"| {r['workload']} | {r['threads']} | skipped: {r['skipped']} |")
                continue
            s = summarise(r, key)
            cells = " | ".join(f"{s[c]:.3f}" for c in configs)
            print(f"| {r['workload']} | {r['threads']} | {statistics.median(r[key]['on']):.4f} | {cells} |")
    print("\nEach cell: the median over rounds of time(configuration) / time(on) in the same round; "
          "'-F' is every family on but F, so its cell - 1 is what F gains.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
