"""Neuron tensors between processes, and processes forked from one that uses the device.

Tensors put on a torch.multiprocessing Queue, passed to or returned from spawned processes,
or made by DataLoader workers started with "spawn" or "forkserver" arrive on the same core
over the same memory, as CUDA tensors do (neuron_lab/device/sharing.py). A process forked
after the device started gets the device's error at once, in every mode, and the parent
sees it; a forked child that stays on the CPU works. The other processes' side is
tests/process_peers.py. Every wait has a time-out, so that a hang fails its test.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import time

import process_peers
import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

import neuron_lab
from conftest import run_python

pytestmark = pytest.mark.timeout(120)

WAIT_S = 30  # for an answer from another process (which may be importing torch)
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORK_FIX = ("forked after the parent used it", "'spawn'", "'forkserver'", "on the CPU")


@pytest.fixture(scope="module")
def peer():
    """Calls a function of process_peers in one spawned peer process: ``peer(name, *args)``."""
    ctx = mp.get_context("spawn")
    requests, responses = ctx.Queue(), ctx.Queue()
    process = ctx.Process(target=process_peers.serve, args=(requests, responses), daemon=True)
    process.start()

    def call(name: str, *args):
        requests.put((name, args))
        status, value = responses.get(timeout=WAIT_S)
        assert status == "ok", value
        return value

    yield call
    requests.put(None)
    process.join(WAIT_S)
    if process.is_alive():
        process.kill()


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


# ---- sharing --------------------------------------------------------------------------------


def test_queue_round_trip_shares_memory_both_ways(peer, mode) -> None:
    x = torch.arange(6, dtype=torch.float32, device="neuron:1")
    got = peer("keep", "x", x)
    assert got["device"] == "neuron:1" and got["dtype"] == torch.float32
    assert torch.equal(got["values"], torch.arange(6.0))
    # The receiver writes: the sender sees it.
    assert peer("add_in_place", "x", 10.0)
    assert torch.equal(x.cpu(), torch.arange(6.0) + 10)
    # The sender writes: the receiver sees it.
    x.mul_(2)
    torch.neuron.synchronize(x.device)
    assert torch.equal(peer("kept_values", "x"), (torch.arange(6.0) + 10) * 2)
    assert peer("record_stream", "x")
    # A tensor the receiver makes and sends back is its memory, here too.
    y = peer("make", "y", [1.0, 2.0, 3.0], "neuron:0")
    assert y.device == torch.device("neuron:0")
    y.add_(1)
    torch.neuron.synchronize()
    assert torch.equal(peer("kept_values", "y"), torch.tensor([2.0, 3.0, 4.0]))
    peer("forget", "x")
    peer("forget", "y")


def test_views_keep_offset_strides_and_one_storage(peer, mode) -> None:
    base = torch.arange(24, dtype=torch.float32, device="neuron").reshape(4, 6)
    view, transposed = base[1:, 2:5], base.t()
    got = peer("describe_all", [view, transposed])
    assert (got[0]["shape"], got[0]["stride"], got[0]["offset"]) == ((3, 3), (6, 1), 8)
    assert (got[1]["shape"], got[1]["stride"], got[1]["offset"]) == ((6, 4), (1, 6), 0)
    assert torch.equal(got[0]["values"], view.cpu()) and torch.equal(got[1]["values"], transposed.cpu())
    assert peer("shares_storage", view, transposed)
    # Sent back, a view is a view of the sender's own storage again.
    back = peer("echo", view)
    assert back.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert (back.stride(), back.storage_offset()) == ((6, 1), 8)
    back.zero_()
    assert base.cpu()[1:, 2:5].abs().sum().item() == 0


def test_dtypes_arrive_bit_equal(peer) -> None:
    values = torch.randn(7) * 100
    tensors = [values.to(dtype).to("neuron") for dtype in
               (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64)]
    tensors += [(values > 0).to("neuron"), torch.complex(values, -values).to("neuron")]
    described = peer("describe_all", tensors)
    assert [d["dtype"] for d in described] == [t.dtype for t in tensors]
    assert peer("raw_bytes", tensors) == [raw_bytes(t) for t in tensors]


def test_pending_values_are_computed_before_sharing(peer) -> None:
    import neuron_lab.adaptive_eager as ae

    with neuron_lab.mode("adaptive"):
        a = torch.full((4096,), 2.0, device="neuron")
        before = ae.counters()
        b = (a * 3 + 1).sin()
        after = ae.counters()
        assert after["ops_recorded"] - before["ops_recorded"] == 3 and after["launches"] == before["launches"]
        got = peer("describe", b)  # b's ops are launched and waited for first
        assert torch.equal(got["values"], b.cpu())
        assert torch.allclose(got["values"], torch.full((4096,), 7.0).sin())


def test_requires_grad_and_parameters_travel(peer) -> None:
    parameter = torch.nn.Parameter(torch.randn(3, device="neuron"))
    leaf = torch.randn(2, device="neuron", requires_grad=True)
    got = peer("describe_all", [parameter, leaf, parameter.detach()])
    assert [g["type"] for g in got] == ["Parameter", "Tensor", "Tensor"]
    assert [g["requires_grad"] for g in got] == [True, True, False]


def test_sender_keeps_shared_memory_while_the_receiver_holds_it(peer) -> None:
    core = 1
    receiver_before = peer("memory", core)
    x = torch.full((1024,), 7.0, device=f"neuron:{core}")
    got = peer("keep", "held", x)
    # The receiver's allocator does not count memory it was given (as CUDA's IPC memory).
    assert (got["allocated"], got["reserved"]) == (receiver_before["allocated"], receiver_before["reserved"])
    del x
    # Requests of the freed size would take x's block if it were free.
    others = [torch.full((1024,), -1.0, device=f"neuron:{core}") for _ in range(8)]
    torch.neuron.synchronize(core)
    assert torch.equal(peer("kept_values", "held"), torch.full((1024,), 7.0))
    assert peer("forget", "held") == 0  # the receiver unmapped it
    held = torch.neuron.memory_allocated(core)
    torch.neuron.ipc_collect()
    assert held - torch.neuron.memory_allocated(core) == 4096
    del others


def test_file_system_strategy_shares_neuron_tensors(peer) -> None:
    previous = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        x = torch.arange(4.0, device="neuron")
        assert torch.equal(peer("keep", "fs", x)["values"], torch.arange(4.0))
        peer("add_in_place", "fs", 1.0)
        assert torch.equal(x.cpu(), torch.arange(4.0) + 1)
        peer("forget", "fs")
    finally:
        mp.set_sharing_strategy(previous)


def test_spawn_passes_and_returns_neuron_tensors() -> None:
    ctx = mp.get_context("spawn")
    results, received = ctx.Queue(), ctx.Event()
    shared = torch.zeros(2, device="neuron")
    context = mp.spawn(process_peers.spawned_rank, args=(results, received, shared), nprocs=2, join=False)
    try:
        got = dict(results.get(timeout=WAIT_S) for _ in range(2))
    finally:
        received.set()
        deadline = time.monotonic() + WAIT_S
        while not context.join(timeout=1) and time.monotonic() < deadline:
            pass
    for rank, result in got.items():
        assert result.device == torch.device("neuron", rank)
        assert torch.equal(result.cpu(), torch.arange(4.0) * (rank + 1))
    assert torch.equal(shared.cpu(), torch.tensor([1.0, 2.0]))  # each process wrote its element


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_dataloader_workers_return_neuron_tensors(context) -> None:
    loader = DataLoader(process_peers.NeuronItems(), batch_size=4, num_workers=2, multiprocessing_context=context,
                        timeout=WAIT_S)
    batches = list(loader)
    assert [b.device for b in batches] == [torch.device("neuron:0")] * 2
    expected = torch.arange(8.0).repeat_interleave(3).reshape(8, 3) * 2
    assert torch.equal(torch.cat([b.cpu() for b in batches]), expected)


# ---- forked children --------------------------------------------------------------------------


def in_forked_child(work) -> dict:
    """Runs ``work()`` (returning something JSON can hold) in a child forked from this process."""
    gc.collect()  # garbage is finalized here, not in the child that copies it
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # never returns into pytest
        try:
            os.close(read_end)
            try:
                result = {"result": work()}
            except BaseException as e:  # noqa: BLE001
                result = {"unexpected": f"{type(e).__name__}: {e}"}
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([read_end], [], [], 0.1)
            if ready:
                chunk = os.read(read_end, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the forked child hung")
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def test_forked_child_gets_the_device_error_at_once(mode) -> None:
    x = torch.arange(4.0, device="neuron")
    assert x.sum().item() == 6.0  # the device has started

    def touch_the_device() -> dict:
        attempts = {
            "new tensor": lambda: torch.ones(3, device="neuron"),
            "op on an inherited tensor": lambda: x + 1,
            "in-place op": lambda: x.add_(1),
            "read to the host": lambda: x.cpu(),
            "item": lambda: x[0].item(),
            "to the device": lambda: torch.ones(2).to("neuron"),
            "synchronize": torch.neuron.synchronize,
            "memory statistics": torch.neuron.memory_allocated,
            "stream": lambda: torch.neuron.Stream(),
        }
        outcomes = {}
        for name, attempt in attempts.items():
            try:
                attempt()
                outcomes[name] = "ran"
            except RuntimeError as e:
                outcomes[name] = str(e)
        return outcomes

    outcomes = in_forked_child(touch_the_device)
    assert "result" in outcomes, outcomes
    for name, outcome in outcomes["result"].items():
        assert all(part in outcome for part in FORK_FIX), (name, outcome)
    assert (x + 1).sum().item() == 10.0  # the parent goes on


@pytest.mark.parametrize("dataset,batch_size", [("made", 2), ("inherited", None)])
def test_forked_dataloader_worker_error_reaches_the_parent(mode, dataset, batch_size) -> None:
    torch.ones(1, device="neuron").sum().item()  # the device has started
    items = process_peers.NeuronItems() if dataset == "made" else process_peers.InheritedNeuronItems()
    loader = DataLoader(items, batch_size=batch_size, num_workers=2, multiprocessing_context="fork", timeout=WAIT_S)
    batches = iter(loader)
    try:
        with pytest.raises(RuntimeError) as info:
            next(batches)
    finally:
        # Now: shut down later, from garbage collection (or as garbage copied into a later
        # test's forked child), the workers would take 5 s each to go.
        batches._shutdown_workers()
    message = str(info.value)
    assert all(part in message for part in FORK_FIX), message


def test_forked_child_that_stays_on_the_cpu_works() -> None:
    script = f"""
        import os, sys
        import torch, neuron_lab
        from torch.utils.data import DataLoader
        sys.path.insert(0, {TESTS_DIR!r})
        import process_peers

        neuron_lab.set_mode("adaptive")
        model = torch.nn.Linear(3, 1, device="neuron")
        pending = model.weight * 2  # recorded, not launched, when the child is forked
        pid = os.fork()
        if pid == 0:
            torch.manual_seed(1)
            cpu_model = torch.nn.Linear(3, 1)
            cpu_model(torch.randn(4, 3)).sum().backward()
            print("child", torch.neuron.is_initialized(), tuple(cpu_model.weight.grad.shape), flush=True)
            sys.exit(0)  # a normal exit: the exit hooks it inherited run
        _, status = os.waitpid(pid, 0)
        print("child status", os.waitstatus_to_exitcode(status), flush=True)
        print("parent", torch.equal(pending.cpu(), model.weight.detach().cpu() * 2), flush=True)

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(process_peers.CpuItems(), batch_size=4, num_workers=2,
                            multiprocessing_context="fork", timeout=60)
        for batch in loader:  # CPU batches from forked workers, trained on in this process
            model(batch.to("neuron")).sum().backward()
            optimizer.step()
        print("trained", tuple(batch.shape), batch.device, flush=True)
        """
    result = run_python(script)
    lines = result.stdout.splitlines()
    assert "child False (1, 3)" in lines, (result.stdout, result.stderr)
    assert "child status 0" in lines and "parent True" in lines, (result.stdout, result.stderr)
    assert "trained (4, 3) cpu" in lines, (result.stdout, result.stderr)
    assert "neuron" not in result.stderr, result.stderr
