#!/usr/bin/env python
"""Benchmark the ``neuron`` device against native CPU PyTorch.

Three workloads, each timed on CPU eager, CPU ``torch.compile`` (where it applies)
and neuron eager:

1. per-op overhead: chains of cheap pointwise ops on 64-element float32 tensors
   (µs per op);
2. one MLP training step: 3 x ``nn.Linear(256, 256)`` with ReLU between, batch 64,
   MSE loss, then SGD or Adam (foreach) (ms per step);
3. a large pointwise workload: 5 x ``(sin(x) * 1.01 + cos(x) * 0.5)`` on 1M
   elements (ms per call).

Method: everything runs on one intra-op thread (``torch.set_num_threads(1)``).
Each case is warmed up, then timed in ``--repeats`` blocks of several units of
work each; the cases of one workload take turns block by block so that drifts of a
noisy machine hit them alike, and the reported figure is the median over blocks.
A neuron block ends with ``torch.neuron.synchronize()``, so the timings stay
correct once execution becomes asynchronous.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python benchmarks/bench_device.py            # full run
    PYTHONPATH=. .venv/bin/python benchmarks/bench_device.py --quick    # smoke test
    PYTHONPATH=. .venv/bin/python benchmarks/bench_device.py --json benchmarks/results/run.json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

import neuron_lab  # noqa: F401  (registers the ``neuron`` device)

CPU = torch.device("cpu")
NEURON = torch.device("neuron")

# Names of the three timed cases, in table order.
CPU_EAGER = "cpu_eager"
CPU_COMPILE = "cpu_compile"
NEURON_EAGER = "neuron"

Runner = Callable[[int], None]
"""Runs ``n`` units of work (``n`` chain steps, training steps or calls)."""


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """How long and how often to time."""

    repeats: int  # timed blocks per case
    block_s: float  # target duration of one timed block
    compile: bool  # whether to time the torch.compile cases


DEFAULT_REPEATS = 21
QUICK_REPEATS = 5
DEFAULT_BLOCK_S = 0.1
QUICK_BLOCK_S = 0.02


# --------------------------------------------------------------------------- timing


@dataclass
class Case:
    """One way of running a workload: a device plus a runner of ``n`` units."""

    name: str
    device: torch.device
    run: Runner


@dataclass
class Measurement:
    """Seconds per unit of work of every timed block of one case."""

    units_per_block: int
    samples: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def synchronize(device: torch.device) -> None:
    """Waits for the work queued on ``device`` (a no-op on CPU, which is synchronous)."""
    if device.type == NEURON.type:
        torch.neuron.synchronize()


def time_block(case: Case, units: int) -> float:
    """Wall-clock seconds of ``units`` units of ``case``, queued work included."""
    synchronize(case.device)
    start = time.perf_counter()
    case.run(units)
    synchronize(case.device)
    return time.perf_counter() - start


def calibrate(case: Case, block_s: float) -> int:
    """Warms ``case`` up and returns how many units make a block last about ``block_s``.

    Doubles the block size until one block takes a tenth of ``block_s``; these
    blocks are the warm-up (at least three runs of the case).
    """
    units, elapsed, runs = 1, 0.0, 0
    while runs < 3 or elapsed < block_s / 10:
        elapsed = time_block(case, units)
        runs += 1
        if elapsed < block_s / 10:
            units *= 2
    return max(1, math.ceil(units * block_s / elapsed))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Keeps Python's cyclic garbage collector from running inside timed blocks."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def measure(cases: list[Case], settings: Settings) -> dict[str, Measurement]:
    """Times every case in ``settings.repeats`` blocks, the cases taking turns."""
    results = {case.name: Measurement(calibrate(case, settings.block_s)) for case in cases}
    with gc_paused():
        for repeat in range(settings.repeats):
            # Alternate the order so that no case always runs right after another.
            for case in cases if repeat % 2 == 0 else reversed(cases):
                result = results[case.name]
                result.samples.append(time_block(case, result.units_per_block) / result.units_per_block)
    return results


# --------------------------------------------------------------------------- results


@dataclass
class Result:
    """The timings of one workload (one table row)."""

    workload: str
    unit: str  # "µs/op", "ms/step" or "ms"
    unit_scale: float  # seconds -> ``unit``
    ops_per_unit: int  # ops in one unit of work (a chain step may hold several ops)
    target: float  # the largest acceptable neuron / CPU eager ratio
    compile_applies: bool
    timings: dict[str, Measurement]
    compile_first_call_s: float | None = None  # first compiled call, compilation included

    def value(self, case: str) -> float | None:
        """Median of ``case`` in ``unit`` (per op for the per-op rows); None if not timed."""
        timing = self.timings.get(case)
        return None if timing is None else timing.median / self.ops_per_unit * self.unit_scale

    def ratio(self, case: str) -> float | None:
        """Neuron time over the time of ``case``; None if either was not timed."""
        neuron, other = self.value(NEURON_EAGER), self.value(case)
        return None if neuron is None or other is None else neuron / other

    @property
    def met(self) -> bool:
        ratio = self.ratio(CPU_EAGER)
        return ratio is not None and ratio <= self.target

    def to_json(self) -> dict:
        """The raw numbers of this row (all times in seconds)."""
        return {
            "workload": self.workload,
            "unit": self.unit,
            "ops_per_unit": self.ops_per_unit,
            "target_neuron_over_cpu_eager": self.target,
            "met": self.met,
            "compile_first_call_s": self.compile_first_call_s,
            "median": {case: self.value(case) for case in self.timings},
            "ratio_neuron_over_cpu_eager": self.ratio(CPU_EAGER),
            "ratio_neuron_over_cpu_compile": self.ratio(CPU_COMPILE),
            "cases": {
                case: {
                    "units_per_block": timing.units_per_block,
                    "seconds_per_unit": timing.samples,
                    "median_seconds_per_unit": timing.median,
                }
                for case, timing in self.timings.items()
            },
        }


# --------------------------------------------------------------------------- workloads

CHAIN_NUMEL = 64
PER_OP_TARGET = 4.0

# Chain steps: (label, ops per step, step function of (x, y)).
CHAIN_STEPS: list[tuple[str, int, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    ("x * 1.0001 + 0.5", 2, lambda x, y: x * 1.0001 + 0.5),
    ("sin(x)", 1, lambda x, y: torch.sin(x)),
    ("relu(x)", 1, lambda x, y: torch.relu(x)),
    ("x + y", 1, lambda x, y: x + y),
]


def chain_runner(
    step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], device: torch.device
) -> Runner:
    """A runner of ``n`` steps of a dependent chain ``x = step(x, y)`` on small tensors."""
    generator = torch.Generator().manual_seed(0)
    x0 = torch.randn(CHAIN_NUMEL, generator=generator).to(device)
    y = torch.randn(CHAIN_NUMEL, generator=generator).to(device)

    def run(n: int) -> None:
        x = x0
        for _ in range(n):
            x = step(x, y)

    return run


def bench_per_op(settings: Settings) -> list[Result]:
    """Workload 1: the cost of one small op, CPU eager vs neuron eager."""
    results = []
    for label, ops, step in CHAIN_STEPS:
        cases = [Case(name, device, chain_runner(step, device)) for name, device in
                 ((CPU_EAGER, CPU), (NEURON_EAGER, NEURON))]
        results.append(Result(
            workload=f"per-op: {label} ({CHAIN_NUMEL} el., µs/op)",
            unit="µs/op", unit_scale=1e6, ops_per_unit=ops, target=PER_OP_TARGET,
            compile_applies=False, timings=measure(cases, settings),
        ))
    return results


MLP_WIDTH = 256
MLP_BATCH = 64
MLP_TARGET = 2.5

# Optimizers, pinned to the same implementation on both devices (left alone, torch
# picks foreach on neuron, as on any PrivateUse1 device, but a for-loop on CPU).
OPTIMIZERS: dict[str, Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]] = {
    "SGD": lambda params: torch.optim.SGD(params, lr=1e-2, foreach=False),
    "Adam (foreach)": lambda params: torch.optim.Adam(params, lr=1e-3, foreach=True),
}


def make_mlp() -> nn.Sequential:
    """3 x Linear(256, 256) with ReLU between them."""
    return nn.Sequential(
        nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU(),
        nn.Linear(MLP_WIDTH, MLP_WIDTH), nn.ReLU(),
        nn.Linear(MLP_WIDTH, MLP_WIDTH),
    )


def training_runner(optimizer_name: str, device: torch.device, compiled: bool) -> Runner:
    """A runner of ``n`` training steps (zero_grad, forward, MSE, backward, step)."""
    torch.manual_seed(0)  # same weights and data on every device
    model = make_mlp()
    inputs, targets = torch.randn(MLP_BATCH, MLP_WIDTH), torch.randn(MLP_BATCH, MLP_WIDTH)
    model, inputs, targets = model.to(device), inputs.to(device), targets.to(device)
    forward = torch.compile(model, backend="inductor") if compiled else model
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())

    def run(n: int) -> None:
        for _ in range(n):
            optimizer.zero_grad()
            F.mse_loss(forward(inputs), targets).backward()
            optimizer.step()

    return run


def first_call_seconds(case: Case) -> float:
    """Seconds of the first unit of a compiled ``case``, compilation included.

    Dynamo's caches are reset first: otherwise a second model of the same shape
    would reuse the graph compiled for the first one (parameters are graph inputs)
    and its "first call" would show no compilation at all.
    """
    torch._dynamo.reset()
    return time_block(case, 1)


def bench_training(settings: Settings) -> list[Result]:
    """Workload 2: one MLP training step per optimizer."""
    results = []
    for name in OPTIMIZERS:
        cases = [Case(CPU_EAGER, CPU, training_runner(name, CPU, compiled=False))]
        compile_s = None
        if settings.compile:
            compiled = Case(CPU_COMPILE, CPU, training_runner(name, CPU, compiled=True))
            compile_s = first_call_seconds(compiled)
            cases.append(compiled)
        cases.append(Case(NEURON_EAGER, NEURON, training_runner(name, NEURON, compiled=False)))
        results.append(Result(
            workload=f"MLP train step, {name} (ms/step)",
            unit="ms/step", unit_scale=1e3, ops_per_unit=1, target=MLP_TARGET,
            compile_applies=True, timings=measure(cases, settings), compile_first_call_s=compile_s,
        ))
    return results


LARGE_NUMEL = 1 << 20
LARGE_ROUNDS = 5
# The issue sets no number here; "the same cost" is read as within 20%, i.e. noise.
LARGE_TARGET = 1.2


def large_pointwise(x: torch.Tensor) -> torch.Tensor:
    """5 x (sin(x) * 1.01 + cos(x) * 0.5): 25 ops on large tensors."""
    for _ in range(LARGE_ROUNDS):
        x = torch.sin(x) * 1.01 + torch.cos(x) * 0.5
    return x


def large_pointwise_runner(device: torch.device, compiled: bool) -> Runner:
    """A runner of ``n`` calls of :func:`large_pointwise` on 1M float32 elements."""
    x = torch.randn(LARGE_NUMEL, generator=torch.Generator().manual_seed(0)).to(device)
    function = torch.compile(large_pointwise, backend="inductor") if compiled else large_pointwise

    def run(n: int) -> None:
        for _ in range(n):
            function(x)

    return run


def bench_large_pointwise(settings: Settings) -> list[Result]:
    """Workload 3: big pointwise ops, where per-op overhead should not matter."""
    cases = [Case(CPU_EAGER, CPU, large_pointwise_runner(CPU, compiled=False))]
    compile_s = None
    if settings.compile:
        compiled = Case(CPU_COMPILE, CPU, large_pointwise_runner(CPU, compiled=True))
        compile_s = first_call_seconds(compiled)
        cases.append(compiled)
    cases.append(Case(NEURON_EAGER, NEURON, large_pointwise_runner(NEURON, compiled=False)))
    return [Result(
        workload=f"{LARGE_ROUNDS} x (sin*1.01 + cos*0.5), 1M el. (ms)",
        unit="ms", unit_scale=1e3, ops_per_unit=1, target=LARGE_TARGET,
        compile_applies=True, timings=measure(cases, settings), compile_first_call_s=compile_s,
    )]


# (progress label, benchmark) in table order.
BENCHMARKS: list[tuple[str, Callable[[Settings], list[Result]]]] = [
    ("per-op overhead", bench_per_op),
    ("MLP training step", bench_training),
    ("large pointwise", bench_large_pointwise),
]


# --------------------------------------------------------------------------- report


def cpu_model() -> str:
    """The CPU's model name, from /proc/cpuinfo where there is one."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(settings: Settings) -> dict:
    """What the numbers depend on."""
    return {
        "torch": torch.__version__,
        "neuron_lab": neuron_lab.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "repeats": settings.repeats,
        "block_s": settings.block_s,
        "torch_compile": settings.compile,
    }


def format_time(value: float | None, unit: str) -> str:
    """``12.3 µs``-style cell: three significant digits (more for values of 1000 and up)."""
    if value is None:
        return "—"
    decimals = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 2
    return f"{value:.{decimals}f} {unit.split('/')[0]}"


def format_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def compile_cell(result: Result) -> str:
    if not result.compile_applies:
        return "n/a"
    return format_time(result.value(CPU_COMPILE), result.unit) if CPU_COMPILE in result.timings else "skipped"


def markdown_table(results: list[Result]) -> str:
    """The results as a markdown table."""
    header = ["workload", "CPU eager", "CPU compile", "neuron", "neuron/CPU eager",
              "neuron/compile", "target", "met?"]
    rows = [
        [
            result.workload,
            format_time(result.value(CPU_EAGER), result.unit),
            compile_cell(result),
            format_time(result.value(NEURON_EAGER), result.unit),
            format_ratio(result.ratio(CPU_EAGER)),
            format_ratio(result.ratio(CPU_COMPILE)),
            f"<= {result.target:g}x",
            "yes" if result.met else "no",
        ]
        for result in results
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def print_environment(env: dict) -> None:
    print("## Environment\n")
    for key, value in env.items():
        print(f"- {key}: {value}")
    print()


def print_compile_times(results: list[Result]) -> None:
    """First-call times of the compiled cases, which the steady-state table leaves out."""
    timed = [r for r in results if r.compile_first_call_s is not None]
    if not timed:
        return
    print("\ntorch.compile first call (compilation included; Inductor's on-disk cache makes reruns faster):")
    for result in timed:
        print(f"- {result.workload}: {result.compile_first_call_s:.2f} s")


def write_json(path: Path, env: dict, results: list[Result], wall_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"environment": env, "wall_s": wall_s, "results": [r.to_json() for r in results]}
    path.write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: fewer and shorter blocks, no torch.compile")
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"timed blocks per case (default {DEFAULT_REPEATS}, {QUICK_REPEATS} with --quick)")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the raw numbers (every block) to PATH")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    default_repeats = QUICK_REPEATS if args.quick else DEFAULT_REPEATS
    return Settings(
        repeats=args.repeats or default_repeats,
        block_s=QUICK_BLOCK_S if args.quick else DEFAULT_BLOCK_S,
        compile=not args.quick,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    torch.set_num_threads(1)  # before anything is compiled: Inductor bakes the thread count in
    start = time.perf_counter()

    results: list[Result] = []
    for label, bench in BENCHMARKS:
        print(f"running: {label} ...", file=sys.stderr, flush=True)
        results += bench(settings)
    wall_s = time.perf_counter() - start

    env = environment(settings)
    print_environment(env)
    print("## Results (medians; neuron/x > 1 means neuron is slower)\n")
    print(markdown_table(results))
    print_compile_times(results)
    print(f"\nbenchmark wall time: {wall_s:.1f} s")
    if args.json is not None:
        write_json(args.json, env, results, wall_s)
        print(f"raw numbers written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
