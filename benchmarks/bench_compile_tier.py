"""The compiled tier (``neuron_lab.configure(compile=True)``): how long a hot graph takes to
get compiled, and what the user's steps cost while it compiles and once it has (issue 46).

Each measurement runs in a fresh Python process (one thread, an empty cache and temporary
directory, so every compile is cold, precompiled headers included, as a user's first run is). Per round the parent runs, back to back
in an order that reverses every round: the CPU's eager loop, and the compiled tier of each
source tree given (``--tree LABEL=PATH``, e.g. the main branch's checkout for "before" and
this one for "after"; the trees share the installed torch and C++ extension). Reported:
medians over rounds of

  to compiled   seconds from the step whose launch made the graph hot (``compiles_requested``)
                to the first step after its code was installed (``compiles_succeeded``)
  compile       the runtime's own compile time (``counters()["compile_seconds"]``)
  while         ms per step while the compile runs (the steps between those two)
  compiled      ms per step of 40 steps once the compiled code runs
  CPU           ms per step of the CPU's eager loop in the same round; the ratios
                (while / CPU, compiled / CPU) are medians of each round's paired ratio

Workloads: ``chain`` (1M elements, 5 x (sin*1.01 + cos*0.5), ``.sum().item()``) and ``mlp``
(3 x Linear(256), batch 64, SGD momentum, ``loss.item()``).
Usage: .venv/bin/python benchmarks/bench_compile_tier.py [--rounds N] [--tree LABEL=PATH ...]
                                                         [--workloads chain,mlp]
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

ROOT = Path(__file__).resolve().parents[1]
MAX_SECONDS, COMPILED_STEPS = 400.0, 40


# ---- the child: one workload, in this fresh process ----------------------------------------

def _workload(name: str, device: str):
    import torch
    torch.manual_seed(0)
    if name == "chain":
        x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0)).to(device)

        def step() -> None:
            y = x
            for _ in range(5):
                y = y.sin() * 1.01 + y.cos() * 0.5
            y.sum().item()

        return step
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    data = torch.randn(64, 256).to(device), torch.randn(64, 256).to(device)

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[0]), data[1])
        loss.backward()
        opt.step()
        loss.item()

    return step


def child(workload: str, mode: str) -> dict:
    import torch
    torch.set_num_threads(1)
    if mode == "cpu":
        step = _workload(workload, "cpu")
        for _ in range(5):
            step()
        times = []
        for _ in range(COMPILED_STEPS):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        return {"step_s": statistics.median(times)}
    import neuron_lab
    from neuron_lab import adaptive_eager as ae
    neuron_lab.configure(compile=True)
    step = _workload(workload, "neuron")
    begin = time.perf_counter()
    requested_at = installed_at = None
    while_compiling, compiled = [], []
    while time.perf_counter() - begin < MAX_SECONDS:
        start = time.perf_counter()
        step()
        end = time.perf_counter()
        counters = ae.counters()
        if requested_at is None:
            if counters["compiles_requested"]:
                requested_at = end
            continue
        if installed_at is None:
            while_compiling.append(end - start)
            if counters["compiles_succeeded"] + counters["compiles_failed"] >= counters["compiles_requested"]:
                installed_at = end
            continue
        compiled.append(end - start)
        if len(compiled) == COMPILED_STEPS:
            break
    counters = ae.counters()
    return {"to_compiled_s": (installed_at - requested_at) if installed_at else None,
            "compile_s": counters["compile_seconds"], "compiles": counters["compiles_succeeded"],
            "failed": counters["compiles_failed"], "compiled_launches": counters["compiled_launches"],
            "while_s": statistics.median(while_compiling) if while_compiling else None,
            "compiled_s": statistics.median(compiled) if compiled else None}


# ---- the parent -----------------------------------------------------------------------------

def run_child(workload: str, mode: str, tree: str | None) -> dict:
    env = dict(os.environ)
    if tree:
        env["PYTHONPATH"] = os.pathsep.join([tree] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    with tempfile.TemporaryDirectory() as cache:  # a cold compile, as in a user's first run
        # Inductor's precompiled headers live in the temporary directory's torchinductor_<user>
        # whatever its cache variable says: a fresh one each run, so they are cold too.
        os.mkdir(os.path.join(cache, "system-tmp"))
        env.update(NEURON_LAB_CACHE_DIR=cache, TORCHINDUCTOR_CACHE_DIR=os.path.join(cache, "inductor"),
                   XDG_CACHE_HOME=cache, TMPDIR=os.path.join(cache, "system-tmp"))
        out = subprocess.run([sys.executable, __file__, "--child", workload, mode], capture_output=True, text=True,
                             env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{workload}/{mode} ({tree}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH",
                        help="a source tree to import neuron_lab from (default: this one, as 'this tree')")
    parser.add_argument("--workloads", default="chain,mlp")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    trees = dict(t.split("=", 1) for t in args.tree) or {"this tree": str(ROOT)}
    rows = []
    for workload in args.workloads.split(","):
        results: dict[str, list[dict]] = {label: [] for label in ["CPU", *trees]}
        for r in range(args.rounds):
            order = ["CPU", *trees]
            for label in (order if r % 2 == 0 else order[::-1]):
                result = run_child(workload, "cpu" if label == "CPU" else "tier", trees.get(label))
                results[label].append(result)
                print(f"{workload} round {r} {label}: {result}", file=sys.stderr, flush=True)
        cpu = [x["step_s"] for x in results["CPU"]]
        for label in trees:
            runs = results[label]

            def med(key: str, runs=runs) -> float:
                values = [x[key] for x in runs if x[key] is not None]
                return statistics.median(values) if values else float("nan")

            def paired(key: str, runs=runs) -> float:
                values = [x[key] / c for x, c in zip(runs, cpu) if x[key] is not None]
                return statistics.median(values) if values else float("nan")

            rows.append((workload, label, med("to_compiled_s"), med("compile_s"), med("while_s"), med("compiled_s"),
                         statistics.median(cpu), paired("while_s"), paired("compiled_s"),
                         sum(x["failed"] for x in runs)))
    print("| workload | tree | to compiled | compile | step while compiling | step compiled | CPU step | "
          "while / CPU | compiled / CPU | failed compiles |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for w, label, to_compiled, compile_s, while_s, compiled_s, cpu_s, while_ratio, compiled_ratio, failed in rows:
        print(f"| {w} | {label} | {to_compiled:.1f} s | {compile_s:.1f} s | {while_s * 1e3:.2f} ms | "
              f"{compiled_s * 1e3:.2f} ms | {cpu_s * 1e3:.2f} ms | {while_ratio:.2f} | {compiled_ratio:.2f} | "
              f"{failed} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
