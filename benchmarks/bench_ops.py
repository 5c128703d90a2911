#!/usr/bin/env python
"""One op at a time: the ``neuron`` device's cost of running an op at once against CPU eager's,
on the small shapes of the tiny models, and the path each op takes on the device.

A model's step is a few hundred such ops; where one op costs several times the CPU's, a model
that calls it often pays for it in every step, whatever the rest of the device does. The sweep
finds those ops: every op of the list is timed on both devices, and the device's counters say
which path it took (a fast host kernel, the unboxed path, or the boxed fallback, which copies
its arguments into a stack of IValues).

Method: one process, one intra-op thread, the device in blocking mode (every op runs at once and
is finished when it returns: nothing is recorded or queued). Per op, ``--rounds`` rounds; in
each, a block of ``--calls`` calls on the CPU and one on the device, in turns (the order
alternates round by round). The ratio is the median over rounds of device time / CPU time in the
same round.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_ops.py
    PYTHONPATH=. .venv/bin/python benchmarks/bench_ops.py --only index sgn topk --rounds 15
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

Inputs = dict[str, torch.Tensor]
CASES: list[tuple[str, Callable[[Inputs], object]]] = [
    ("add", lambda t: t["x"] + t["y"]),
    ("add scalar", lambda t: t["x"] + 1.0),
    ("add_", lambda t: t["acc"].add_(t["x"])),
    ("mul", lambda t: t["x"] * t["y"]),
    ("mul_", lambda t: t["acc"].mul_(0.999)),
    ("div", lambda t: t["x"] / t["pos"]),
    ("neg", lambda t: -t["x"]),
    ("exp", lambda t: t["x"].exp()),
    ("log", lambda t: t["pos"].log()),
    ("sqrt", lambda t: t["pos"].sqrt()),
    ("rsqrt", lambda t: t["pos"].rsqrt()),
    ("pow 2", lambda t: t["x"].pow(2)),
    ("abs", lambda t: t["x"].abs()),
    ("sgn", lambda t: t["x"].sgn()),
    ("sign", lambda t: t["x"].sign()),
    ("clamp", lambda t: t["x"].clamp(-1, 1)),
    ("tanh", lambda t: t["x"].tanh()),
    ("sigmoid", lambda t: t["x"].sigmoid()),
    ("silu", lambda t: torch.nn.functional.silu(t["x"])),
    ("gelu", lambda t: torch.nn.functional.gelu(t["x"])),
    ("relu", lambda t: t["x"].relu()),
    ("where", lambda t: torch.where(t["mask"], t["x"], t["y"])),
    ("masked_fill", lambda t: t["x"].masked_fill(t["mask"], 0.0)),
    ("mask & row mask", lambda t: t["mask"] & t["mask"][0]),  # a padding mask and a causal one, broadcast
    ("eq", lambda t: t["ids"] == 3),
    ("lt", lambda t: t["x"] < t["y"]),
    ("softmax", lambda t: t["x"].softmax(-1)),
    ("log_softmax", lambda t: t["x"].log_softmax(-1)),
    ("layer_norm", lambda t: torch.nn.functional.layer_norm(t["x"], (32,))),
    ("sum(-1)", lambda t: t["x"].sum(-1)),
    ("sum(0)", lambda t: t["x"].sum(0)),
    ("mean(-1)", lambda t: t["x"].mean(-1, keepdim=True)),
    ("amax(-1)", lambda t: t["x"].amax(-1)),
    ("max(dim)", lambda t: t["x"].max(-1)),
    ("argmax", lambda t: t["x"].argmax(-1)),
    ("topk", lambda t: t["x"].topk(2, dim=-1)),
    ("sort", lambda t: t["x"].sort(-1)),
    ("cumsum", lambda t: t["x"].cumsum(-1)),
    ("var", lambda t: t["x"].var(-1)),
    ("norm", lambda t: t["x"].norm()),
    ("mm", lambda t: t["x2d"] @ t["w"]),
    ("mm transposed", lambda t: t["x2d"].t() @ t["x2d"]),
    ("linear", lambda t: torch.nn.functional.linear(t["x"], t["w"], t["b"])),
    ("bmm", lambda t: t["x"] @ t["x"].transpose(-1, -2)),
    ("index", lambda t: t["x2d"][t["idx"]]),
    ("index_select", lambda t: t["x2d"].index_select(0, t["idx"])),
    ("gather", lambda t: t["x"].gather(-1, t["gidx"])),
    ("scatter", lambda t: t["x"].scatter(-1, t["gidx"], 1.0)),
    ("index_add_", lambda t: t["acc2d"].index_add_(0, t["idx"], t["rows"])),
    ("index_put_", lambda t: t["acc2d"].index_put_((t["idx"],), t["rows"])),
    ("embedding", lambda t: torch.nn.functional.embedding(t["ids"], t["w"])),
    ("one_hot", lambda t: torch.nn.functional.one_hot(t["ids"], 32)),
    ("cat", lambda t: torch.cat([t["x"], t["y"]], -1)),
    ("stack", lambda t: torch.stack([t["x"], t["y"]])),
    ("contiguous (transposed)", lambda t: t["x"].transpose(1, 2).contiguous()),
    ("clone", lambda t: t["x"].clone()),
    ("to float64", lambda t: t["x"].double()),
    ("zeros_like", lambda t: torch.zeros_like(t["x"])),
    ("triu", lambda t: t["sq"].triu(1)),
    ("repeat", lambda t: t["x"].repeat(1, 2, 1)),
    ("flip", lambda t: t["x"].flip(-1)),
    ("addcmul_", lambda t: t["acc"].addcmul_(t["x"], t["y"], value=0.1)),
    ("lerp_", lambda t: t["acc"].lerp_(t["x"], 0.1)),
    ("cross_entropy", lambda t: torch.nn.functional.cross_entropy(t["x2d"], t["target"])),
    ("mse_loss", lambda t: torch.nn.functional.mse_loss(t["x"], t["y"])),
    ("sdpa", lambda t: torch.nn.functional.scaled_dot_product_attention(t["q"], t["q"], t["q"], is_causal=True)),
    ("conv2d", lambda t: torch.nn.functional.conv2d(t["img"], t["kernel"], padding=1)),
    ("max_pool2d", lambda t: torch.nn.functional.max_pool2d(t["img"], 2)),
    ("group_norm", lambda t: torch.nn.functional.group_norm(t["img"], 2)),
    ("interpolate", lambda t: torch.nn.functional.interpolate(t["img"], scale_factor=2.0, mode="nearest")),
]


def inputs(device: str) -> Inputs:
    """The tiny models' shapes: a batch of 2 x 12 tokens of width 32, and a 2 x 4 x 8 x 8 image."""
    g = torch.Generator().manual_seed(0)
    t = {
        "x": torch.randn(2, 12, 32, generator=g), "y": torch.randn(2, 12, 32, generator=g),
        "pos": torch.rand(2, 12, 32, generator=g) + 0.5, "acc": torch.zeros(2, 12, 32),
        "mask": torch.rand(2, 12, 32, generator=g) > 0.5, "x2d": torch.randn(24, 32, generator=g),
        "w": torch.randn(32, 32, generator=g), "b": torch.randn(32, generator=g),
        "idx": torch.tensor([1, 5, 7, 9, 11, 13]), "rows": torch.randn(6, 32, generator=g),
        "acc2d": torch.zeros(24, 32), "gidx": torch.randint(0, 32, (2, 12, 4), generator=g),
        "ids": torch.randint(0, 32, (2, 12), generator=g), "target": torch.randint(0, 32, (24,), generator=g),
        "sq": torch.randn(12, 12, generator=g), "q": torch.randn(2, 4, 12, 8, generator=g),
        "img": torch.randn(2, 4, 8, 8, generator=g), "kernel": torch.randn(4, 4, 3, 3, generator=g),
    }
    return {k: v.to(device) for k, v in t.items()}


PATH_COUNTERS = ("host_kernel_ops", "unboxed_ops", "fallback_ops")


def path_of(run: Callable[[], object]) -> str:
    """Which way the device ran one call: each op it ran, as fast / unboxed / boxed counts."""
    from neuron_lab.device.trace import device_counters

    before = device_counters()
    run()
    after = device_counters()
    fast, unboxed, fallback = (after[k] - before[k] for k in PATH_COUNTERS)
    boxed = fallback - unboxed
    return f"{fast} / {unboxed - fast} / {boxed}"


def timed_block(run: Callable[[], object], calls: int, sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        run()
    sync()
    return (time.perf_counter() - start) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed block")
    parser.add_argument("--only", nargs="*", help="ops by name (default: every op)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import neuron_lab

    neuron_lab.set_mode("blocking")
    torch.set_num_threads(1)
    cpu, neuron = inputs("cpu"), inputs("neuron")
    rows = []
    for name, op in CASES:
        if args.only and name not in args.only:
            continue
        runs = {"cpu": lambda op=op: op(cpu), "neuron": lambda op=op: op(neuron)}
        syncs = {"cpu": lambda: None, "neuron": torch.neuron.synchronize}
        for device in runs:  # warm up both
            timed_block(runs[device], 20, syncs[device])
        samples: dict[str, list[float]] = {"cpu": [], "neuron": []}
        for r in range(args.rounds):
            for device in (("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")):
                samples[device].append(timed_block(runs[device], args.calls, syncs[device]))
        ratio = statistics.median(n / c for n, c in zip(samples["neuron"], samples["cpu"]))
        rows.append({"op": name, "cpu_us": statistics.median(samples["cpu"]) * 1e6,
                     "neuron_us": statistics.median(samples["neuron"]) * 1e6, "ratio": ratio,
                     "path": path_of(runs["neuron"])})
    print("| op | cpu (us) | neuron (us) | neuron / cpu | device ops: fast / unboxed / boxed |")
    print("|---|---|---|---|---|")
    for row in sorted(rows, key=lambda row: -row["ratio"]):
        print(f"| {row['op']} | {row['cpu_us']:.2f} | {row['neuron_us']:.2f} | {row['ratio']:.2f}x | {row['path']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
