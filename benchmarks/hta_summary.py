"""A transformers training step (tiny GPT-2 of tests/hf_models.py, no downloads) profiled with
torch.profiler (``ProfilerActivity.CPU`` and ``ProfilerActivity.PrivateUse1``): its
``key_averages()`` table with the device's time, then its Chrome trace read by Holistic Trace
Analysis (``pip install HolisticTraceAnalysis``): the temporal breakdown, the kernel breakdown
and the idle time of the device's streams.

Usage: python benchmarks/hta_summary.py [--model gpt2] [--steps 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

import neuron_lab  # noqa: F401 - the neuron device

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from hf_models import MODELS, make_batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2", choices=sorted(MODELS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the trace (default: a new temporary one)")
    args = parser.parse_args()
    import pandas as pd
    from hta.trace_analysis import TraceAnalysis

    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 12)
    spec = MODELS[args.model]
    torch.manual_seed(0)
    model = spec.build().to("neuron")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: v.to("neuron") for k, v in make_batch(spec.kind, torch.Generator().manual_seed(0), 4, 32).items()}

    def step() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(3):
        step().item()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True) as prof:
        for _ in range(args.steps):
            loss = step()
        loss.item()
    print(f"{args.model}: {args.steps} training steps, torch {torch.__version__}, mode {neuron_lab.get_mode()}\n")
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=15))
    folder = args.out or tempfile.mkdtemp(prefix="neuron_hta_")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "rank0_trace.json")
    prof.export_chrome_trace(path)
    print(f"trace: {path}\n")
    analyzer = TraceAnalysis(trace_dir=folder)
    print()
    print("HTA temporal breakdown (per rank):")
    print(analyzer.get_temporal_breakdown(visualize=False).to_string(index=False))
    kernel_types, kernels = analyzer.get_gpu_kernel_breakdown(visualize=False)
    print("\nHTA kernel type breakdown:")
    print(kernel_types.to_string(index=False))
    print("\nHTA kernel breakdown (top 10 by time):")
    by_time = next((c for c in kernels.columns if c.startswith("sum")), kernels.columns[-1])
    print(kernels.sort_values(by_time, ascending=False).head(10).to_string(index=False))
    idle = analyzer.get_idle_time_breakdown(visualize=False)[0]
    print("\nHTA idle time breakdown:")
    print(idle.to_string(index=False))


if __name__ == "__main__":
    main()
