"""Streams and events with torch.cuda semantics."""

from __future__ import annotations

import os
import sys
import time
import weakref

import pytest
import torch

from neuron_lab.device import _C


def launches(stream: torch.Stream) -> tuple[int, int]:
    return _C.stream_launches(stream.device_index, stream.stream_id)


def test_default_and_new_streams() -> None:
    default = torch.neuron.default_stream()
    assert default.stream_id == 0 and default.device_index == 0
    assert torch.neuron.current_stream() == default
    s = torch.neuron.Stream()
    assert isinstance(s, torch.Stream) and s != default
    assert torch.neuron.Stream(device=1).device_index == 1
    assert "neuron:0" in repr(s)


def test_stream_context_routes_launches_in_order() -> None:
    s = torch.neuron.Stream()
    before_default = launches(torch.neuron.default_stream())
    with torch.neuron.stream(s):
        assert torch.neuron.current_stream() == s
        x = torch.ones(10, device="neuron")
        y = x * 2 + 1  # launches on s: one per op, or one fused graph in adaptive mode
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    s.synchronize()
    enqueued, completed = launches(s)
    assert enqueued >= 1 and enqueued == completed
    assert launches(torch.neuron.default_stream()) == before_default
    assert y.sum().item() == 30


def test_streams_are_per_core() -> None:
    s1 = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s1):
        assert torch.neuron.current_device() == 1  # selecting a stream selects its core
        assert torch.neuron.current_stream(1) == s1
        assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
        torch.ones(3, device="neuron:1").add_(1)
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)
    torch.neuron.synchronize(1)
    assert launches(s1)[0] >= 1


def test_wait_stream_wait_event_and_query() -> None:
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    with torch.neuron.stream(s1):
        x = torch.ones(1000, device="neuron") * 3
        event = s1.record_event()
    s2.wait_event(event)
    s2.wait_stream(s1)
    with torch.neuron.stream(s2):
        y = x + 1
    s2.synchronize()  # in the asynchronous modes the work may still be running
    assert event.query() and s1.query() and s2.query()
    s2.synchronize()
    event.synchronize()
    assert y[0].item() == 4


def test_event_timing() -> None:
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    x = torch.randn(256, 256, device="neuron")
    for _ in range(5):
        x = x @ x / 256
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert elapsed > 0.0
    assert isinstance(elapsed, float)


def test_event_timing_errors_are_clear() -> None:
    a, b = torch.neuron.Event(), torch.neuron.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing=True"):
        a.elapsed_time(b)
    c, d = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    with pytest.raises((RuntimeError, ValueError), match="must be recorded"):
        c.elapsed_time(d)


def test_unrecorded_event_is_complete() -> None:
    e = torch.neuron.Event()
    assert e.query()
    torch.neuron.current_stream().wait_event(e)  # a no-op, as in CUDA


def test_record_stream_keeps_accounting() -> None:
    s = torch.neuron.Stream()
    x = torch.empty(1024, device="neuron")
    x.record_stream(s)
    with pytest.raises(RuntimeError, match="neuron:0 but the stream is on neuron:1"):
        x.record_stream(torch.neuron.Stream(device=1))
    del x


def test_synchronize_variants() -> None:
    torch.ones(4, device="neuron:1").add_(1)
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    torch.accelerator.synchronize(1)
    torch.neuron.current_stream().synchronize()


def test_generic_torch_event_and_stream_work_on_neuron() -> None:
    s = torch.Stream(device="neuron")
    e = torch.Event(device="neuron", enable_timing=True)
    e2 = torch.Event(device="neuron", enable_timing=True)
    e.record(s)
    e2.record(s)
    assert e.elapsed_time(e2) >= 0.0
    assert s.query()


def test_a_waiting_thread_runs_launches_with_device_thread_state():
    """A host thread that waits may execute the launches itself; its own autocast,
    grad mode and dispatch modes must not leak into them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    ad, bd = a.to("neuron"), b.to("neuron")
    for _ in range(3):
        y = (ad @ bd).relu() + 1  # recorded, not yet executed
        seen = Seen()
        with torch.autocast("neuron", dtype=torch.bfloat16), torch.no_grad(), seen:
            torch.neuron.synchronize()  # executes the buffered launch (on this thread, when idle)
        assert y.dtype == torch.float32
        assert torch.equal(y.cpu(), (a @ b).relu() + 1)
        assert not any("mm" in op for op in seen.ops), seen.ops


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenMP's default team is one thread on one core")
def test_device_threads_use_the_thread_count_set_by_torch_set_num_threads():
    """With torch.set_num_threads(1), a launch executed by a device thread starts no
    OpenMP workers (their default team would compete with the host for the cores)."""
    from conftest import run_python

    result = run_python(
        """
        import os, time, torch, neuron_lab
        torch.set_num_threads(1)
        neuron_lab.set_mode("eager")
        x = torch.randn(1 << 22, device="neuron")
        torch.neuron.synchronize()
        threads = len(os.listdir("/proc/self/task"))
        for _ in range(3):
            y = x.sin()          # big enough for ATen to parallelize it
            time.sleep(0.3)      # the device thread (not a waiting host) executes it
            torch.neuron.synchronize()
        print(len(os.listdir("/proc/self/task")) - threads)
        """,
        env={"NEURON_LAB_COMPILE": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", result.stdout


def _token_like_step(state: list, ids: torch.Tensor) -> bool:
    """A decoding loop's bookkeeping: a few small ops, then a host read of the flag."""
    state[0] = state[0] & ~((ids + 1) == 50256)
    return bool(state[0].max() == 0)


def _counters() -> tuple[int, int, int]:
    from neuron_lab import adaptive_eager as ae
    from neuron_lab.device.trace import device_counters

    device = device_counters()
    return ae.counters()["launches"], device["launches_run_by_waiting_host"], device["device_thread_wakeups"]


@pytest.mark.usefixtures("launches_on_device_thread")
def test_a_host_read_runs_the_launch_it_waits_for_without_waking_the_device_thread() -> None:
    """The flush before a host read does not hand its launch to the device thread: the
    host is about to wait for it, and runs it itself (a thread hand-off, or two, fewer
    per read). 40 steps: 40 launches, all run by the waiting host, no wake-up sent."""
    state = [torch.ones(1, dtype=torch.long, device="neuron")]
    ids = torch.zeros(1, dtype=torch.long, device="neuron")
    for _ in range(5):  # the step's graph is built, then repeats
        _token_like_step(state, ids)
    before = _counters()
    for _ in range(40):
        assert _token_like_step(state, ids) is False
    launched, by_host, wakeups = (after - b for after, b in zip(_counters(), before))
    assert (launched, by_host, wakeups) == (40, 40, 0)


@pytest.mark.usefixtures("launches_on_device_thread")
def test_a_host_read_that_flushes_two_devices_wakes_both_device_threads() -> None:
    """A read on neuron:0 also flushes what neuron:1 recorded: the host runs neuron:0's
    launch, and neuron:1's device thread is woken at once for its own (not after the
    host's wait), as is neuron:0's, whose launch the host may still run."""
    a1 = torch.full((256,), 2.0, device="neuron:1")
    b0 = torch.full((256,), 2.0, device="neuron:0")
    torch.neuron.synchronize(0)
    torch.neuron.synchronize(1)
    for step in range(8):
        y1 = a1 * 3  # recorded on neuron:1, not flushed by neuron:0's ops
        before = _counters()
        assert (b0 * 2).sum().item() == 1024.0
        launched, _, wakeups = (after - b for after, b in zip(_counters(), before))
        if step >= 3:  # graphs repeat
            assert (launched, wakeups) == (2, 2)
        assert y1.sum().item() == 1536.0


def _launch_on_the_device_thread(x: torch.Tensor) -> torch.Tensor:
    """Records a few ops on x and hands their launch to the stream's device thread (a flush
    that does not wait), then waits for it by polling the stream from Python, which keeps
    the GIL between polls: the device thread, not a waiting host, runs the launch."""
    from neuron_lab import adaptive_eager as ae

    y = (x * 2 + 1).sin()
    ae.flush()
    stream = torch.neuron.current_stream()
    deadline = time.monotonic() + 10.0
    while not stream.query() and time.monotonic() < deadline:
        pass
    assert stream.query(), "the device thread did not finish the launch while the host held the GIL"
    return y


@pytest.mark.usefixtures("launches_on_device_thread")
def test_a_device_thread_finishes_a_launch_while_the_host_holds_the_gil() -> None:
    """A device thread leaves the launch it ran to a host thread to drop: dropping a launch
    drops its references to tensors Python also holds, which takes the GIL. With the host's
    Python never handing the GIL over (a switch interval of 1000 s), a device thread that
    dropped the launch itself would wait for the GIL and never finish; this one does."""
    from neuron_lab.device.trace import device_counters

    x = torch.randn(4096, device="neuron")
    torch.neuron.synchronize()
    before = device_counters()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        y = _launch_on_the_device_thread(x)
    finally:
        sys.setswitchinterval(interval)
    torch.neuron.synchronize()
    after = device_counters()
    assert after["launches_run_by_waiting_host"] == before["launches_run_by_waiting_host"]
    assert after["launches_dropped_by_host"] > before["launches_dropped_by_host"]
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2 + 1).sin(), rtol=0, atol=0)


@pytest.mark.usefixtures("launches_on_device_thread")
def test_the_host_drops_what_a_device_thread_ran_at_its_next_wait() -> None:
    """The tensors a finished launch held live until the host's next wait (or op), then go:
    memory statistics read after a wait count their frees."""
    torch.neuron.synchronize()
    allocated = torch.neuron.memory_allocated()
    x = torch.randn(1 << 16, device="neuron")
    y = _launch_on_the_device_thread(x)
    gone = weakref.ref(x)
    del x  # the launch the device thread ran still holds it
    assert gone() is not None
    torch.neuron.synchronize()
    assert gone() is None
    del y
    assert torch.neuron.memory_allocated() == allocated


@pytest.mark.usefixtures("launches_on_device_thread")
def test_a_host_recording_ahead_of_its_device_thread_holds_bounded_memory() -> None:
    """A result takes its memory when its op is recorded, and what a queued launch reads stays
    alive until it has run: a host that records far ahead of a slow device thread would hold
    every queued step's memory (a 6-layer 512-wide GPT-2's backward peaked at 613 MB against
    368 MB). The stream's queue is bounded by its launches' result bytes (16 MiB) as well as
    by their ops: 24 launches of a matmul with a 4 MiB result, each far slower than recording
    it, peak far below the 96 MiB an unbounded queue held, with the CPU's bits."""
    from neuron_lab import adaptive_eager as ae

    torch.manual_seed(0)
    x = torch.randn(1024, 1024)
    w = torch.randn(1024, 1024) / 32
    xn, wn = x.to("neuron"), w.to("neuron")
    torch.neuron.synchronize()
    baseline = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    y = xn
    for _ in range(24):
        y = y @ wn  # the previous y is dropped by the host, held by this launch until it runs
        ae.flush()  # a launch per step, as a step's waits or the policy's cuts would make
    torch.neuron.synchronize()
    peak = torch.neuron.max_memory_allocated() - baseline
    assert peak <= 40 << 20, f"{peak / 2**20:.1f} MiB above the inputs while recording ahead"
    expected = x
    for _ in range(24):
        expected = expected @ w
    assert torch.equal(y.cpu(), expected)
