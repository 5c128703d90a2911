"""Host cost of recording an op with and without its source line, in ops per second.

Adaptive mode records each op lazily and, with ``capture_source`` (the default), reads the
caller's source line from the frame stack (device/csrc/tracing/source.cpp). A chain of tiny ops
(64 floats: the host cost dominates) is timed with the capture on and off, interleaved;
medians of the repeats. Run it from two checkouts with the same environment to compare
builds, e.g. before and after a change to source.cpp:

    PYTHONPATH=/path/to/checkout .venv/bin/python benchmarks/bench_source_lines.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import neuron_lab
from neuron_lab import adaptive_eager as ae

__all__ = ["ops_per_second", "main"]


def step(x: torch.Tensor) -> torch.Tensor:
    return x * 1.0001 + 0.5  # two recorded ops


def ops_per_second(capture_source: bool, ops: int) -> float:
    """Recorded ops per second for ``ops`` tiny ops, including their launches."""
    ae.configure(capture_source=capture_source)
    x = torch.ones(64, device="neuron")
    for _ in range(200):  # warm: graphs cached, line tables filled
        x = step(x)
    torch.neuron.synchronize()
    start = time.perf_counter()
    for _ in range(ops // 2):
        x = step(x)
    torch.neuron.synchronize()
    return ops / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--ops", type=int, default=20000)
    args = parser.parse_args()
    neuron_lab.set_mode("adaptive")
    runs: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.repeats):
        for capture in (True, False):
            runs[capture].append(ops_per_second(capture, args.ops))
    ae.configure(capture_source=True)
    on, off = statistics.median(runs[True]), statistics.median(runs[False])
    print(json.dumps({
        "checkout": neuron_lab.__file__,
        "ops_per_s_with_source": round(on),
        "ops_per_s_without_source": round(off),
        "capture_ns_per_op": round((1 / on - 1 / off) * 1e9),
        "runs_with_source": [round(v) for v in runs[True]],
    }))


if __name__ == "__main__":
    main()
