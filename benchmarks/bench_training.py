#!/usr/bin/env python
"""The ``neuron`` device's default mode against CPU eager (and CPU torch.compile) on training
steps and generation, at an equal thread budget: issue 47's speed targets.

Method:

* **Equal thread budget.** Three rows per workload: torch's default intra-op threads on both
  devices (what a notebook gets), and one thread on both (``torch.set_num_threads(1)`` before
  anything runs; the neuron device's kernels, on its device thread or on the host thread, use
  the thread count of the code that launched them), pinned to one core; and ``1:unpinned``, one
  thread with every core left usable: fewer kernel threads than cores, as torch's default gives
  on a machine with SMT and ``torchrun`` gives each process, where the neuron device runs its
  launches on a device thread (``neuron_lab/device/launches.py``).
* **One device per process.** Each configuration (cpu, neuron, cpu_compile) of a workload runs in
  a fresh worker process of its own, so its peak RSS (``ru_maxrss``) is that device's alone. The
  workers build the workload and warm up, then the parent runs them in alternating rounds: in
  each round every worker in turn (rotating order) runs ``--inner`` steps and waits for all its
  device work (``torch.accelerator.synchronize()``) before the next worker starts, so the two
  devices' work never overlaps.
* **Paired ratios.** A ratio is the median over rounds of time(config) / time(cpu) in the same
  round (the machine's load moves both alike).
* **Fresh pairs.** A process's speed moves over seconds and differs from one start to the next:
  on this VM six fresh CPU processes of tiny Mixtral ran five blocks of 60 steps each at 4.0-4.2
  ms in one process and 4.5-6.4 ms in others. Rounds inside one pair of processes cannot average
  out what a start decides. ``--pairs N`` repeats the whole measurement with N fresh sets of
  workers, one set after the other; the ratio is the median over every round of every pair, and
  the table shows the range of the pairs' own medians.
* **First 20 iterations.** ``resnet18_first20``: each round starts a fresh pair of processes that
  build ResNet-18 and time their first 20 steps (recording, graph building and caches included).

The neuron worker also reports, per step, the process's CPU time over wall time, the CPU time of
the host thread and of the device's other threads, and the device counters (host waits, launches,
ops run inline).

    PYTHONPATH=. python benchmarks/bench_training.py            # full run (see README for its length)
    PYTHONPATH=. python benchmarks/bench_training.py --quick    # smoke test
    PYTHONPATH=. python benchmarks/bench_training.py --workloads gpt2_tiny --threads 1 --json out.json
    PYTHONPATH=. python benchmarks/bench_training.py --workloads tiny_mixtral tiny_t5 --threads default
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import training_workloads  # noqa: E402

FIRST20 = "resnet18_first20"
WORKLOADS = training_workloads.WORKLOADS + [FIRST20]
CONFIGS = ["cpu", "neuron", "cpu_compile"]
TARGET = 1.1  # issue 47: default mode <= 1.1x CPU eager, peak RSS <= 1.1x


# --------------------------------------------------------------------------- worker process


def _thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds (user + system) of each thread of this process, by thread id (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return out


def _device_counters() -> dict[str, float]:
    from neuron_lab.adaptive_eager import stats
    from neuron_lab.device.trace import device_counters

    c = stats.counters()
    d = device_counters()
    syncs = c.get("syncs", {})
    return {"host_waits": sum(syncs.values()) if isinstance(syncs, dict) else syncs,
            "launches": c.get("launches", 0), "inline_ops": c.get("inline_ops", 0),
            "ops_recorded": c.get("ops_recorded", 0), "compiled_launches": c.get("compiled_launches", 0),
            "run_by_waiting_host": d.get("launches_run_by_waiting_host", 0),
            "device_thread_wakeups": d.get("device_thread_wakeups", 0)}


def thread_count(threads: str) -> int | None:
    """A row's ``torch.set_num_threads`` (None: torch's default): ``N`` or ``N:unpinned``."""
    return None if threads == "default" else int(threads.partition(":")[0])


def pin_to_cores(threads: str) -> None:
    """A row of N threads gets N cores (the first N this process may use) for all the process's
    threads: the neuron device's host thread records while its device thread runs kernels, so
    ``torch.set_num_threads`` alone would let it use N cores more than the CPU does. An
    ``N:unpinned`` row keeps every core."""
    count = thread_count(threads)
    if count is None or threads.endswith(":unpinned") or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))[:count]
    for tid in os.listdir("/proc/self/task"):  # the threads already started (importing torch starts one)
        os.sched_setaffinity(int(tid), cores)


def apply_fastpath(config: str) -> None:
    """``neuron:off`` runs ATen's kernels only, ``neuron:-FAMILY`` every fast-path family but
    FAMILY (bench_fastpath.py), set before the workload's first op; plain ``neuron`` leaves the default."""
    variant = config.partition(":")[2]
    if not variant:
        return
    from neuron_lab import fastpath

    if variant == "off":
        fastpath.set_mode("off")
    elif variant.startswith("-") and variant[1:] in fastpath.families():
        fastpath.set_family_enabled(variant[1:], False)
    else:
        raise ValueError(f"unknown fast-path variant {variant!r}: use off or -FAMILY, FAMILY one of {fastpath.families()}")


def worker(workload: str, config: str, threads: str, first: int, warmup: int, pin: bool = True) -> int:
    """Builds ``workload`` for ``config`` and answers the parent's commands on stdin, one JSON
    line each on stdout: ``run N`` (time N steps), ``quit`` (report peak RSS and exit)."""
    if pin:
        pin_to_cores(threads)  # threads started later inherit it
    import torch

    if thread_count(threads) is not None:
        torch.set_num_threads(thread_count(threads))
    device = "cpu"
    if config.split(":")[0] == "neuron":
        import neuron_lab  # noqa: F401

        device = "neuron"
        apply_fastpath(config)
    step = training_workloads.build(workload, device, compile_model=config == "cpu_compile")
    host_tid = threading.get_native_id()

    def sync() -> None:
        if device != "cpu":
            torch.accelerator.synchronize()

    def timed(n: int) -> dict:
        counters0 = _device_counters() if device != "cpu" else {}
        threads0 = _thread_cpu_seconds()
        sync()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            step()
        sync()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        threads1 = _thread_cpu_seconds()
        host = threads1.get(host_tid, 0.0) - threads0.get(host_tid, 0.0)
        others = sum(v - threads0.get(t, 0.0) for t, v in threads1.items() if t != host_tid)
        out = {"wall": wall / n, "cpu": cpu / n, "host_cpu": host / n, "other_cpu": others / n}
        if device != "cpu":
            counters1 = _device_counters()
            out["counters"] = {k: (counters1[k] - counters0[k]) / n for k in counters1}
        return out

    def reply(obj: dict) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    if first:  # a fresh process's first steps, then exit
        result = timed(first)
        result["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        reply(result)
        return 0
    first_step = timed(1)
    for _ in range(max(warmup - 1, 0)):
        step()
    sync()
    reply({"ready": True, "first_step": first_step["wall"]})
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "run":
            reply(timed(int(cmd[1])))
        elif cmd[0] == "quit":
            reply({"maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
            return 0
    return 0


# --------------------------------------------------------------------------- parent


class Worker:
    """A worker process of one (workload, config, threads), driven over pipes."""

    pin = True

    def __init__(self, workload: str, config: str, threads: str, warmup: int, first: int = 0) -> None:
        self.config = config
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", workload, config, threads, "--first", str(first),
             "--warmup", str(warmup)] + ([] if self.pin else ["--no-pin"]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ.copy())

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read().strip().splitlines()
            raise RuntimeError(f"{self.config} worker ended: {err[-1] if err else self.proc.wait()}")
        return json.loads(line)

    def send(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run_steady(workload: str, threads: str, configs: list[str], rounds: int, inner: int, warmup: int,
               settle_s: float = 0.0) -> dict:
    """Alternating rounds of ``inner`` steps per config; every config's worker is a fresh process.
    Each turn starts ``settle_s`` after the previous one ended (see ``--settle-ms``)."""
    workers = []
    try:
        first = {}
        for config in configs:  # started one at a time: their builds and warm-ups do not overlap
            w = Worker(workload, config, threads, warmup)
            workers.append(w)
            first[config] = w.read()["first_step"]
        samples: dict[str, list[dict]] = {c: [] for c in configs}
        for r in range(rounds):
            order = workers[r % len(workers):] + workers[:r % len(workers)]
            for w in order:
                time.sleep(settle_s)  # between timed regions: the previous worker's idle threads stop spinning
                samples[w.config].append(w.send(f"run {inner}"))
        rss = {w.config: w.send("quit")["maxrss_kb"] for w in workers}
    finally:
        for w in workers:
            w.close()
    return {"workload": workload, "threads": threads, "samples": samples, "maxrss_kb": rss, "first_step": first}


def run_pairs(workload: str, threads: str, configs: list[str], pairs: int, rounds: int, inner: int, warmup: int,
              settle_s: float = 0.0) -> dict:
    """``run_steady`` with ``pairs`` fresh sets of workers, one set after the other: every
    round of every pair pooled in ``samples``, each pair's own ratio in ``pair_ratios`` and
    peak RSS as the median over pairs."""
    runs = [run_steady(workload, threads, configs, rounds, inner, warmup, settle_s) for _ in range(pairs)]
    if len(runs) == 1:
        return runs[0]
    return {"workload": workload, "threads": threads,
            "samples": {c: [x for r in runs for x in r["samples"][c]] for c in configs},
            "maxrss_kb": {c: statistics.median(r["maxrss_kb"][c] for r in runs) for c in configs},
            "first_step": runs[0]["first_step"],
            "pair_ratios": [paired_ratio(r, "neuron") for r in runs]}


def run_first(threads: str, configs: list[str], rounds: int, steps: int = 20) -> dict:
    """Per round, a fresh process per config times its first ``steps`` ResNet-18 steps."""
    samples: dict[str, list[dict]] = {c: [] for c in configs}
    rss: dict[str, int] = {}
    for r in range(rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for config in order:
            w = Worker("resnet18", config, threads, 0, first=steps)
            try:
                result = w.read()
            finally:
                w.close()
            for key in ("wall", "cpu", "host_cpu", "other_cpu"):
                result[key] *= steps  # the 20 steps' total
            samples[config].append(result)
            rss[config] = max(rss.get(config, 0), result["maxrss_kb"])
    return {"workload": FIRST20, "threads": threads, "samples": samples, "maxrss_kb": rss, "first_step": {}}


def paired_ratio(result: dict, config: str, key: str = "wall") -> float:
    s = result["samples"]
    return statistics.median(a[key] / b[key] for a, b in zip(s[config], s["cpu"]))


def report(results: list[dict], configs: list[str]) -> None:
    print("\n| workload | threads | cpu eager (ms) | neuron (ms) | neuron / cpu | target met? | "
          "CPU time neuron / cpu | cpu_compile / cpu | RSS neuron / cpu | neuron CPU-s per wall-s (host + other threads) | "
          "per step: host waits / launches / inline ops |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "skipped" in r:
            print(f"| {r['workload']} | {r['threads']} | skipped: {r['skipped']} ||||||||")
            continue
        s = r["samples"]
        cpu_ms = statistics.median(x["wall"] for x in s["cpu"]) * 1e3
        neu_ms = statistics.median(x["wall"] for x in s["neuron"]) * 1e3
        ratio = paired_ratio(r, "neuron")
        cpu_ratio = paired_ratio(r, "neuron", "cpu")
        comp = f"{paired_ratio(r, 'cpu_compile'):.2f}x" if "cpu_compile" in s else "n/a"
        rss = r["maxrss_kb"]["neuron"] / r["maxrss_kb"]["cpu"]
        n = s["neuron"]
        util = statistics.median(x["cpu"] / x["wall"] for x in n)
        host = statistics.median(x["host_cpu"] / x["wall"] for x in n)
        other = statistics.median(x["other_cpu"] / x["wall"] for x in n)
        c = n[-1].get("counters", {})
        counts = f"{c.get('host_waits', 0):.0f} / {c.get('launches', 0):.0f} / {c.get('inline_ops', 0):.0f}"
        met = "yes" if ratio <= TARGET and rss <= TARGET else "no"
        pairs = r.get("pair_ratios", [])
        spread = f" ({min(pairs):.2f}-{max(pairs):.2f} over {len(pairs)} pairs)" if len(pairs) > 1 else ""
        print(f"| {r['workload']} | {r['threads']} | {cpu_ms:.1f} | {neu_ms:.1f} | {ratio:.2f}x{spread} | {met} | {cpu_ratio:.2f}x | {comp} | "
              f"{rss:.2f}x | {util:.2f} ({host:.2f} + {other:.2f}) | {counts} |")
    print("\nneuron / cpu: the median over rounds (of every pair of processes) of the paired ratio, and the range of "
          "the pairs' own medians; 'target met?': ratio and RSS ratio <= 1.1. "
          f"{FIRST20}: the first 20 steps of a fresh process, in total.")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="*", default=WORKLOADS, choices=WORKLOADS + training_workloads.UNNAMED,
                        help="default: the targets' workloads; tiny_* are models they do not name")
    parser.add_argument("--threads", nargs="*", default=["default", "1", "1:unpinned"],
                        help="rows: default, N (pinned to N cores) or N:unpinned")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pairs", type=int, default=1,
                        help="fresh sets of worker processes per row, one after the other (a process's own "
                             "speed varies between starts; see Fresh pairs above)")
    parser.add_argument("--inner", type=int, default=3, help="timed steps per worker and round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--first-rounds", type=int, default=3, help=f"fresh-process pairs for {FIRST20}")
    parser.add_argument("--compile", action="store_true", help="also time CPU torch.compile (slow to compile)")
    parser.add_argument("--settle-ms", type=float, default=100.0,
                        help="pause before each worker's turn (untimed): an idle OpenMP worker of the "
                             "previous worker's process spins on a core for milliseconds after its last "
                             "parallel region, and a turn timed meanwhile runs on what is left")
    parser.add_argument("--quick", action="store_true", help="a smoke test: 3 rounds of 1 step, 1 first-20 pair")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin an N-thread row's processes to N cores (torch.set_num_threads only)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path, help="print the table of a --json file and exit")
    parser.add_argument("--worker", nargs=3, metavar=("WORKLOAD", "CONFIG", "THREADS"), help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker, first=args.first, warmup=args.warmup, pin=not args.no_pin)
    Worker.pin = not args.no_pin
    if args.report:
        report(json.loads(args.report.read_text()), CONFIGS)
        return 0
    if args.quick:
        args.rounds, args.inner, args.warmup, args.first_rounds = 3, 1, 2, 1

    import torch

    print(f"# torch {torch.__version__}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"default threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    started = time.perf_counter()
    results = []
    for threads in args.threads:
        for workload in args.workloads:
            configs = ["cpu", "neuron"]
            if args.compile and workload != FIRST20 and training_workloads.compiles(workload):
                configs.append("cpu_compile")
            print(f"# {workload}, threads {threads}: {', '.join(configs)}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                if workload == FIRST20:
                    results.append(run_first(threads, configs, args.first_rounds))
                else:
                    results.append(run_pairs(workload, threads, configs, args.pairs, args.rounds, args.inner,
                                             args.warmup, args.settle_ms / 1000))
            except RuntimeError as e:
                print(f"#   skipped: {e}", file=sys.stderr)
                results.append({"workload": workload, "threads": threads, "skipped": str(e)})
            print(f"#   {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if args.json:  # kept up to date: a run cut short keeps the rows it finished
                args.json.write_text(json.dumps(results, indent=1))
    elapsed = time.perf_counter() - started
    report(results, CONFIGS)
    print(f"\nRun: {elapsed:.0f} s; load average at the end {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} CPUs, {platform.node()}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
