"""What profiling costs a transformers training step: tiny GPT-2 and Llama (tests/hf_models.py,
no downloads), forward + backward + AdamW, in the default (adaptive) mode, run

- plain,
- inside ``neuron_lab.profiler.profile()`` (the device's launch records),
- inside ``torch.profiler.profile(activities=[CPU, PrivateUse1])`` (CPU ops + the device's lanes),
- the same with ``record_shapes=True, profile_memory=True`` (what the next way asks torch for),
- inside ``neuron_lab.profiler.profile(torch_profiler=True)`` (both: what ``%%neuron_profile --trace`` runs).

Each block runs ``--steps`` training steps and ends with a ``loss.item()``; a profiled block also
pays the profiler's start and its stop (finishing the device work, building the records, and
torch.profiler's processing). Reported: the median per step over ``--repeats`` interleaved blocks,
and the ratio to the plain run, of the wall time and of the process's CPU time (all its threads:
the host's and the device's). On a shared machine the wall time swings with the other jobs; the
CPU time is the work that profiling adds, and swings far less. ``--threads`` sets torch's thread
count (default: torch's own).

Usage: .venv/bin/python benchmarks/bench_profiler.py [--models gpt2 llama] [--steps 5] [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

import neuron_lab

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from hf_models import MODELS, make_batch  # noqa: E402

ACTIVITIES = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]

WAYS = {
    "plain": contextlib.nullcontext,
    "neuron_lab.profiler": lambda: neuron_lab.profiler.profile(),
    "torch.profiler (CPU + PrivateUse1)": lambda: torch.profiler.profile(activities=ACTIVITIES),
    "torch.profiler (CPU + PrivateUse1, shapes, memory)": lambda: torch.profiler.profile(
        activities=ACTIVITIES, record_shapes=True, profile_memory=True),
    "neuron_lab.profiler(torch_profiler=True)": lambda: neuron_lab.profiler.profile(torch_profiler=True),
}


def training_step(name: str):
    torch.manual_seed(0)
    model = MODELS[name].build(attention_dropout=0.0) if name == "llama" else MODELS[name].build()
    model = model.to("neuron")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    spec = MODELS[name]
    generator = torch.Generator().manual_seed(0)
    batch = {k: v.to("neuron") for k, v in make_batch(spec.kind, generator, batch=4, tokens=32).items()}

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gpt2", "llama"], choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=5, help="training steps per timed block (default 5)")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per way (default 7)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, neuron_lab {neuron_lab.__version__}, "
          f"mode {neuron_lab.get_mode()}; {args.steps} steps per block, {args.repeats} blocks per way")
    print()
    print("| model | way | wall ms per step (median) | ratio to plain | CPU ms per step (median) | ratio to plain |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        step = training_step(name)
        for _ in range(3):  # warm: graphs built, compiles started
            step().item()
        times: dict[str, list[float]] = {way: [] for way in WAYS}
        cpu_times: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(args.repeats):
            for way, make in WAYS.items():  # interleaved: the machine's drift hits every way alike
                torch.neuron.synchronize()
                start, cpu_start = time.perf_counter(), time.process_time()
                with make():
                    for _ in range(args.steps):
                        loss = step()
                    loss.item()
                times[way].append((time.perf_counter() - start) / args.steps * 1e3)
                cpu_times[way].append((time.process_time() - cpu_start) / args.steps * 1e3)
        plain, cpu_plain = statistics.median(times["plain"]), statistics.median(cpu_times["plain"])
        for way, values in times.items():
            median, cpu_median = statistics.median(values), statistics.median(cpu_times[way])
            print(f"| {name} | {way} | {median:.2f} | {median / plain:.2f}x | {cpu_median:.2f} | "
                  f"{cpu_median / cpu_plain:.2f}x |")
        print(f"<!-- {name}: per-block ms per step: " +
              "; ".join(f"{w}: {', '.join(f'{v:.1f}' for v in vs)}" for w, vs in times.items()) + " -->")


if __name__ == "__main__":
    main()
