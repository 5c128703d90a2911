"""What each family of fast host kernels (neuron_lab.fastpath) gains, on named workloads, at an
equal thread budget: the keep/delete table of issue 47.

Each configuration runs in a fresh worker process of its own (bench_training.py's workers),
set before the workload's first op:

  ``on``          every family on (the default);
  ``off``         ATen's kernels only (``fastpath.set_mode("off")``);
  ``-FAMILY``     every family on but FAMILY.

The parent runs the workers in alternating rounds (each ``--inner`` steps, ending with
``torch.accelerator.synchronize()``, after a pause that lets the previous worker's idle threads
settle), so the configurations never overlap. A family's gain on a workload is the median over
rounds of time(-FAMILY) / time(on) - 1, paired within a round. A family that gains under 5% on
every workload pays for nothing it was written for.

(An earlier version switched the configurations inside one process, round by round: there both
``on`` and ``off`` decoded a token in 25 ms, against 14 and 17 ms in processes of their own,
and the table hid a 22% gain.)

    python benchmarks/bench_fastpath.py                      # every workload, default and 1 thread
    python benchmarks/bench_fastpath.py --rounds 7 --workloads gpt2_tiny
    python benchmarks/bench_fastpath.py --json out.json

The two thread rows: torch's default threads (what a notebook gets) and one thread, with the
process pinned to one core. The workloads are bench_training.py's (benchmarks/training_workloads.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import training_workloads  # noqa: E402  (the workloads of bench_training.py)
from bench_training import run_steady  # noqa: E402

# Generation, transformers training, a CNN and a UNet (the 6-layer 512-wide models: --workloads).
WORKLOADS = ["llama_generate", "gpt2_tiny", "llama_tiny", "resnet18", "unet"]


def families() -> list[str]:
    from neuron_lab import fastpath

    return fastpath.families()


def summarise(result: dict, key: str = "wall") -> dict[str, float]:
    """Per configuration: the median over rounds of its time over 'on''s in the same round
    (``key``: "wall", wall-clock, or "cpu", the process's CPU time, every thread's)."""
    samples = result["samples"]
    on = samples["neuron"]
    return {config.partition(":")[2]: statistics.median(a[key] / b[key] for a, b in zip(runs, on))
            for config, runs in samples.items() if config != "neuron"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="*", default=WORKLOADS, choices=training_workloads.WORKLOADS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--inner", type=int, default=2, help="timed steps per configuration and round")
    parser.add_argument("--threads", nargs="*", default=["default", "1"])
    parser.add_argument("--settle-ms", type=float, default=100.0, help="pause before each worker's turn (untimed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    configs = ["neuron", "neuron:off"] + [f"neuron:-{f}" for f in families()]
    results = []
    for threads in args.threads:
        for workload in args.workloads:
            print(f"# {workload}, threads {threads}", file=sys.stderr, flush=True)
            results.append(run_steady(workload, threads, configs, args.rounds, args.inner, args.warmup,
                                      args.settle_ms / 1000))
            if args.json:  # kept up to date: a run cut short keeps the rows it finished
                args.json.write_text(json.dumps(results, indent=1))

    columns = [c.partition(":")[2] for c in configs[1:]]
    for key, title in (("wall", "wall-clock"), ("cpu", "process CPU time (all threads)")):
        print(f"\n{title}\n")
        print("| workload | threads | median on (ms) | " + " | ".join(columns) + " |")
        print("|---|---|---|" + "---|" * len(columns))
        for r in results:
            s = summarise(r, key)
            on_ms = statistics.median(x[key] for x in r["samples"]["neuron"]) * 1e3
            cells = " | ".join(f"{s[c]:.3f}" for c in columns)
            print(f"| {r['workload']} | {r['threads']} | {on_ms:.1f} | {cells} |")
    print("\nEach cell: the median over rounds of time(configuration) / time(on) in the same round; "
          "'-F' is every family on but F, so its cell - 1 is what F gains.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
