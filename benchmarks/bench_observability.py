"""What observing costs: the MLP training step and a chain of 1000 tiny ops in
adaptive mode, plain, inside neuron_lab.profiler.profile(), inside
neuron_lab.explain_scope(), and inside torch.profiler.profile(); ratios to the
plain run. Medians of interleaved repeats; one thread.
Usage: .venv/bin/python benchmarks/bench_observability.py [--repeats N]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import neuron_lab


def mlp_step_fn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 256)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 256, device="neuron")
    target = torch.randn(64, 256, device="neuron")

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()

    return step


def tiny_chain_fn():
    x = torch.randn(64, device="neuron")

    def run() -> None:
        y = x
        for _ in range(500):
            y = y * 1.0001
            y = y + 0.0001
        y.sum()

    return run


CONTEXTS = {
    "plain": contextlib.nullcontext,
    "neuron_lab.profiler": neuron_lab.profiler.profile,
    "explain_scope": neuron_lab.explain_scope,
    "torch.profiler": lambda: torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]),
}


def measure(fn, context, steps: int) -> float:
    torch.neuron.synchronize()
    start = time.perf_counter()
    with context():
        for _ in range(steps):
            fn()
        torch.neuron.synchronize()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    neuron_lab.set_mode("adaptive")
    neuron_lab.configure(compile=False)  # replay tier only: compile timing would add noise
    workloads = {"MLP step": mlp_step_fn(), "1000 tiny ops": tiny_chain_fn()}
    results: dict[tuple[str, str], list[float]] = {}
    for name, fn in workloads.items():
        for _ in range(3):
            fn()
        for _ in range(args.repeats):
            for ctx_name, ctx in CONTEXTS.items():  # interleaved, so drift hits every context alike
                results.setdefault((name, ctx_name), []).append(measure(fn, ctx, args.steps))
    print(f"| workload | {' | '.join(CONTEXTS)} |")
    print("|---|" + "---|" * len(CONTEXTS))
    for name in workloads:
        plain = statistics.median(results[(name, "plain")])
        cells = [f"{plain * 1e3:.2f} ms"] + [
            f"{statistics.median(results[(name, c)]) * 1e3:.2f} ms ({statistics.median(results[(name, c)]) / plain:.2f}x)"
            for c in list(CONTEXTS)[1:]]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
