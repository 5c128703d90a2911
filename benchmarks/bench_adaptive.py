"""Adaptive eager against native CPU eager and CPU torch.compile, in one run.

Rows (issue 3's targets): the 1M-element sin/cos chain (steady state, compiled
tier), a chain of 1000 tiny ops (host cost per op, launches per op), the MLP
training step (3 x Linear(256), batch 64, SGD momentum) and its cold start
(first 5 steps, adaptive vs eager mode); and a decoding loop's bookkeeping, 6 small
ops and a host read (bool()) per step, in every mode (issue 16: what a host read costs).
Medians of interleaved repeats; one thread. Usage: .venv/bin/python benchmarks/bench_adaptive.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import neuron_lab
from neuron_lab import adaptive_eager as ae


def sync() -> None:
    torch.neuron.synchronize()


def median_time(fn, repeats: int, inner: int = 1) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return statistics.median(times)


def chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(5):
        x = torch.sin(x) * 1.01 + torch.cos(x) * 0.5
    return x


def bench_chain(repeats: int) -> dict:
    x_cpu = torch.randn(1 << 20)
    x_dev = x_cpu.to("neuron")
    compiled = torch.compile(chain, backend="inductor")
    compiled(x_cpu)
    kept = []
    for _ in range(ae.policy()["compile_after"] + 2):
        kept.append(chain(x_dev))  # the result is kept, as a program would
        sync()
        kept.clear()
    ae.wait_for_compiles(300)
    for _ in range(8):  # compiled runs are compared with replay before being kept
        kept.append(chain(x_dev))
        sync()
        kept.clear()

    def dev() -> None:
        kept.append(chain(x_dev))
        sync()
        kept.clear()

    return {
        "cpu_eager": median_time(lambda: chain(x_cpu), repeats),
        "cpu_compile": median_time(lambda: compiled(x_cpu), repeats),
        "adaptive": median_time(dev, repeats),
    }


def tiny_chain(x: torch.Tensor, n: int = 1000) -> torch.Tensor:
    for _ in range(n // 2):
        x = x * 1.0001 + 0.5
    return x


def bench_tiny(repeats: int) -> dict:
    x_cpu = torch.randn(64)
    x_dev = x_cpu.to("neuron")
    kept = []
    for _ in range(ae.policy()["compile_after"] + 2):  # steady state: graphs cached (and compiled)
        kept.append(tiny_chain(x_dev))
        sync()
        kept.clear()
    ae.wait_for_compiles(300)
    for _ in range(8):
        kept.append(tiny_chain(x_dev))
        sync()
        kept.clear()
    ae.reset_counters()

    def dev_record() -> None:
        kept.append(tiny_chain(x_dev))

    host = median_time(dev_record, repeats)
    sync()
    kept.clear()
    c = ae.counters()
    return {
        "cpu_eager_per_op": median_time(lambda: tiny_chain(x_cpu), repeats) / 1000,
        "adaptive_host_per_op": host / 1000,
        "launches_per_op": c["launches"] / max(c["ops_recorded"], 1),
    }


def host_read_step(state: list, ids: torch.Tensor) -> bool:
    """A decoding loop's stopping check: a few one-element ops, then a host read."""
    state[0] = state[0] & ~((ids + 1) == 50256)
    return bool(state[0].max() == 0)


def bench_host_read(repeats: int) -> dict:
    out = {}
    for where in ["cpu", "adaptive", "eager", "blocking"]:
        device = "cpu" if where == "cpu" else "neuron"
        with neuron_lab.mode("adaptive" if where == "cpu" else where):
            state = [torch.ones(1, dtype=torch.long, device=device)]
            ids = torch.zeros(1, dtype=torch.long, device=device)
            for _ in range(200):  # the step's graph is built and repeats
                host_read_step(state, ids)
            out[where] = median_time(lambda: host_read_step(state, ids), repeats, inner=200)
    return out


def make_mlp(device: str) -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(64, 256, device=device)
    y = torch.randn(64, 256, device=device)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def bench_mlp(repeats: int) -> dict:
    """Steady state (graphs cached, background compiles finished), CPU eager and adaptive
    interleaved block by block so that drift on a noisy machine hits both alike; launches
    per step counted separately in eager and adaptive mode."""
    results = {}
    for mode in ("eager", "adaptive"):
        neuron_lab.set_mode(mode)
        step = make_mlp("neuron")
        for _ in range(5):
            step().item()
        ae.reset_counters()
        for _ in range(10):
            step().item()
        sync()
        results[f"{mode}_launches_per_step"] = ae.counters()["launches"] / 10
    neuron_lab.set_mode("adaptive")
    steps = {"cpu_eager": make_mlp("cpu"), "adaptive": make_mlp("neuron")}
    for step in steps.values():
        for _ in range(ae.policy()["compile_after"] + 5):
            step().item()
    ae.wait_for_compiles(300)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(10):
                step().item()
            times[name].append((time.perf_counter() - start) / 10)
    results.update({name: statistics.median(t) for name, t in times.items()})
    return results


def bench_cold_start() -> dict:
    out = {}
    for mode in ("eager", "adaptive"):
        neuron_lab.set_mode(mode)
        ae.clear_graph_cache()
        step = make_mlp("neuron")
        start = time.perf_counter()
        for _ in range(5):
            step().item()
        out[mode] = time.perf_counter() - start
    neuron_lab.set_mode("adaptive")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, repeats {args.repeats}", file=sys.stderr)
    cold = bench_cold_start()
    chain_r = bench_chain(args.repeats)
    tiny = bench_tiny(args.repeats)
    mlp = bench_mlp(args.repeats)
    reads = bench_host_read(args.repeats)
    rows = [
        ("5x(sin*1.01+cos*0.5), 1M el., ms", chain_r["cpu_eager"] * 1e3, chain_r["cpu_compile"] * 1e3,
         chain_r["adaptive"] * 1e3,
         f"adaptive/compile {chain_r['adaptive'] / chain_r['cpu_compile']:.2f} (<= 1.3); "
         f"CPU eager/adaptive {chain_r['cpu_eager'] / chain_r['adaptive']:.2f} (>= 4)"),
        ("1000 tiny ops, host µs/op", tiny["cpu_eager_per_op"] * 1e6, float("nan"), tiny["adaptive_host_per_op"] * 1e6,
         f"adaptive/CPU {tiny['adaptive_host_per_op'] / tiny['cpu_eager_per_op']:.2f} (<= 3); "
         f"launches/op {tiny['launches_per_op']:.4f} (<= 0.01)"),
        ("MLP SGD step, ms", mlp["cpu_eager"] * 1e3, float("nan"), mlp["adaptive"] * 1e3,
         f"adaptive/CPU {mlp['adaptive'] / mlp['cpu_eager']:.2f} (<= 1.5); launches/step eager "
         f"{mlp['eager_launches_per_step']:.1f} vs adaptive {mlp['adaptive_launches_per_step']:.1f} (>= 10x fewer)"),
        ("6 small ops + bool() per step, µs", reads["cpu"] * 1e6, float("nan"), reads["adaptive"] * 1e6,
         f"adaptive/CPU {reads['adaptive'] / reads['cpu']:.2f}; eager mode {reads['eager'] * 1e6:.1f} µs "
         f"(adaptive/eager {reads['adaptive'] / reads['eager']:.2f}), blocking {reads['blocking'] * 1e6:.1f} µs"),
        ("cold start, first 5 steps, ms", float("nan"), float("nan"), cold["adaptive"] * 1e3,
         f"adaptive/eager {cold['adaptive'] / cold['eager']:.2f} (<= 1.5)"),
    ]
    print("| workload | CPU eager | CPU compile | adaptive | ratios (target) |")
    print("|---|---|---|---|---|")
    for name, a, b, c, note in rows:
        print(f"| {name} | {a:.3f} | {b:.3f} | {c:.3f} | {note} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
