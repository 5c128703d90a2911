"""What each family of fast host kernels (neuron_lab.fastpath) gains, on named workloads, at an
equal thread budget: the keep/delete table of issue 47.

For each workload and thread count, one process builds the workload on the ``neuron`` device
and times it in alternating rounds; each round runs every configuration, in a rotating order:
one untimed step after the switch, then ``--inner`` timed steps, waiting for all device work
at the end of the timed region:

  ``on``          every family on (the default);
  ``off``         NEURON_LAB_FASTPATH=off (ATen's kernels only);
  ``-FAMILY``     every family on but FAMILY.

A family's gain on a workload is the median over rounds of time(-FAMILY) / time(on) - 1,
paired within a round (the machine's noise moves both alike). A family that gains under 5%
on every workload pays for nothing it was written for.

    python benchmarks/bench_fastpath.py                      # every workload, default and 1 thread
    python benchmarks/bench_fastpath.py --rounds 7 --workloads gpt2_train
    python benchmarks/bench_fastpath.py --json out.json

The two thread rows: torch's default threads (what a notebook gets) and one thread. The
neuron device runs its launches on a device thread besides the host's; at one thread both
devices' kernels are single-threaded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

WORKLOADS = ["gpt2_train", "llama_train", "llama_generate", "resnet18_train", "unet_train"]


def _sync() -> None:
    import torch

    torch.neuron.synchronize()


def _causal_train(name: str) -> Callable[[], None]:
    import torch
    from hf_models import MODELS

    torch.manual_seed(0)
    model = MODELS[name].build().to("neuron").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 99, (2, 32), generator=g).to("neuron")

    def step() -> None:
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def _llama_generate() -> Callable[[], None]:
    import torch
    from hf_models import MODELS

    torch.manual_seed(0)
    model = MODELS["llama"].build().to("neuron").eval()
    ids = torch.tensor([[5, 7, 9, 11]], device="neuron")

    def step() -> None:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=1)

    return step


def _resnet18_train() -> Callable[[], None]:
    """ResNet-18 (transformers' ResNet, basic blocks 2-2-2-2, BatchNorm), batch 4 x 32x32 (a step
    of 8 x 64x64 takes seconds on the shared 2-core machine): torchvision is not installed here,
    and transformers' model is the same network."""
    import torch
    import transformers as hf

    torch.manual_seed(0)
    config = hf.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                             embedding_size=64, num_labels=10)
    model = hf.ResNetForImageClassification(config).to("neuron").train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 32, 32, generator=g).to("neuron")
    y = torch.randint(0, 10, (4,), generator=g).to("neuron")

    def step() -> None:
        opt.zero_grad()
        model(pixel_values=x, labels=y).loss.backward()
        opt.step()

    return step


def _unet_train() -> Callable[[], None]:
    import diffusers  # noqa: F401  (raises ImportError where it is not installed)

    import torch

    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=16).to("neuron").train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 16, generator=g).to("neuron")
    t = torch.tensor([10, 500]).to("neuron")
    ctx = torch.randn(2, 8, 32, generator=g).to("neuron")

    def step() -> None:
        opt.zero_grad()
        model(x, t, encoder_hidden_states=ctx).sample.square().mean().backward()
        opt.step()

    return step


BUILDERS: dict[str, Callable[[], Callable[[], None]]] = {
    "gpt2_train": lambda: _causal_train("gpt2"),
    "llama_train": lambda: _causal_train("llama"),
    "llama_generate": _llama_generate,
    "resnet18_train": _resnet18_train,
    "unet_train": _unet_train,
}


def measure(workload: str, threads: int | None, rounds: int, warmup: int, inner: int) -> dict:
    """In this process: the timed rounds of one workload (see the module's docstring)."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    import neuron_lab  # noqa: F401
    from neuron_lab import fastpath

    step = BUILDERS[workload]()
    families = fastpath.families()
    configs = ["on", "off"] + [f"-{f}" for f in families]

    def apply(config: str) -> None:
        if config == "off":
            fastpath.set_mode("off")
            return
        fastpath.set_mode("on")
        for f in families:
            fastpath.set_family_enabled(f, config != f"-{f}")

    for config in configs:  # warm every configuration (recorded graphs, caches)
        apply(config)
        for _ in range(warmup):
            step()
        _sync()
    times: dict[str, list[float]] = {c: [] for c in configs}
    cpu_times: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for config in order:
            apply(config)
            step()  # untimed: the first step after a switch finds its recorded graphs again
            _sync()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(inner):
                step()
            _sync()
            times[config].append((time.perf_counter() - start) / inner)
            cpu_times[config].append((time.process_time() - cpu_start) / inner)
    apply("on")
    return {"workload": workload, "threads": threads or torch.get_num_threads(), "times": times,
            "cpu_times": cpu_times}


def summarise(result: dict, key: str = "times") -> dict[str, float]:
    """Per configuration: the median over rounds of its time over 'on''s in the same round
    (``key``: "times", wall-clock, or "cpu_times", the process's CPU time, every thread's)."""
    times = result[key]
    on = times["on"]
    return {c: statistics.median(t / o for t, o in zip(ts, on)) for c, ts in times.items() if c != "on"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="*", default=WORKLOADS, choices=WORKLOADS)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--inner", type=int, default=3, help="timed steps per configuration and round")
    parser.add_argument("--threads", nargs="*", default=["default", "1"])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--one", nargs=2, metavar=("WORKLOAD", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.one:  # the child process of one (workload, threads)
        workload, threads = args.one
        result = measure(workload, None if threads == "default" else int(threads), args.rounds, args.warmup, args.inner)
        print(json.dumps(result))
        return 0

    results = []
    for threads in args.threads:
        for workload in args.workloads:
            print(f"# {workload}, threads {threads}", file=sys.stderr, flush=True)
            proc = subprocess.run(
                [sys.executable, __file__, "--one", workload, threads, "--rounds", str(args.rounds),
                 "--warmup", str(args.warmup), "--inner", str(args.inner)], capture_output=True, text=True, env=os.environ.copy())
            if proc.returncode != 0:
                reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
                print(f"#   skipped: {reason}", file=sys.stderr)
                results.append({"workload": workload, "threads": threads, "skipped": reason})
                continue
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))

    ran = [r for r in results if "skipped" not in r]
    configs = sorted({c for r in ran for c in summarise(r)}, key=lambda c: (c != "off", c))
    for key, title in (("times", "wall-clock"), ("cpu_times", "process CPU time (all threads)")):
        print(f"\n{title}\n")
        print("| workload | threads | median on (s) | " + " | ".join(configs) + " |")
        print("|---|---|---|" + "---|" * len(configs))
        for r in results:
            if "skipped" in r:
                print(f"| {r['workload']} | {r['threads']} | skipped: {r['skipped']} |")
                continue
            s = summarise(r, key)
            cells = " | ".join(f"{s[c]:.3f}" for c in configs)
            print(f"| {r['workload']} | {r['threads']} | {statistics.median(r[key]['on']):.4f} | {cells} |")
    print("\nEach cell: the median over rounds of time(configuration) / time(on) in the same round; "
          "'-F' is every family on but F, so its cell - 1 is what F gains.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
