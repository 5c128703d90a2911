"""torch.compile(backend="neuron") against CPU torch.compile (inductor) and native CPU
eager, in one run: an MLP training step (3 x Linear(256), batch 64, SGD momentum) and
a transformer-block training step (nn.TransformerEncoderLayer(d_model=128, 4 heads),
batch 16 x 32 tokens, AdamW). Steady state: interleaved repeats after warm-up and once
adaptive eager's background compiles (the optimizer step's graphs) are done; times are
medians, ratios the median of each repeat's paired ratio (the blocks of one repeat run
back to back, so the machine's drift cancels); each block ends with a device synchronize,
so neuron's queued work is counted in its own block. The first step's time (compile
included) is reported separately. One thread.
``--options '{"cpp_wrapper": true}'`` gives every torch.compile configuration the same
TorchInductor options (which make both neuron configurations inline launches).
Configurations: CPU eager, CPU compile (inductor), neuron compile (the default async launches) and
neuron inline (options={"neuron.launch": "inline"}: Inductor code run inline).
Usage: .venv/bin/python benchmarks/bench_compile.py [--repeats N] [--steps N] [--options JSON]
"""

from __future__ import annotations

import argparse
import copy
import json
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


def make_step(model: nn.Module, data: tuple, opt_cls: type, opt_kwargs: dict, device: str, backend: str | None,
              options: dict | None = None):
    model = copy.deepcopy(model).to(device)
    x, y = (t.to(device) for t in data)
    forward = torch.compile(model, backend=backend, options=options or None) if backend else model
    opt = opt_cls(model.parameters(), **opt_kwargs)

    def step() -> float:
        opt.zero_grad()
        loss = nn.functional.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        return loss.item()  # a host read per step, as training loops log the loss

    return step


CONFIGS = {  # label: (device, backend, extra torch.compile options)
    "CPU eager": ("cpu", None, {}),
    "CPU compile": ("cpu", "inductor", {}),
    "neuron compile": ("neuron", "neuron", {}),  # async launches (the default)
    "neuron inline": ("neuron", "neuron", {"neuron.launch": "inline"}),  # Inductor code, inline launches
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40, help="steps per timed block")
    parser.add_argument("--options", type=json.loads, default={}, help="TorchInductor options (JSON) for every compile")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, repeats {args.repeats} x {args.steps} steps, "
          f"inductor options {args.options or 'default'}", file=sys.stderr)
    rows = []
    for name, workload in (("MLP step", mlp), ("transformer block step", transformer)):
        torch.manual_seed(0)
        model, data, opt_cls, opt_kwargs = workload()
        steps, first = {}, {}
        for label, (device, backend, extra) in CONFIGS.items():
            torch._dynamo.reset()
            options = {**args.options, **extra}  # (Inductor options imply neuron's inline launches)
            steps[label] = make_step(model, data, opt_cls, opt_kwargs, device, backend,
                                     options if backend else None)
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
                if CONFIGS[label][0] == "neuron":
                    torch.neuron.synchronize()  # the block owns all the work it queued
                times[label].append((time.perf_counter() - start) / args.steps)
        med = {label: statistics.median(t) for label, t in times.items()}
        # Paired ratios: each repeat's blocks ran back to back, so their ratio cancels the
        # machine's slow drift; the median of those is the reported ratio.
        pairs = (("neuron compile", "CPU compile"), ("neuron compile", "CPU eager"), ("neuron inline", "CPU compile"))
        paired = {(a, b): sorted(x / y for x, y in zip(times[a], times[b])) for a, b in pairs}
        ratios = {pair: statistics.median(values) for pair, values in paired.items()}
        for a, b in pairs[::2]:
            print(f"{name}: {a} / {b} per repeat, sorted: {', '.join(f'{r:.2f}' for r in paired[(a, b)])}",
                  file=sys.stderr)
        rows.append((name, med, first, ratios))
    print("| workload | CPU eager | CPU compile | neuron compile (async) | neuron inline | "
          "neuron / CPU compile (target <= 1.2) | neuron / CPU eager | neuron inline / CPU compile "
          "| first step (compile): neuron / neuron inline / CPU compile |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, med, first, ratios in rows:
        print(f"| {name} | {med['CPU eager'] * 1e3:.2f} ms | {med['CPU compile'] * 1e3:.2f} ms | "
              f"{med['neuron compile'] * 1e3:.2f} ms | {med['neuron inline'] * 1e3:.2f} ms | "
              f"{ratios[('neuron compile', 'CPU compile')]:.2f} | {ratios[('neuron compile', 'CPU eager')]:.2f} | "
              f"{ratios[('neuron inline', 'CPU compile')]:.2f} | {first['neuron compile']:.1f} s / "
              f"{first['neuron inline']:.1f} s / {first['CPU compile']:.1f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
