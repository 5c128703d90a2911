"""Several Python threads using the device at once: per-thread current device and
stream, one shared allocator, and results identical to single-threaded runs."""

from __future__ import annotations

import threading

import pytest

import torch

from conftest import run_in_threads, run_python
from thread_workloads import train_seeded_mlp




@pytest.mark.usefixtures("replay_tier")  # bit-for-bit: the replay tier
def test_concurrent_training_matches_sequential() -> None:
    def train(i: int) -> list[float]:
        return train_seeded_mlp(i, f"neuron:{i % 2}", steps=20)

    sequential = [train(i) for i in range(4)]
    concurrent = run_in_threads(train, 4)
    assert concurrent == sequential


def test_current_device_and_stream_are_per_thread() -> None:
    barrier = threading.Barrier(2)

    def use(i: int) -> tuple[int, int, str]:
        torch.neuron.set_device(i)
        s = torch.neuron.Stream()
        with torch.neuron.stream(s):
            barrier.wait()  # both threads have switched before either checks
            x = torch.ones(4, device="neuron") * (i + 1)
            return torch.neuron.current_device(), torch.neuron.current_stream().stream_id, str(x.device)

    results = run_in_threads(use, 2)
    assert [r[0] for r in results] == [0, 1]
    assert [r[2] for r in results] == ["neuron:0", "neuron:1"]
    assert all(r[1] != 0 for r in results)
    assert torch.neuron.current_device() == 0  # the main thread is untouched


def test_allocator_statistics_stay_exact_under_threads(no_stray_frees) -> None:
    torch.neuron.empty_cache()
    base = torch.neuron.memory_allocated(0)

    def churn(i: int) -> int:
        kept = []
        for n in range(200):
            t = torch.empty(1000 + n, device="neuron:0")
            if n % 50 == 0:
                kept.append(t)
        return len(kept)

    run_in_threads(churn, 4)
    assert torch.neuron.memory_allocated(0) == base  # every block came back


def test_synchronize_and_events_while_another_thread_computes() -> None:
    stop = threading.Event()

    def compute() -> None:
        x = torch.randn(128, 128, device="neuron:0")
        while not stop.is_set():
            x = torch.tanh(x @ x)

    worker = threading.Thread(target=compute)
    worker.start()
    try:
        # Each wait runs what the other thread queued before it (a full queue of 128x128
        # matmuls): 50 rounds are a few seconds on an idle 2-core machine, and minutes on
        # one that other processes load.
        for _ in range(50):
            torch.neuron.synchronize(0)
            e = torch.neuron.Event(enable_timing=True)
            e.record()
            e.synchronize()
            torch.neuron.default_stream(0).synchronize()
            assert e.query()
    finally:
        stop.set()
        worker.join(timeout=60)


def backward_thread(x: torch.Tensor) -> int:
    """The thread that ran the backward node of ``x * 2``."""
    seen = []
    y = x * 2
    y.register_hook(lambda grad: seen.append(threading.get_ident()))
    y.sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((4,), 2.0))
    return seen[0]


def test_backward_runs_on_the_calling_thread_where_the_device_was_loaded() -> None:
    from neuron_lab.device import backward_on_calling_thread, is_backward_on_calling_thread

    x = torch.ones(4, device="neuron:1", requires_grad=True)
    assert is_backward_on_calling_thread()
    assert backward_thread(x) == threading.get_ident()

    def in_new_thread(_: int) -> tuple[bool, bool, bool]:
        default = is_backward_on_calling_thread()  # PyTorch's per-thread default: device threads
        on_device_thread = backward_thread(x.detach().requires_grad_()) != threading.get_ident()
        backward_on_calling_thread()
        return default, on_device_thread, backward_thread(x.detach().requires_grad_()) == threading.get_ident()

    assert run_in_threads(in_new_thread, 1) == [(False, True, True)]
    try:
        backward_on_calling_thread(False)
        assert backward_thread(x.detach().requires_grad_()) != threading.get_ident()
    finally:
        backward_on_calling_thread()


def test_an_idle_device_thread_gives_its_openmp_workers_back() -> None:
    """A device thread that ran a parallel region has OpenMP workers of its own; with the
    host's, libgomp then manages more threads than there are cores and stops letting idle
    workers spin, and every parallel region of the host wakes its workers with a system call.
    Idle, the device thread gives its workers back: the process's thread count rises while
    a launch computes on the device thread, and falls back once the device is idle."""
    result = run_python(
        """
        import os, threading, time, torch
        torch.set_num_threads(2)
        def count(): return len(os.listdir("/proc/self/task"))
        a, b = torch.ones(2048, 2048, device="neuron"), torch.ones(2048, 2048, device="neuron")
        torch.neuron.synchronize()
        time.sleep(0.05)  # the device idle: nothing of its own left
        base = count()
        out = {}
        # A host thread that never waits: the device thread computes the product (its 16 MiB
        # of results are launched to the idle device at once).
        host = threading.Thread(target=lambda: out.setdefault("c", a @ b))
        host.start(); host.join()
        peak, deadline = base, time.monotonic() + 60
        while time.monotonic() < deadline:
            n = count()
            peak = max(peak, n)
            if peak > base and n <= base:
                break
            time.sleep(0.001)
        assert out["c"][0, 0].item() == 2048.0
        print(base, peak, count())
        """,
        env={"NEURON_LAB_LAUNCH_RUNNER": "device_thread"},  # the workers of the device thread
    )
    assert result.returncode == 0, result.stderr
    base, peak, after = map(int, result.stdout.split())
    # Equal counts: no worker came and went (the device thread kept the workers it had when
    # it made `a` and `b`, or never ran a parallel region).
    assert peak > base, f"{base} threads before the product and at most {peak} during it"
    assert after <= base, f"the idle device thread kept its workers: {after} threads, {base} before"


@pytest.mark.usefixtures("launches_on_device_thread")
def test_background_launches_use_the_recording_threads_count_so_reductions_keep_their_bits() -> None:
    """ATen splits a large reduction across its intra-op threads, so a sum's bits depend on
    the thread count. A launch the device thread runs while the host is not waiting (here it
    polls an event) must use the recording thread's count, not a smaller budget, or results
    drift from the CPU's."""
    torch.manual_seed(0)
    x = torch.randn(4_000_000)
    assert torch.get_num_threads() >= 2, "needs at least 2 intra-op threads to split the sum"
    expected = x.sum()
    on_device = x.to("neuron")
    mismatched = []
    for step in range(10):
        total = (on_device * 1.0).sum()
        done = torch.neuron.Event()
        done.record()
        while not done.query():  # polling is not waiting: the device thread runs the launch alone
            pass
        if not torch.equal(total.cpu(), expected):
            mismatched.append(step)
    assert not mismatched, f"steps {mismatched} differ from the CPU's bits at {torch.get_num_threads()} threads"
