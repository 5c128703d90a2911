"""Several Python threads doing everything at once, in every mode, each run under a timeout.

A lock taken in one order on one path and in the reverse order on another deadlocks only
when two threads meet at the wrong moment: torch's Python bindings of a generator hold
the GIL and then take the generator's mutex, and a seed change that waited for the device
under that mutex (releasing the GIL and taking it back) hung four threads that each
seeded and trained. Each run here is a fresh process whose threads seed (every RNG API),
train with dropout, print pending tensors, read values, synchronize streams and events,
read memory statistics and profile, in a rotation that makes every pair of these meet;
a hang is a failure (the process dumps every thread's stack and exits), and so is a
wrong number: each thread's seeded draws and its model's losses must equal the CPU's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Threads x rounds per run: about 5 s a mode on the 2-core CI machine.
THREADS = 4
ROUNDS = 12
TIMEOUT_S = 90

_STRESS = """
import faulthandler, sys, threading
faulthandler.dump_traceback_later({timeout}, exit=True)   # a hang prints every stack and fails
sys.path.insert(0, {tests!r})
import torch
from thread_workloads import train_seeded_mlp
import neuron_lab
neuron_lab.set_mode({mode!r})
THREADS, ROUNDS = {threads}, {rounds}
barrier = threading.Barrier(THREADS)
errors = []


def seeded_draws(i, device):
    g = torch.Generator(device).manual_seed(1000 + i)
    a = torch.rand(257, generator=g, device=device)
    state = g.get_state()
    b = torch.randn(31, generator=g, device=device)
    g.set_state(state)
    c = torch.randn(31, generator=g, device=device)
    return torch.cat([a, b, c]).cpu()


def train(i, device):
    return train_seeded_mlp(i, device, steps=3, optimizer="adamw")


def dropout_step(i):
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.25)).to("neuron")
    y = m(torch.randn(4, 8, device="neuron"))
    y.sum().backward()
    return repr(y)  # printing a pending tensor


def rng_apis(i):
    torch.manual_seed(i)
    torch.neuron.manual_seed(i)
    torch.neuron.manual_seed_all(i)
    state = torch.neuron.get_rng_state()
    torch.rand(8, device="neuron")
    torch.neuron.set_rng_state(state)
    with torch.random.fork_rng(device_type="neuron"):
        torch.randn(8, device="neuron")
    torch.neuron.initial_seed()
    torch.neuron.default_generators[0].get_state()


def streams_and_events(i):
    s = torch.neuron.Stream()
    e = torch.neuron.Event()
    with torch.neuron.stream(s):
        x = torch.ones(64, 64, device="neuron") @ torch.ones(64, 64, device="neuron")
        e.record()
    torch.neuron.current_stream().wait_event(e)
    e.query()
    torch.neuron.synchronize()
    assert x[0, 0].item() == 64.0


def memory_and_profile(i):
    torch.neuron.memory_allocated()
    torch.neuron.memory_stats()
    torch.neuron.max_memory_allocated()
    if i == 0:
        with neuron_lab.profiler.profile() as prof:
            (torch.ones(32, device="neuron") * 2).sum().item()
        prof.table()


ACTIONS = [dropout_step, rng_apis, streams_and_events, memory_and_profile]


def worker(i):
    try:
        device = "neuron:%d" % (i % torch.neuron.device_count())
        barrier.wait()
        results = []
        for r in range(ROUNDS):
            ACTIONS[(i + r) % len(ACTIONS)](i)
            if r % 4 == i % 4:
                results.append(("draws", seeded_draws(i, device)))
                results.append(("losses", train(i, device)))
        for kind, value in results:
            reference = seeded_draws(i, "cpu") if kind == "draws" else train(i, "cpu")
            equal = torch.equal(value, reference) if kind == "draws" else value == reference
            if not equal:
                errors.append("thread %d: %s differ from the CPU's" % (i, kind))
    except BaseException as e:
        import traceback
        errors.append("thread %d: %s" % (i, traceback.format_exc()))


threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
for t in threads:
    t.start()
for t in threads:
    t.join()
torch.neuron.synchronize()
print("\\n".join(errors) if errors else "ok")
"""


@pytest.mark.parametrize("mode", ["adaptive", "eager", "blocking"])
def test_threads_seeding_training_printing_syncing_profiling(mode: str) -> None:
    code = _STRESS.format(mode=mode, threads=THREADS, rounds=ROUNDS, timeout=TIMEOUT_S,
                          tests=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=TIMEOUT_S + 60)
    assert result.returncode == 0, f"the threads hung or crashed:\n{result.stdout}\n{result.stderr[-6000:]}"
    assert result.stdout.strip().splitlines()[-1:] == ["ok"], result.stdout + result.stderr[-3000:]
