"""torch.compile(backend="neuron") against CPU torch.compile (inductor) and native CPU
eager, in one run: an MLP training step (3 x Linear(256), batch 64, SGD momentum) and
a transformer-block training step (nn.TransformerEncoderLayer(d_model=128, 4 heads),
batch 16 x 32 tokens, AdamW). Steady state: interleaved repeats after warm-up and once
adaptive eager's background compiles (the optimizer step's graphs) are done; times are
medians, ratios the median of each repeat's paired ratio (the blocks of one repeat run
back to back, so the machine's drift cancels). The first step's time (compile included)
is reported separately. One thread.
Usage: .venv/bin/python benchmarks/bench_compile.py [--repeats N]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from typing import Callable

import torch
from torch import nn

import neuron_lab  # noqa: F401  (registers the device and the backend)
from neuron_lab import adaptive_eager as ae


def mlp() -> tuple[nn.Module, Callable[[str], tuple], type, dict]:
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    data = (torch.randn(64, 256), torch.randn(64, 256))
    return model, data, torch.optim.SGD, {"lr": 0.01, "momentum": 0.9}


def transformer() -> tuple[nn.Module, Callable[[str], tuple], type, dict]:
    model = nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=256, dropout=0.0, batch_first=True)
    data = (torch.randn(16, 32, 128), torch.randn(16, 32, 128))
    return model, data, torch.optim.AdamW, {"lr": 1e-3}


def make_step(model: nn.Module, data: tuple, opt_cls: type, opt_kwargs: dict, device: str, backend: str | None):
    model = copy.deepcopy(model).to(device)
    x, y = (t.to(device) for t in data)
    forward = torch.compile(model, backend=backend) if backend else model
    opt = opt_cls(model.parameters(), **opt_kwargs)

    def step() -> float:
        opt.zero_grad()
        loss = nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # a host read per step, as training loops log the loss

    return step


CONFIGS = {
    "CPU eager": ("cpu", None),
    "CPU compile": ("cpu", "inductor"),
    "neuron compile": ("neuron", "neuron"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, repeats {args.repeats} x {args.steps} steps", file=sys.stderr)
    rows = []
    for name, workload in (("MLP step", mlp), ("transformer block step", transformer)):
        torch.manual_seed(0)
        model, data, opt_cls, opt_kwargs = workload()
        steps, first = {}, {}
        for label, (device, backend) in CONFIGS.items():
            torch._dynamo.reset()
            steps[label] = make_step(model, data, opt_cls, opt_kwargs, device, backend)
            start = time.perf_counter()
            steps[label]()
            first[label] = time.perf_counter() - start
            for _ in range(15):  # past adaptive eager's compile_after for the optimizer's graphs
                steps[label]()
        ae.wait_for_compiles(300)  # steady state: no background compile steals the measured time
        for step in steps.values():
            for _ in range(3):
                step()
        times: dict[str, list[float]] = {label: [] for label in CONFIGS}
        for _ in range(args.repeats):
            for label, step in steps.items():  # interleaved: drift hits every configuration alike
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                times[label].append((time.perf_counter() - start) / args.steps)
        med = {label: statistics.median(t) for label, t in times.items()}
        # Paired ratios: each repeat's blocks ran back to back, so their ratio cancels the
        # machine's slow drift; the median of those is the reported ratio.
        paired = {base: sorted(n / b for n, b in zip(times["neuron compile"], times[base]))
                  for base in ("CPU compile", "CPU eager")}
        ratios = {base: statistics.median(values) for base, values in paired.items()}
        print(f"{name}: neuron / CPU compile per repeat, sorted: "
              f"{', '.join(f'{r:.2f}' for r in paired['CPU compile'])}", file=sys.stderr)
        rows.append((name, med, first, ratios))
    print("| workload | CPU eager | CPU compile | neuron compile | neuron / CPU compile (target <= 1.2) "
          "| neuron / CPU eager | first step (compile) neuron / CPU compile |")
    print("|---|---|---|---|---|---|---|")
    for name, med, first, ratios in rows:
        print(f"| {name} | {med['CPU eager'] * 1e3:.2f} ms | {med['CPU compile'] * 1e3:.2f} ms | "
              f"{med['neuron compile'] * 1e3:.2f} ms | {ratios['CPU compile']:.2f} | "
              f"{ratios['CPU eager']:.2f} | "
              f"{first['neuron compile']:.1f} s / {first['CPU compile']:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
