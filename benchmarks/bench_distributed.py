#!/usr/bin/env python
"""Benchmark distributed training on ``neuron`` against gloo on CPU tensors, in the same run.

1. ``all_reduce`` bus bandwidth against message size (4 KiB to 64 MiB, float32 SUM) on 2
   ranks: the neuron backend on neuron tensors, and gloo on CPU tensors in the same
   processes (the neuron backend moves its bytes with gloo, so the difference is what the
   device adds: its flush, the ranks' agreement on shapes, the launch bookkeeping).
2. A DDP training step of a small MLP (3 x Linear(512, 512), batch 64 per rank, SGD):
   1 rank vs 2 ranks on neuron, and 2 ranks of gloo on CPU; each in fresh processes,
   reported over the first 10 steps (what a user feels) and in steady state.

Method: ``torchrun --standalone`` launches the ranks (one intra-op thread each). For each
message size the two backends take turns block by block (a barrier starts each block);
the figure is the median over blocks of the time per call on rank 0. Bus bandwidth uses
nccl-tests' convention for all_reduce: ``2 (n-1)/n x bytes / time``.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_distributed.py            # about 2 minutes
    .venv/bin/python benchmarks/bench_distributed.py --quick    # smoke test
    .venv/bin/python benchmarks/bench_distributed.py --json benchmarks/results/distributed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 1 << 20, 16 << 20]


def _launch(nproc: int, worker: str, out: Path, quick: bool) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               __file__, "--worker", worker, "--out", str(out)] + (["--quick"] if quick else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{worker} on {nproc} ranks failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")


# ---- rank side -------------------------------------------------------------------------------
def _rank_setup():
    import torch
    import torch.distributed as dist

    import neuron_lab  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("neuron")
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    return torch, dist, device


def _worker_all_reduce(out: Path, quick: bool) -> None:
    torch, dist, device = _rank_setup()
    gloo = dist.new_group(backend="gloo")
    n = dist.get_world_size()
    rows = []
    for size in (QUICK_SIZES if quick else SIZES):
        numel = size // 4
        on_device = torch.ones(numel, device=device)
        on_cpu = torch.ones(numel)
        calls = max(2, min(200, (8 << 20) // size))  # about 8 MiB of traffic per block
        cases = {"neuron": lambda: dist.all_reduce(on_device), "gloo_cpu": lambda: dist.all_reduce(on_cpu, group=gloo)}
        for run in cases.values():  # warm up
            run()
        per_call: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(3 if quick else 9):
            for name, run in cases.items():
                dist.barrier(group=gloo)
                start = time.perf_counter()
                for _ in range(calls):
                    run()
                if name == "neuron":
                    torch.neuron.synchronize()
                per_call[name].append((time.perf_counter() - start) / calls)
        median = {name: statistics.median(times) for name, times in per_call.items()}
        bus = {name: 2 * (n - 1) / n * size / t / 1e9 for name, t in median.items()}
        rows.append({"bytes": size, "seconds": median, "bus_gbps": bus, "calls_per_block": calls})
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"world": n, "rows": rows}))
    dist.destroy_process_group()


def _worker_ddp(out: Path, quick: bool, backend_device: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    import neuron_lab  # noqa: F401

    torch.set_num_threads(1)
    if backend_device == "neuron":
        dist.init_process_group("neuron")
        device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
        torch.neuron.set_device(device)
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 512, device=device)
    y = torch.randn(64, 512, device=device)
    steps = 20 if quick else 60
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        loss.item()  # the user's read of the loss: the step is done
        times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"times": times}))
    dist.destroy_process_group()


# ---- parent ---------------------------------------------------------------------------------
def _format_bytes(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes, blocks and steps (a smoke test)")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "all_reduce":
        return _worker_all_reduce(args.out, args.quick)
    if args.worker in ("ddp_neuron", "ddp_cpu"):
        return _worker_ddp(args.out, args.quick, args.worker.split("_")[1])

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "all_reduce.json"
        print("all_reduce sweep on 2 ranks ...", file=sys.stderr)
        _launch(2, "all_reduce", out, args.quick)
        results["all_reduce"] = json.loads(out.read_text())
        results["ddp"] = {}
        for label, nproc, worker in (("neuron, 1 rank", 1, "ddp_neuron"), ("neuron, 2 ranks", 2, "ddp_neuron"),
                                     ("gloo CPU, 2 ranks", 2, "ddp_cpu")):
            print(f"DDP step, {label} ...", file=sys.stderr)
            out = Path(tmp) / f"{worker}{nproc}.json"
            _launch(nproc, worker, out, args.quick)
            results["ddp"][label] = json.loads(out.read_text())["times"]

    print("## all_reduce, 2 ranks, float32 SUM (median time per call on rank 0; bus bandwidth)\n")
    print("| message | neuron | gloo on CPU | neuron / gloo | neuron bus GB/s | gloo bus GB/s |")
    print("|---|---|---|---|---|---|")
    for row in results["all_reduce"]["rows"]:
        s, b = row["seconds"], row["bus_gbps"]
        print(f"| {_format_bytes(row['bytes'])} | {s['neuron'] * 1e3:.3f} ms | {s['gloo_cpu'] * 1e3:.3f} ms | "
              f"{s['neuron'] / s['gloo_cpu']:.2f}x | {b['neuron']:.3f} | {b['gloo_cpu']:.3f} |")
    print("\n## DDP step: MLP 3 x Linear(512, 512), batch 64 per rank, SGD, fresh processes\n")
    print("| run | first 10 steps (median) | steps 11+ (median) | first step |")
    print("|---|---|---|---|")
    for label, times in results["ddp"].items():
        print(f"| {label} | {statistics.median(times[:10]) * 1e3:.2f} ms | {statistics.median(times[10:]) * 1e3:.2f} ms | "
              f"{times[0] * 1e3:.1f} ms |")
    one, two = (statistics.median(results["ddp"][k][10:]) for k in ("neuron, 1 rank", "neuron, 2 ranks"))
    print(f"\n2 ranks / 1 rank (steady step time, same batch per rank): {two / one:.2f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
