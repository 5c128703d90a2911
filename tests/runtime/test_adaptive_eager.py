"""Adaptive eager (issue 3): ops on neuron tensors are recorded per stream, launched
asynchronously as fused graphs, cached, and keep eager semantics: same values as the
CPU, errors surfacing at the next wait with the user's line, dead intermediates that
never take device memory, streams ordered by events, threads and fork handled."""

from __future__ import annotations

import contextlib
import copy
import os
import re
import threading

import pytest
import torch

import neuron_lab
from neuron_lab import adaptive_eager as ae
from neuron_lab.device.launches import launches_run_on

from conftest import run_in_threads, run_python
from parity import same_bits

THIS_FILE = os.path.basename(__file__)


# Every test starts and ends in adaptive mode with the default policy and no pending work.
pytestmark = pytest.mark.usefixtures("adaptive_runtime")


def settled_counters() -> dict:
    torch.neuron.synchronize()
    return ae.counters()


def chain(x: torch.Tensor) -> torch.Tensor:
    """A small chain of elementwise ops, reductions, a matmul and views."""
    y = (x * 2 + 1).sin()
    y = y @ x.T / x.shape[1]
    y = torch.relu(y - y.mean(dim=1, keepdim=True))
    y = y.T.contiguous().view(-1)[: x.numel() // 2].exp().reshape(x.shape[0], -1)
    return y.cumsum(dim=1) + y.amax()


# ---- the mode API ------------------------------------------------------------------------


def test_mode_api_and_errors() -> None:
    assert neuron_lab.get_mode() == "adaptive"
    for name in ("eager", "blocking", "adaptive"):
        neuron_lab.set_mode(name)
        assert neuron_lab.get_mode() == name
    with neuron_lab.mode("blocking"):
        assert neuron_lab.get_mode() == "blocking"
        with neuron_lab.mode("eager"):
            assert neuron_lab.get_mode() == "eager"
        assert neuron_lab.get_mode() == "blocking"
    assert neuron_lab.get_mode() == "adaptive"
    with pytest.raises(KeyError):
        with neuron_lab.mode("eager"):
            raise KeyError("inside")
    assert neuron_lab.get_mode() == "adaptive"  # restored on an exception too

    with pytest.raises(ValueError, match="unknown neuron execution mode 'fast'"):
        neuron_lab.set_mode("fast")
    with pytest.raises(ValueError):
        with neuron_lab.mode("Adaptive"):
            pass
    assert neuron_lab.get_mode() == "adaptive"  # a bad name changes nothing


def test_configure_returns_the_policy_and_checks_values() -> None:
    policy = neuron_lab.configure(max_ops=17, compile_after=3)
    assert policy["max_ops"] == 17 and policy["compile_after"] == 3
    assert ae.policy() == policy
    assert neuron_lab.configure() == policy  # no arguments: nothing changes
    for bad in ({"max_ops": 0}, {"compile_after": 0}, {"idle_flush_bytes": -1}):
        with pytest.raises(ValueError):
            neuron_lab.configure(**bad)
    assert ae.policy() == policy  # a rejected configuration changes nothing


def test_configured_sets_knobs_for_a_block_and_restores_them() -> None:
    before = ae.policy()
    with neuron_lab.configured(max_ops=17, run_at_once_if_cheaper=not before["run_at_once_if_cheaper"]) as inside:
        assert inside == ae.policy()
        assert inside["max_ops"] == 17 and inside["run_at_once_if_cheaper"] != before["run_at_once_if_cheaper"]
        assert {k: v for k, v in inside.items() if k not in ("max_ops", "run_at_once_if_cheaper")} == \
            {k: v for k, v in before.items() if k not in ("max_ops", "run_at_once_if_cheaper")}
    assert ae.policy() == before
    with pytest.raises(KeyError, match="inside"):
        with neuron_lab.configured(compile_after=3):
            raise KeyError("inside")
    assert ae.policy() == before  # restored on an exception too
    with pytest.raises(TypeError, match=r"unknown knobs \['max_opps'\].*'max_ops'"):
        with neuron_lab.configured(max_opps=3):
            pass
    with pytest.raises(ValueError, match="max_ops must be at least 1"):
        with neuron_lab.configured(max_ops=0):
            pass
    assert ae.policy() == before  # a rejected knob changes nothing


def test_mode_from_the_environment() -> None:
    result = run_python(
        """
        import torch, neuron_lab
        print(neuron_lab.get_mode())
        """,
        env={"NEURON_LAB_MODE": "eager"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["eager"]


# ---- values and fusion -------------------------------------------------------------------


def test_every_mode_gives_the_cpu_result_of_a_chain() -> None:
    x_cpu = torch.randn(8, 6)
    expected = chain(x_cpu)
    for name in ("adaptive", "eager", "blocking"):
        with neuron_lab.mode(name):
            got = chain(x_cpu.to("neuron")).cpu()
        torch.testing.assert_close(got, expected, msg=lambda m, name=name: f"mode {name}: {m}")


def test_adaptive_fuses_a_chain_and_eager_launches_each_op() -> None:
    x = torch.randn(100, device="neuron")
    expected = x.cpu()
    for _ in range(50):
        expected = expected * 1.01 + 0.5
    torch.neuron.synchronize()

    results = {}
    for name in ("adaptive", "eager"):
        with neuron_lab.mode(name):
            ae.reset_counters()
            y = x
            for _ in range(50):
                y = y * 1.01 + 0.5
            results[name] = settled_counters()
            torch.testing.assert_close(y.cpu(), expected)

    adaptive, eager = results["adaptive"], results["eager"]
    assert adaptive["ops_recorded"] == 100
    # Fused: a graph is cut early only at a sync, or where a cached graph of at least
    # idle_flush_ops ops ends (this periodic chain may follow such a graph every 32 ops).
    assert 1 <= adaptive["launches"] <= 100 // ae.policy()["idle_flush_ops"] + 1
    assert adaptive["graph_launches"] == adaptive["launches"]
    assert adaptive["inline_ops"] == 0
    assert eager["ops_recorded"] == 100
    assert eager["launches"] == 100  # one launch per op
    assert eager["flushes"].get("eager", 0) == 100


def test_max_ops_bounds_a_graph() -> None:
    neuron_lab.configure(max_ops=10)
    x = torch.randn(64, device="neuron")
    torch.neuron.synchronize()
    ae.reset_counters()
    y = x
    for _ in range(35):
        y = y + 1
    counters = settled_counters()
    assert counters["ops_recorded"] == 35
    assert counters["launches"] == 4
    assert counters["flushes"].get("op limit", 0) == 3
    torch.testing.assert_close(y.cpu(), x.cpu() + 35)


def test_deterministic_algorithms_launch_op_by_op() -> None:
    x = torch.randn(100, device="neuron")
    torch.neuron.synchronize()
    ae.reset_counters()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_filling = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True)
    # Not filling new memory (a NaN fill per result: tests/device/test_deterministic_fill.py).
    torch.utils.deterministic.fill_uninitialized_memory = False
    try:
        y = x
        for _ in range(10):
            y = y * 1.5
        counters = settled_counters()
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling
    assert counters["ops_recorded"] == 10
    assert counters["launches"] == 10
    assert counters["flushes"].get("eager", 0) == 10
    torch.testing.assert_close(y.cpu(), x.cpu() * 1.5**10)

    ae.reset_counters()  # fusion is back once determinism is off
    y = x
    for _ in range(10):
        y = y * 1.5
    assert settled_counters()["launches"] == 1


# ---- views, in-place ops and ordering across graph boundaries ----------------------------


def test_in_place_on_a_view_then_flush_then_read_the_base() -> None:
    base = torch.zeros(3, 4, device="neuron")
    row = base[1]
    row.add_(5)
    ae.flush()
    base[:, 2].mul_(0).add_(7)  # another view of the same memory, in a new buffer
    ae.flush()
    expected = torch.zeros(3, 4)
    expected[1] = 5
    expected[:, 2] = 7
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(row.cpu(), expected[1])


def test_in_place_on_a_view_of_a_pending_result() -> None:
    x = torch.arange(12.0, device="neuron").reshape(3, 4)
    t = x * 1  # pending
    t[0].add_(1)  # a view of a pending result, written in the same buffer
    total = t.sum()  # reads the write
    t.T[2].mul_(3)  # a strided view, written after the read
    flat = t.view(-1)
    ae.flush()
    flat[-1] = 100.0  # after a flush, through another view
    expected = torch.arange(12.0).reshape(3, 4)
    expected[0] += 1
    expected_total = expected.sum().item()
    expected[:, 2] *= 3
    expected.view(-1)[-1] = 100.0
    assert torch.equal(t.cpu(), expected)
    assert total.item() == expected_total


def test_in_place_write_after_a_pending_read() -> None:
    w = torch.ones(5, device="neuron")
    doubled = w * 2  # reads w, pending
    total = w.sum()  # reads w, pending
    w.add_(10)  # must not change what the reads above see
    after = w + 0
    assert torch.equal(doubled.cpu(), torch.full((5,), 2.0))
    assert total.item() == 5.0
    assert torch.equal(after.cpu(), torch.full((5,), 11.0))

    v = torch.ones(5, device="neuron")
    read = v.sum()
    ae.flush()  # the read is launched (maybe not run yet) before the write is recorded
    v.mul_(100)
    assert read.item() == 5.0
    assert v.sum().item() == 500.0


# ---- streams and events ------------------------------------------------------------------


def test_two_streams_ordered_by_events() -> None:
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    x_cpu = torch.randn(128, 128)
    x = x_cpu.to("neuron")
    torch.neuron.synchronize()
    start = torch.neuron.Event(enable_timing=True)
    produced = torch.neuron.Event(enable_timing=True)
    with torch.neuron.stream(s1):
        start.record()
        y = x
        for _ in range(20):
            y = torch.tanh(y @ x / 16)
        produced.record()
    s2.wait_event(produced)
    with torch.neuron.stream(s2):
        z = y * 2 + 1
        y.record_stream(s2)
        consumed = s2.record_event()
    s1.wait_event(consumed)
    with torch.neuron.stream(s1):
        y.add_(1000)  # after s2 has read y
    torch.neuron.synchronize()

    expected_y = x_cpu
    for _ in range(20):
        expected_y = torch.tanh(expected_y @ x_cpu / 16)
    torch.testing.assert_close(z.cpu(), expected_y * 2 + 1, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y.cpu(), expected_y + 1000, rtol=1e-4, atol=1e-4)
    assert start.elapsed_time(produced) > 0.0
    assert ae.counters()["flushes"].get("event record", 0) >= 1


# ---- random numbers ----------------------------------------------------------------------


def random_program(device: str) -> list[torch.Tensor]:
    torch.manual_seed(1234)
    a = torch.randn(7, 3, device=device)
    b = a * 2 + torch.rand(7, 3, device=device)  # random ops interleaved with others
    c = torch.randint(0, 100, (11,), device=device)
    d = torch.empty(5, device=device).normal_(3.0, 0.5)
    e = torch.randperm(9, device=device)
    return [t.cpu() for t in (a, b, c, d, e)]


@pytest.mark.parametrize("name", ["adaptive", "eager"])
def test_random_ops_match_the_cpu_for_the_same_seed(name: str) -> None:
    expected = random_program("cpu")
    with neuron_lab.mode(name):
        got = random_program("neuron")
        again = random_program("neuron")
    for g, a, e in zip(got, again, expected):
        assert torch.equal(g, e)
        assert torch.equal(a, e)


# ---- errors ------------------------------------------------------------------------------


def learned(op, *valid_args) -> None:
    """Runs an op once with valid inputs of the shapes a test then records it with: the
    first call of an op whose meta kernel is torch's Python code runs inline (its result
    metadata is learned from it), and raises its own error at the op."""
    op(*valid_args)
    torch.neuron.synchronize()


def test_first_calls_of_python_meta_ops_run_inline_and_are_recorded_after() -> None:
    """In a fresh process: an op whose meta kernel is torch's Python code (relu, ...)
    runs inline the first time per signature, its result metadata learned from that run,
    and is recorded afterwards; torch._dynamo, which those meta kernels import on their
    first call (a second or more), is never imported. index_select and layer norm have
    C++ shape rules (shape_rules.cpp): recorded from their first call."""
    result = run_python("""
        import sys
        import torch
        from neuron_lab import adaptive_eager as ae
        x = torch.randn(4, 5, device="neuron")
        index = torch.tensor([3, 0], device="neuron")
        model = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.ReLU(), torch.nn.LayerNorm(5)).to("neuron")
        torch.neuron.synchronize()
        ae.reset_counters()
        x.index_select(0, index)
        model(x).sum().backward()
        first = dict(ae.counters()["inline_by_op"])
        model(x).sum().backward()  # gradients accumulate now: another signature of add
        ae.reset_counters()
        picked = x.index_select(0, index)
        model(x).sum().backward()
        torch.neuron.synchronize()
        again = dict(ae.counters()["inline_by_op"])
        assert torch.equal(picked.cpu(), x.cpu()[[3, 0]])
        print(first.get("aten::index_select"), "aten::native_layer_norm" in first, "aten::relu" in first, again,
              "torch._dynamo" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["None", "False", "True", "{}", "False"], result.stdout


@pytest.mark.parametrize("wait", ["synchronize", "item", "cpu", "print"])
def test_error_in_a_fused_graph_surfaces_at_the_next_wait(wait: str) -> None:
    x_cpu = torch.randn(4, 5)
    x = x_cpu.to("neuron")
    bad = torch.tensor([0, 9], device="neuron")
    learned(torch.index_select, x, 0, torch.tensor([0, 1], device="neuron"))
    before = x * 3  # computed in an earlier launch
    torch.neuron.synchronize()
    ae.reset_counters()

    same_graph_before = x + 1  # recorded before the failing op, in its graph
    picked = x.index_select(0, bad); line = __import__("inspect").currentframe().f_lineno  # noqa: E702
    total = picked.sum()
    assert ae.counters()["launches"] == 0  # nothing ran yet: the error is in the buffer

    with pytest.raises(IndexError) as info:
        if wait == "synchronize":
            torch.neuron.synchronize()
        elif wait == "item":
            total.item()
        elif wait == "cpu":
            picked.cpu()
        else:
            print(picked)
    message = str(info.value)
    assert "failed on neuron" in message
    assert "aten::index_select" in message
    assert "Float[4, 5]" in message and "Long[2]" in message
    assert f"recorded at {__file__}:{line}" in message or f"{THIS_FILE}:{line}" in message

    # torch's repr turns functorch off with a guard in a local variable: the error that
    # printing raised must not keep it alive (vmap, create_block_mask would then fail)
    assert "FuncTorchDynamicLayer" not in str(torch._C._dispatch_tls_local_exclude_set())
    torch.testing.assert_close(torch.func.vmap(lambda row: row * 2)(x).cpu(), x_cpu * 2, rtol=0, atol=0)

    # reported once; the runtime keeps working and earlier results keep their values
    torch.neuron.synchronize()
    assert torch.equal(before.cpu(), x_cpu * 3)
    assert torch.equal(same_graph_before.cpu(), x_cpu + 1)
    assert torch.equal((x * 2).cpu(), x_cpu * 2)
    assert x.index_select(0, torch.tensor([3, 0], device="neuron")).cpu().equal(x_cpu[[3, 0]])


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda x: torch.multinomial(torch.tensor([0.5, -1.0, 0.5], device="neuron"), 1),
                     id="multinomial"),
        pytest.param(lambda x: torch.nn.functional.nll_loss(x.log_softmax(1), torch.tensor([0, 9, 1, 2],
                                                                                        device="neuron")),
                     id="nll_loss"),
        pytest.param(lambda x: torch.gather(x, 1, torch.tensor([[9]], device="neuron")), id="gather"),
    ],
)
def test_kernel_errors_surface_at_synchronize(op, request) -> None:
    x = torch.randn(4, 5, device="neuron")
    warm_ups = {"multinomial": lambda: torch.multinomial(torch.tensor([0.5, 1.0, 0.5], device="neuron"), 1),
                "nll_loss": lambda: torch.nn.functional.nll_loss(x.log_softmax(1), torch.tensor([0, 1, 1, 2],
                                                                                               device="neuron")),
                "gather": lambda: torch.gather(x, 1, torch.tensor([[1]], device="neuron"))}
    learned(warm_ups[request.node.callspec.id])
    op(x)  # recorded; the check is in the CPU kernel
    with pytest.raises((RuntimeError, IndexError), match="failed on neuron"):
        torch.neuron.synchronize()
    torch.neuron.synchronize()  # reported once
    assert (x * 0).sum().item() == 0.0


def test_ops_recorded_after_a_failing_op_are_not_silently_wrong() -> None:
    """An op recorded after the failing one, independent of it, either runs or raises
    when read; it must not hand back memory that was never written."""
    x = torch.ones(4, device="neuron")
    bad = torch.tensor([0, 500], device="neuron")
    learned(torch.index_select, x, 0, torch.tensor([0, 1], device="neuron"))
    first = x * 2
    x.index_select(0, bad)
    later = first + 1  # independent of the failing op
    with pytest.raises(IndexError, match="failed on neuron"):
        torch.neuron.synchronize()
    assert torch.equal(first.cpu(), torch.full((4,), 2.0))
    try:
        value = later.cpu()
    except RuntimeError:
        return  # reading a result the error skipped is an error: fine
    assert torch.equal(value, torch.full((4,), 3.0))


def test_a_meta_kernel_that_mispredicts_a_shape_raises_then_the_op_runs_inline() -> None:
    """A recorded result takes its shape from the op's meta kernel. Where the CPU kernel
    disagrees, the result is never silently broadcast into the wrong shape: the read
    raises, and from then on the op runs inline with the CPU's shape."""
    lib = torch.library.Library("neuron_test_lying_meta", "DEF")
    lib.define("total(Tensor x) -> Tensor")
    lib.impl("total", lambda x: x.sum(), "CPU")
    lib.impl("total", lambda x: x.new_empty([1]), "Meta")  # wrong: the CPU gives a 0-dim result
    x = torch.ones(3, device="neuron")
    y = torch.ops.neuron_test_lying_meta.total(x)
    with pytest.raises(RuntimeError, match=r"CPU kernel returned Float\[\], but its meta kernel.*said Float\[1\]"):
        y.cpu()
    again = torch.ops.neuron_test_lying_meta.total(x)
    assert again.shape == () and again.item() == 3.0
    assert ae.counters()["inline_by_op"].get("neuron_test_lying_meta::total", 0) >= 1


def test_multilabel_margin_loss_of_a_vector_has_the_cpus_shape() -> None:
    x, target = torch.randn(4), torch.tensor([3, 0, -1, 1])
    expected = torch.nn.functional.multilabel_margin_loss(x, target, reduction="none")
    actual = torch.nn.functional.multilabel_margin_loss(x.to("neuron"), target.to("neuron"), reduction="none")
    assert actual.shape == expected.shape == ()
    assert torch.equal(actual.cpu(), expected)


@pytest.mark.parametrize("dtype, weight_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, None),
                                                 (torch.bfloat16, torch.float32)])
def test_reduced_precision_norms_record_the_cpus_statistics_dtype(dtype, weight_dtype) -> None:
    """Layer and group norm keep mean and rstd in the input's dtype on the CPU (float32 only
    for a bf16/fp16 input with float32 weights); their Python meta kernels, used once
    torch._dynamo is loaded (FSDP2 loads it), say otherwise. Recorded norms must still give
    the CPU's statistics, dtypes included, without a mispredicted-shape error."""
    import torch._dynamo  # noqa: F401 - what makes the runtime use the Python meta kernels

    x, grouped = torch.randn(3, 7, dtype=dtype), torch.randn(2, 6, 5, dtype=dtype)
    weight = None if weight_dtype is None else torch.randn(7, dtype=weight_dtype)
    group_weight = None if weight_dtype is None else torch.randn(6, dtype=weight_dtype)
    expected = [*torch.native_layer_norm(x, [7], weight, weight, 1e-5),
                *torch.native_group_norm(grouped, group_weight, group_weight, 2, 6, 5, 3, 1e-5)]

    def on(t):
        return None if t is None else t.to("neuron")

    for _ in range(3):  # recorded from the second call of a signature on
        actual = [*torch.native_layer_norm(on(x) * 1, [7], on(weight), on(weight), 1e-5),
                  *torch.native_group_norm(on(grouped) * 1, on(group_weight), on(group_weight), 2, 6, 5, 3, 1e-5)]
        for a, e in zip(actual, expected, strict=True):
            assert a.dtype == e.dtype and torch.equal(a.cpu(), e)
    assert ae.counters()["ops_recorded"] > 0


def test_blocking_mode_raises_at_the_op() -> None:
    x = torch.randn(4, 5, device="neuron")
    bad = torch.tensor([0, 9], device="neuron")
    torch.neuron.synchronize()
    ae.reset_counters()
    with neuron_lab.mode("blocking"):
        with pytest.raises(IndexError, match="index out of range"):
            x.index_select(0, bad)
        y = x * 2  # and keeps working
    torch.neuron.synchronize()  # nothing left to report
    assert torch.equal(y.cpu(), x.cpu() * 2)
    counters = ae.counters()
    assert counters["ops_recorded"] == 0
    assert counters["inline_ops"] >= 2


# ---- threads -----------------------------------------------------------------------------




def thread_program(i: int, device: str) -> torch.Tensor:
    b = torch.full((1000,), float(i), device=device)
    for _ in range(50):
        b = b * 1.0 + i
    m = torch.eye(16, device=device) * (i + 1)
    for _ in range(10):
        m = torch.tanh(m @ m / 16 + i)
    return torch.cat([b[:4], m.reshape(-1)[:4]]).cpu()


@pytest.mark.parametrize("own_stream", [False, True], ids=["default_stream", "own_stream"])
def test_four_threads_compute_concurrently(own_stream: bool) -> None:
    expected = [thread_program(i, "cpu") for i in range(4)]

    def work(i: int) -> list[torch.Tensor]:
        outs = []
        for _ in range(5):
            if own_stream:
                with torch.neuron.stream(torch.neuron.Stream()):
                    outs.append(thread_program(i, "neuron"))
            else:
                outs.append(thread_program(i, "neuron"))
        return outs

    for i, outs in enumerate(run_in_threads(work, 4)):
        for got in outs:
            torch.testing.assert_close(got, expected[i], msg=lambda m, i=i: f"thread {i}: {m}")


def test_threads_that_run_ops_at_once_wait_for_each_others_launches() -> None:
    """Four threads with shapes that grow every step: nothing repeats, so ops run at once
    whenever nothing is buffered. A thread must then still wait for the launch of a buffer
    another thread is flushing (its records are neither buffered nor launched for a moment)."""
    def program(i: int, n: int, device: str) -> torch.Tensor:
        b = torch.full((n,), float(i), device=device)
        for _ in range(12):
            b = b * 1.5 + i
        return b[:4].cpu()

    def work(i: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(program(i, n, "neuron"), program(i, n, "cpu")) for n in range(8, 68)]

    for n in range(1, 41):  # new shapes every step: the runtime starts running ops at once
        (torch.full((n,), 1.0, device="neuron") * 2).sum().item()
    assert ae.counters()["graphs_unrepeated"]
    ae.reset_counters()
    for i, pairs in enumerate(run_in_threads(work, 4)):
        for got, expected in pairs:
            assert torch.equal(got, expected), f"thread {i}: {got} != {expected}"
    assert ae.counters()["ops_run_at_once"] > 0


# ---- memory ------------------------------------------------------------------------------


def test_dead_intermediates_take_no_device_memory(no_stray_frees) -> None:
    x = torch.randn(1024, device="neuron")  # 4096 bytes
    torch.neuron.synchronize()
    ae.reset_counters()
    base = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    y = ((x * 2).sin() + 1)
    torch.neuron.synchronize()
    assert torch.neuron.memory_allocated() - base == 4096
    assert torch.neuron.max_memory_allocated() - base == 4096  # only y ever held memory
    counters = ae.counters()
    assert counters["dead_intermediate_bytes"] == 2 * 4096
    assert counters["live_result_bytes"] == 4096
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2).sin() + 1)


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_replayed_graphs_scratch_is_shown_and_freed_by_empty_cache() -> None:
    # A replayed graph's dead intermediates take host scratch, not device memory: the pool
    # that keeps it warm for the next launch is shown in the counters, and empty_cache()
    # gives it back as it gives back the device's cached blocks.
    torch.neuron.empty_cache()
    assert ae.counters()["scratch_cached_bytes"] == 0
    x = torch.randn(1 << 18, device="neuron")  # 1 MiB
    for _ in range(6):  # recorded, then replayed from the cache
        y = (x * 2).sin() + 1
        torch.neuron.synchronize()
    assert ae.counters()["replay_launches"] > 0
    kept = ae.counters()["scratch_cached_bytes"]
    assert kept >= 2 << 20, kept  # x * 2 and its sin(), each 1 MiB, back in the pool
    torch.neuron.empty_cache()
    assert ae.counters()["scratch_cached_bytes"] == 0
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2).sin() + 1, rtol=0, atol=0)
    for _ in range(2):  # the pool fills again, and the graph still gives the CPU's bits
        y = (x * 2).sin() + 1
        torch.neuron.synchronize()
    assert torch.equal(y.cpu(), (x.cpu() * 2).sin() + 1)


def test_eager_mode_gives_every_result_memory(no_stray_frees) -> None:
    x = torch.randn(1024, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.mode("eager"):
        ae.reset_counters()
        base = torch.neuron.memory_allocated()
        torch.neuron.reset_peak_memory_stats()
        y = ((x * 2).sin() + 1)
        torch.neuron.synchronize()
        assert torch.neuron.max_memory_allocated() - base >= 2 * 4096
        assert torch.neuron.memory_allocated() - base == 4096
        counters = ae.counters()
    assert counters["dead_intermediate_bytes"] == 0
    assert counters["launches"] == 3
    torch.testing.assert_close(y.cpu(), (x.cpu() * 2).sin() + 1)


# ---- the graph cache in a training loop ------------------------------------------------


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_steady_state_training_hits_the_cache() -> None:
    neuron_lab.configure(compile_after=10**6)  # restored by the fixture
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    )
    cpu_model = copy.deepcopy(model)
    model.to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.01, momentum=0.9)
    x_cpu, y_cpu = torch.randn(64, 16), torch.randn(64, 1)
    x, y = x_cpu.to("neuron"), y_cpu.to("neuron")

    def step(m, o, inputs, targets) -> float:
        loss = torch.nn.functional.mse_loss(m(inputs), targets)
        o.zero_grad()
        loss.backward()
        o.step()
        return loss.item()

    for _ in range(3):
        step(model, opt, x, y)
    torch.neuron.synchronize()
    ae.reset_counters()
    graphs_before = len(ae.graphs())
    losses = [step(model, opt, x, y) for _ in range(10)]
    counters = settled_counters()

    assert counters["graphs_built"] == 0
    assert len(ae.graphs()) == graphs_before
    assert counters["cache_hits"] >= 10
    assert counters["cache_hits"] == counters["graph_launches"]
    assert counters["compiles_requested"] == 0
    assert counters["launches"] < counters["ops_recorded"]
    assert counters["syncs"].get("aten::_local_scalar_dense", 0) == 10  # one per loss.item()

    cpu_losses = [step(cpu_model, cpu_opt, x_cpu, y_cpu) for _ in range(13)][3:]
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-4, atol=1e-5)


@pytest.mark.usefixtures("graphs_recorded_on_host")
@pytest.mark.parametrize("backward_thread", ["calling thread", "autograd device thread"])
def test_backward_passes_bound_stable_graphs(backward_thread: str) -> None:
    """The start of a backward pass cuts the graph whether autograd runs it on the calling
    thread (neuron_lab's default) or on its device thread (there, the thread switches cut
    it). The loop reads no loss until the end, so only these boundaries split it, and every
    step reuses the same graphs."""
    neuron_lab.configure(compile_after=10**6)  # restored by the fixture
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(64, 16, device="neuron"), torch.randn(64, 1, device="neuron")
    device_thread = backward_thread == "autograd device thread"
    backward_threads = set()
    model[0].weight.register_hook(lambda grad: backward_threads.add(threading.get_ident()))

    def step() -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        with torch.autograd.set_multithreading_enabled(device_thread):
            loss.backward()
        opt.step()
        return loss.detach()

    torch.neuron.synchronize()  # x and y's random ops would fuse into the first forward
    torch.stack([step() for _ in range(10)]).tolist()  # warm-up: the same loop
    ae.reset_counters()
    losses = torch.stack([step() for _ in range(10)]).tolist()
    counters = settled_counters()

    assert (threading.get_ident() in backward_threads) != device_thread
    assert counters["graphs_built"] == 0 and counters["cache_hits"] == counters["graph_launches"]
    # Calling thread: one graph per step (backward, optimizer, next forward); device thread:
    # the backward alone, then optimizer + next forward. Plus the last step's tail.
    assert counters["graph_launches"] == (2 * 10 + 1 if device_thread else 10 + 1)
    boundary = {"thread switch"} if device_thread else {"backward start"}
    # Besides the boundary, only the final read of the losses (.tolist(): a copy to the host).
    assert boundary <= set(counters["flushes"]) <= boundary | {"synchronize", "copy to host"}, counters["flushes"]
    assert len(losses) == 10 and losses[-1] < losses[0]


def test_a_host_write_flushes_the_ops_that_read_the_old_values() -> None:
    x = torch.arange(8.0, device="neuron")
    torch.neuron.synchronize()
    doubled = x * 2  # buffered: reads x
    view_sum = x[2:].sum()  # buffered: reads a view of x
    x.copy_(torch.full((8,), -1.0))  # from the host, now: must not overtake the reads
    torch.testing.assert_close(doubled.cpu(), torch.arange(8.0) * 2)
    assert view_sum.item() == sum(range(2, 8))
    assert x.cpu().eq(-1).all()


def test_graphs_describe_their_source() -> None:
    ae.clear_graph_cache()
    x = torch.randn(32, device="neuron")
    torch.neuron.synchronize()
    line = __import__("inspect").currentframe().f_lineno + 1
    y = x * 3 + 2
    torch.neuron.synchronize()
    ours = [g for g in ae.graphs() if g["first_op"] == "aten::mul"]
    assert len(ours) == 1, ae.graphs()
    g = ours[0]
    assert g["ops"] == 2 and g["hits"] == 1
    assert g["source"] == f"{__file__}:{line} in test_graphs_describe_their_source" or g["source"].endswith(
        f"{THIS_FILE}:{line} in test_graphs_describe_their_source"
    )
    assert g["flush_reason"] == "synchronize"
    assert torch.equal(y.cpu(), x.cpu() * 3 + 2)


# ---- processes ---------------------------------------------------------------------------


def test_fork_after_use_is_a_clear_error_in_the_child() -> None:
    result = run_python(
        """
        import os, sys
        import torch, neuron_lab
        x = torch.ones(3, device="neuron")
        print("parent", x.sum().item(), flush=True)
        pid = os.fork()
        if pid == 0:
            try:
                y = torch.ones(3, device="neuron") + 1
                y.sum().item()
                print("child ran", flush=True)
                os._exit(1)
            except RuntimeError as e:
                print("child error:", str(e).replace("\\n", " "), flush=True)
                os._exit(0)
            except BaseException as e:
                print("child other:", type(e).__name__, e, flush=True)
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        print("child status", os.waitstatus_to_exitcode(status), flush=True)
        print("parent again", (x + 1).sum().item(), flush=True)
        """,
        env={"NEURON_LAB_MODE": "adaptive"},
    )
    out = result.stdout
    assert "parent 3.0" in out, (out, result.stderr)
    assert "child error:" in out and "spawn" in out.split("child error:")[1], (out, result.stderr)
    assert "child status 0" in out, (out, result.stderr)
    assert "parent again 6.0" in out, (out, result.stderr)


@pytest.fixture(scope="module")
def fresh_process():
    """One fresh interpreter without NEURON_LAB_MODE: it reports its mode, then leaves
    adaptive-mode work pending at exit."""
    return run_python(
        """
        import torch, neuron_lab
        print("mode", neuron_lab.get_mode(), flush=True)
        neuron_lab.set_mode("adaptive")
        x = torch.randn(64, 64, device="neuron")
        y = (x @ x).relu().sum()   # left pending at exit
        print("ok", flush=True)
        """,
        env={"NEURON_LAB_MODE": ""},
    )


def test_default_mode_is_adaptive(fresh_process) -> None:
    assert "mode adaptive" in fresh_process.stdout.splitlines(), (fresh_process.stdout, fresh_process.stderr[-2000:])


def test_a_process_with_pending_work_exits_cleanly(fresh_process) -> None:
    assert fresh_process.returncode == 0, fresh_process.stderr[-2000:]
    assert fresh_process.stdout.splitlines()[-1] == "ok"
    assert "Traceback" not in fresh_process.stderr, fresh_process.stderr[-2000:]


def _hot_step(x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 1.5 + torch.cos(x) * 0.25
    acc[1:].add_(y[1:] * 0.5)  # in place, through a view of an input
    return (y * y).relu() - 0.125


def test_by_default_hot_graphs_replay_with_eager_numbers() -> None:
    """The default mode gives eager mode's numbers bit for bit, in every run: graphs of
    eager code are not compiled (compiled code would round differently, and take over
    whenever its background compile finished)."""
    assert ae.policy()["compile"] is False
    neuron_lab.configure(compile_after=2)
    x_cpu = torch.randn(4096)
    acc_cpu = torch.zeros(4096)
    x, acc = x_cpu.to("neuron"), acc_cpu.to("neuron")
    for _ in range(8):
        out = _hot_step(x, acc)
        expected = _hot_step(x_cpu, acc_cpu)
        torch.neuron.synchronize()
        assert torch.equal(out.cpu(), expected) and torch.equal(acc.cpu(), acc_cpu)
    counters = ae.counters()
    assert counters["compiles_requested"] == 0 and counters["compiled_launches"] == 0, counters
    assert counters["cache_hits"] >= 6


def test_hot_graph_is_compiled_and_matches_the_cpu() -> None:
    """The compiled tier, when asked for: a graph seen compile_after times is compiled in
    the background, then runs as compiled code, with results that match the CPU (in-place
    ops and a view included; intermediates dead, one result kept, one input updated in
    place)."""
    neuron_lab.configure(compile_after=2, compile=True)
    step = _hot_step

    x_cpu = torch.randn(4096)
    acc_cpu = torch.zeros(4096)
    x = x_cpu.to("neuron")
    acc = acc_cpu.to("neuron")
    expected_acc = acc_cpu.clone()
    for _ in range(4):
        out = step(x, acc)
        expected = step(x_cpu, expected_acc)
        torch.neuron.synchronize()
    assert ae.wait_for_compiles(timeout=300)
    ae.reset_counters()
    for _ in range(3):
        out = step(x, acc)
        expected = step(x_cpu, expected_acc)
        torch.neuron.synchronize()  # one graph per step, as in warm-up
    counters = ae.counters()
    assert counters["compiled_launches"] >= 1, (counters, ae.graphs())
    assert counters["compiles_failed"] == 0 and counters["compiled_fallbacks"] == 0, ae.graphs()
    torch.testing.assert_close(out.cpu(), expected)
    torch.testing.assert_close(acc.cpu(), expected_acc)


def test_replay_writes_results_in_place_and_never_warns_about_resized_outputs() -> None:
    """Replay runs a functional op's out= kernel into the memory its result was given;
    mse_loss.out resizes its output (other semantics), so it replays through mse_loss
    itself, with the CPU's result and without PyTorch's resize warning."""
    import warnings

    a, b = torch.randn(64, 16), torch.randn(64, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            loss = torch.nn.functional.mse_loss(a.to("neuron").relu(), b.to("neuron"))
            assert torch.equal(loss.cpu(), torch.nn.functional.mse_loss(a.relu(), b))
            assert torch.equal(torch.sin(a.to("neuron")).cpu(), torch.sin(a))


# ---- random ops, factories and host copies are recorded: no host wait -------------------


def test_dropout_is_recorded_and_draws_the_cpus_masks() -> None:
    """F.dropout takes the fused native_dropout off the CPU; on neuron it is spelled out
    with the core's generator, recorded, and replayed in stream order: the CPU's numbers
    for the same seed, with randn before and an inline random op after drawing in order."""
    def program(device: str) -> list[torch.Tensor]:
        torch.manual_seed(3)
        x = torch.ones(64, 32, device=device)
        noise = torch.randn(64, 32, device=device)
        outs = [torch.nn.functional.dropout(x + noise, 0.3) for _ in range(3)]
        outs.append(torch.randperm(16, device=device))
        outs.append(torch.nn.functional.dropout(x, 0.5))
        return [o.cpu() for o in outs]

    expected = program("cpu")
    torch.neuron.synchronize()
    ae.reset_counters()
    actual = program("neuron")
    for a, e in zip(actual, expected):
        assert torch.equal(a, e)
    assert "aten::native_dropout" not in ae.counters()["inline_by_op"]
    assert ae.counters()["syncs"].get("aten::native_dropout", 0) == 0


@pytest.mark.parametrize("run", ["blocking", "at_once_on_host"])
def test_random_ops_run_at_once_wait_for_nothing(run: str) -> None:
    """A random op run now must draw after the recorded random ops before it, so the fallback
    waits for the device first. With nothing buffered or running (blocking mode, or ops run at
    once where the host runs launches) there is nothing to wait for: dropout counts no host
    wait (a warm transformers step counted one per dropout, notebook 6's 7), and still draws
    the CPU's numbers."""
    def program(device: str) -> list[torch.Tensor]:
        torch.manual_seed(5)
        x = torch.ones(32, 16, device=device)
        return [torch.nn.functional.dropout(x * k, 0.25) for k in range(1, 8)]

    expected = program("cpu")
    mode = "blocking" if run == "blocking" else "adaptive"
    with neuron_lab.mode(mode), launches_run_on("host"):
        if run == "at_once_on_host":
            w = torch.ones(8, 8, device="neuron")
            for _ in range(12):  # graphs launched by the host: ops then run at once
                _small_step(torch.ones(2, 8, device="neuron"), w)
            assert ae.counters()["graphs_unrepeated"]
        torch.neuron.synchronize()
        with neuron_lab.explain_scope() as explanation:
            got = program("neuron")
        assert explanation.syncs == 0, [s.what for s in explanation.sync_events]
    assert all(torch.equal(a.cpu(), e) for a, e in zip(got, expected))


def _dropout_step(x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, p: float) -> tuple[torch.Tensor, ...]:
    """Dropout forward and backward on a dense gradient, as in a training step."""
    torch.manual_seed(11)
    x = x.detach().requires_grad_(True)
    y = torch.nn.functional.dropout(x * w, p)
    (y * g).sum().backward()
    return y.detach().cpu(), x.grad.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided"])
def test_dropout_forward_and_backward_give_the_cpus_bits(dtype: torch.dtype, layout: str) -> None:
    """Dropout's pointwise part runs as one fused op (neuron::dropout_apply, and
    neuron::masked_scale in the backward): bit for bit the CPU's results, signed zeros and
    the NaN of inf * 0 included, for dense inputs in any order and (unfused) strided ones."""
    base = torch.randn(48, 40, dtype=dtype)
    base.view(-1)[:4] = torch.tensor([float("inf"), float("nan"), -2.0, -0.0], dtype=dtype)
    x = {"contiguous": base, "transposed": base.t(), "strided": base[:, ::2]}[layout]
    w, g = torch.randn(x.shape, dtype=dtype), torch.randn(x.shape, dtype=dtype)
    for p in (0.1, 0.5, 1.0):
        expected = _dropout_step(x, w, g, p)
        actual = _dropout_step(x.to("neuron"), w.to("neuron"), g.to("neuron"), p)
        for a, e in zip(actual, expected):
            assert same_bits(a, e), (layout, p)


def test_dropout_records_its_fused_ops() -> None:
    """A recorded training step holds the draws and one fused op per dropout direction, not
    ATen's `mask.to(dtype)`, multiply, multiply (a pass and a temporary each)."""
    x, w, g = (torch.randn(64, 32, device="neuron") for _ in range(3))
    for _ in range(3):
        _dropout_step(x, w, g, 0.2)
    with neuron_lab.profiler.profile() as prof:
        _dropout_step(x, w, g, 0.2)
    ops = [o.name for launch in prof.launches for o in launch.ops]
    assert "neuron::dropout_apply" in ops and "neuron::masked_scale" in ops, ops
    assert "aten::native_dropout_backward" not in ops and "aten::_to_copy" not in ops, ops


@pytest.mark.parametrize("compile_tier", [False, True], ids=["replay", "compile-allowed"])
def test_a_hot_graph_with_dropout_keeps_eager_numbers(compile_tier: bool) -> None:
    neuron_lab.configure(compile_after=2, compile=compile_tier)
    x_cpu = torch.randn(256)
    x = x_cpu.to("neuron")
    for step in range(6):
        torch.manual_seed(step)
        expected = torch.nn.functional.dropout(x_cpu * 2, 0.25).sin()
        torch.manual_seed(step)
        actual = torch.nn.functional.dropout(x * 2, 0.25).sin()
        assert torch.equal(actual.cpu(), expected)
    ae.wait_for_compiles(120)
    assert ae.counters()["compiled_launches"] == 0  # random graphs stay in replay: eager's numbers


def test_factories_and_host_copies_are_recorded_without_waiting() -> None:
    x = torch.ones(3, device="neuron")
    y = x * 2
    torch.neuron.synchronize()
    ae.reset_counters()
    steps = torch.arange(2, 20, 3, device="neuron", dtype=torch.float32)
    positions = torch.arange(10, device="neuron")
    small = torch.tensor([1.0, 2.0, 3.0]).to("neuron")
    made_here = torch.tensor([4.0, 5.0, 6.0], device="neuron")
    host = torch.tensor([7.0, 8.0, 9.0])
    y.copy_(host)  # into a tensor a queued launch writes: staged, then copied in stream order
    host.fill_(0.0)  # the copy took the values it had
    z = torch.zeros(4, device="neuron")
    z[1:].copy_(torch.tensor([1.0, 2.0, 3.0]))
    counters = ae.counters()
    assert counters["syncs"] == {} and counters["inline_by_op"] == {}, counters
    assert torch.equal(steps.cpu(), torch.arange(2, 20, 3, dtype=torch.float32))
    assert torch.equal(positions.cpu(), torch.arange(10))
    assert torch.equal(small.cpu(), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(made_here.cpu(), torch.tensor([4.0, 5.0, 6.0]))
    assert torch.equal(y.cpu(), torch.tensor([7.0, 8.0, 9.0]))
    assert torch.equal(z.cpu(), torch.tensor([0.0, 1.0, 2.0, 3.0]))


# ---- flushing and the bounded graph cache -----------------------------------------------


@pytest.mark.usefixtures("launches_on_device_thread")
def test_an_idle_device_gets_buffered_work_before_any_wait() -> None:
    """Small ops reach an idle device in batches of idle_flush_ops: the device computes
    while the host records the rest (generate() reads a token back every step)."""
    neuron_lab.configure(idle_flush_ops=8, idle_flush_bytes=1 << 30)
    x = torch.randn(16, device="neuron")
    torch.neuron.synchronize()
    ae.reset_counters()
    y = x
    for _ in range(8):  # the eighth op finds the device idle (nothing else runs) and launches
        y = y + 1
    before_any_wait = ae.counters()
    assert before_any_wait["flushes"].get("device idle", 0) == 1, before_any_wait["flushes"]
    assert before_any_wait["ops_recorded"] == 8
    torch.testing.assert_close(y.cpu(), x.cpu() + 8)


def test_where_the_host_runs_launches_graphs_are_cut_where_the_program_waits() -> None:
    """No device computes while the host records, so nothing is launched early for an idle
    one: the ops stay buffered until the program waits, and the graph does not depend on timing."""
    neuron_lab.configure(idle_flush_ops=8, idle_flush_bytes=1 << 30)
    x = torch.randn(16, device="neuron")
    torch.neuron.synchronize()
    ae.clear_graph_cache()  # (a cached graph that starts alike would be followed to its end)
    with launches_run_on("host"):
        ae.reset_counters()
        y = x
        for _ in range(24):
            y = y + 1
        before_any_wait = ae.counters()
        assert before_any_wait["launches"] == 0 and before_any_wait["ops_recorded"] == 24, before_any_wait
        expected = x.cpu()
        for _ in range(24):
            expected = expected + 1
        assert torch.equal(y.cpu(), expected)
        assert ae.counters()["launches"] == 1


@pytest.mark.parametrize("runner", ["device_thread", "host"])
def test_a_graph_holds_at_most_max_bytes_of_live_results(runner: str) -> None:
    """A launch gives its live results memory when it starts: a graph is cut once the results
    the program keeps reach max_bytes, so peak memory stays near eager mode's. Intermediates
    that die inside the graph do not count: a chain of them stays one graph."""
    neuron_lab.configure(max_bytes=1 << 20, idle_flush_ops=1000, idle_flush_bytes=1 << 30)
    x = torch.randn(64 * 1024, device="neuron")  # 256 KiB
    ae.clear_graph_cache()
    torch.neuron.synchronize()
    with launches_run_on(runner):
        ae.reset_counters()
        kept = [x]
        for _ in range(12):
            kept.append(kept[-1] + 1)
        torch.neuron.synchronize()
        # 12 results of 256 KiB: past the newest, 1 MiB at the 5th and at the 10th
        assert ae.counters()["flushes"].get("result bytes", 0) == 2, ae.counters()["flushes"]
        ae.reset_counters()
        y = x
        for _ in range(12):
            y = y * 1.5 - 1
        torch.neuron.synchronize()
        assert "result bytes" not in ae.counters()["flushes"], ae.counters()["flushes"]
    expected = x.cpu()
    for i, t in enumerate(kept[1:], 1):
        expected = expected + 1
        assert torch.equal(t.cpu(), expected), i
    expected = x.cpu()
    for _ in range(12):
        expected = expected * 1.5 - 1
    assert torch.equal(y.cpu(), expected)


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_a_training_loop_settles_on_its_cached_graphs() -> None:
    """Once warm, a loop's buffers follow the cached graphs to their ends, wherever an idle
    device cut them first: no new graph per step, whatever the device's timing. (Graphs
    launched back to back join in the first steps: a few graphs more, once.)"""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(12)]).to("neuron")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32, device="neuron")

    def step() -> float:
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss.item()

    ae.clear_graph_cache()
    for _ in range(8):
        step()
    ae.reset_counters()
    for _ in range(10):
        step()
    c = ae.counters()
    assert c["graphs_built"] == 0, (c["graphs_built"], c["flushes"])
    assert c["cache_hits"] == c["graph_launches"] > 0


def _policy_events(since_ns: int) -> list:
    """The runtime's policy events since `since_ns`: earlier tests' events are not this one's."""
    return [e for e in neuron_lab.observability.records.events_since(since_ns) if e.kind == "policy"]


def _three_stretches(x: torch.Tensor, cut: bool) -> torch.Tensor:
    """Three stretches of 40 elementwise ops; with `cut`, a host wait after each."""
    y = x
    for op in (lambda y, k: y * 0.5 + k, lambda y, k: y.sin() - k, lambda y, k: y.cos() * k):
        for k in range(20):
            y = op(y, k)
        if cut:
            torch.neuron.synchronize()
    return y


def _launches_per_iteration(x: torch.Tensor, iterations: int, cut: bool) -> list[int]:
    """Runs the stretches `iterations` times, each after a host wait; the launches of each."""
    expected = _three_stretches(x.cpu(), cut=False)
    launches = []
    for _ in range(iterations):
        before = ae.counters()["launches"]
        out = _three_stretches(x, cut)
        torch.neuron.synchronize()
        launches.append(ae.counters()["launches"] - before)
        assert torch.equal(out.cpu(), expected)
    return launches


@pytest.mark.usefixtures("graphs_recorded_on_host")
@pytest.mark.parametrize("runner", ["device_thread", "host"])
def test_graphs_launched_back_to_back_every_iteration_join_into_one(runner: str) -> None:
    """A loop whose first iteration was cut in three (here by waits that later iterations
    do not have; an idle device cuts at timing-dependent places) launches the cached
    graphs back to back each iteration; after a few such iterations the second and third
    join, with the same bits. The first launch after the host's wait stays short: the
    idle device gets it while the host records the rest. The cached graphs are reused
    on either runner: the host launches a graph at its cached end when the next op comes,
    with the same results alive as at the wait that first launched it."""
    neuron_lab.configure(idle_flush_ops=40, idle_flush_bytes=1 << 30)  # no idle cut inside a stretch
    x = torch.randn(64, device="neuron")
    torch.neuron.synchronize()
    with launches_run_on(runner):
        _join_back_to_back_graphs(x)


def _join_back_to_back_graphs(x: torch.Tensor) -> None:
    ae.clear_graph_cache()
    ae.reset_counters()
    start = neuron_lab.observability.records.now_ns()
    assert _launches_per_iteration(x, 1, cut=True) == [3]
    assert ae.counters()["graphs_built"] == 3
    launches = _launches_per_iteration(x, 8, cut=False)
    assert launches[:2] == [3, 3] and launches[2:] == [2] * 6, launches
    c = ae.counters()
    assert c["graph_joins"] == 1 and c["graphs_built"] == 4, c
    joins = [e for e in _policy_events(start) if e.what == "graphs joined"]
    assert joins and "40 ops from aten::sin" in joins[-1].detail and "graph of 40 ops" in joins[-1].detail


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_graphs_with_a_host_wait_between_them_never_join() -> None:
    """What the host waits for between two graphs cannot be in one graph with them."""
    neuron_lab.configure(idle_flush_ops=40, idle_flush_bytes=1 << 30)
    x = torch.randn(64, device="neuron")
    torch.neuron.synchronize()
    ae.clear_graph_cache()
    ae.reset_counters()
    assert _launches_per_iteration(x, 8, cut=True) == [3] * 8
    c = ae.counters()
    assert c["graph_joins"] == 0 and c["graphs_built"] == 3, c


def test_a_short_expression_runs_as_one_graph_once_cached() -> None:
    """The first run of an expression may give an idle device its first op at once; the
    next runs follow the cached graph and grow past that cut, to one graph whose
    intermediates take no device memory."""
    x = torch.randn(1 << 20, device="neuron")
    ae.clear_graph_cache()
    for _ in range(2):
        ((x * 2 + 1).relu() * 3).sum().item()
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    start = torch.neuron.memory_allocated()
    ae.reset_counters()
    total = ((x * 2 + 1).relu() * 3).sum()
    torch.neuron.synchronize()
    assert ae.counters()["launches"] == 1
    assert torch.neuron.max_memory_allocated() - start <= 512  # the scalar result only
    assert total.item() == pytest.approx(((x.cpu() * 2 + 1).relu() * 3).sum().item(), rel=1e-5)


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_the_graph_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    neuron_lab.configure(graph_cache_size=3)
    xs = [torch.randn(n + 1, device="neuron") for n in range(8)]  # eight shapes: eight graphs
    torch.neuron.synchronize()
    ae.clear_graph_cache()
    ae.reset_counters()
    for x in xs:
        y = x * 2 + 1
        torch.neuron.synchronize()
        torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)
    assert len(ae.graphs()) == 3
    assert ae.counters()["graphs_evicted"] == 5
    assert all(g["first_op"] == "aten::mul" and g["ops"] == 2 for g in ae.graphs()), ae.graphs()
    # The most recent three stay cached and hit; an evicted one is rebuilt, correctly.
    ae.reset_counters()
    y = xs[-1] * 2 + 1
    torch.neuron.synchronize()
    assert ae.counters()["cache_hits"] == 1
    y = xs[0] * 2 + 1
    torch.neuron.synchronize()
    assert ae.counters()["graphs_built"] == 1 and ae.counters()["graphs_evicted"] == 1
    torch.testing.assert_close(y.cpu(), xs[0].cpu() * 2 + 1)


def test_a_session_of_varied_shapes_keeps_the_cache_and_explanations_bounded() -> None:
    """A notebook run a few dozen times with new shapes each time must not grow without
    bound: the cache holds graph_cache_size graphs, and why-slow explanations still name
    the recent graphs."""
    neuron_lab.configure(graph_cache_size=16, run_unrepeated_at_once=False)  # every shape records
    ae.clear_graph_cache()
    for n in range(200):
        x = torch.randn(n + 1, device="neuron")
        y = (x * 2).relu().sum()
        assert y.item() == pytest.approx((x.cpu() * 2).relu().sum().item(), rel=1e-5, abs=1e-5)
    assert len(ae.graphs()) == 16
    assert ae.counters()["graphs_evicted"] >= 200 - 16
    neuron_lab.configure(graph_cache_size=1024, run_unrepeated_at_once=True)


def _step_of_length(n: int, w: torch.Tensor) -> None:
    """One step whose shapes depend on n, as a decode step's do on the KV length; checked bit for bit."""
    x = torch.randn(n, 8, device="neuron")
    y = torch.tanh(x @ w) * 2 + 1
    assert torch.equal(y.cpu(), torch.tanh(x.cpu() @ w.cpu()) * 2 + 1)
    y.sum().item()


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_ops_run_at_once_while_graphs_never_repeat_and_recording_resumes_when_they_do() -> None:
    """generate() grows its KV cache every step: no graph repeats, and building each costs more
    than fusing saves. The runtime then runs ops at once (the same kernels: the same numbers),
    and records again once a probe finds a repeating graph."""
    ae.clear_graph_cache()
    ae.reset_counters()
    start = neuron_lab.observability.records.now_ns()
    w = torch.randn(8, 8, device="neuron")
    for n in range(1, 61):  # every step a new length: 60 new graphs if recorded
        _step_of_length(n, w)
    c = ae.counters()
    assert c["graphs_unrepeated"] and c["ops_run_at_once"] > 0
    assert c["graphs_built"] < 50, c["graphs_built"]  # the first stretch, then probes only
    events = _policy_events(start)
    assert events and events[-1].what == "ops run at once" and "repeated" in events[-1].detail
    x = torch.randn(4, 8, device="neuron")
    for _ in range(80):  # now the same step every time: a probe hits, recording resumes
        (torch.tanh(x @ w) * 2 + 1).sum().item()
    c = ae.counters()
    assert not c["graphs_unrepeated"] and c["cache_hits"] > 0
    switches = [e.what for e in _policy_events(start)]
    resumed = switches.index("ops recorded again")
    assert switches[resumed:] == ["ops recorded again"], switches  # resumed once, and stayed
    before = c["ops_run_at_once"]
    for _ in range(10):
        (torch.tanh(x @ w) * 2 + 1).sum().item()
    assert ae.counters()["ops_run_at_once"] == before  # recorded and fused again


def _long_step_of_length(n: int, w: torch.Tensor) -> torch.Tensor:
    """A step of 12 small ops whose shapes grow with n (a decode step's attention over its KV
    cache), read back and checked bit for bit."""
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(n)).to("neuron")
    y = x
    for _ in range(4):
        y = torch.tanh(y @ w) * 0.5 + 1
    expected = x.cpu()
    for _ in range(4):
        expected = torch.tanh(expected @ w.cpu()) * 0.5 + 1
    assert torch.equal(y.cpu(), expected)
    return y


def test_a_step_whose_shapes_grow_runs_at_once_after_three_regrown_graphs() -> None:
    """The same operators missing the cache with new shapes three times are a loop whose shapes
    grow: ops run at once from then on, without waiting for a window of 32 launches (generate()
    recorded its first 11 tokens before; now 3 or 4)."""
    ae.clear_graph_cache()
    ae.reset_counters()
    start = neuron_lab.observability.records.now_ns()
    w = torch.randn(8, 8, device="neuron")
    for n in range(1, 6):  # the first step's graph also holds w's randn: steps 3 to 5 regrow step 2's
        _long_step_of_length(n, w)
    c = ae.counters()
    assert c["graphs_unrepeated"], c
    assert c["graphs_built"] <= 5, c["graphs_built"]
    events = _policy_events(start)
    assert [e.what for e in events] == ["ops run at once"], events
    assert "ran the operators of an earlier graph with new shapes" in events[0].detail
    assert c["unrepeated_ops_small"]  # so an op waits for a probe's launch instead of recording
    before = ae.counters()["ops_run_at_once"]
    for n in range(6, 10):  # the same numbers when run at once
        _long_step_of_length(n, w)
    assert ae.counters()["ops_run_at_once"] > before


def test_big_ops_that_never_repeat_are_not_small() -> None:
    """A loop of 128 KiB ops whose every graph is new runs ops at once by the few-hits rule,
    but not as small ops: an op arriving while a launch still runs is recorded behind it, so the
    host records while the device computes."""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(256, 256, device="neuron")
    for n in range(1, 41):
        x = torch.randn(128 + n, 256, device="neuron")
        y = torch.tanh(x @ w) * 2 + 1
        assert torch.equal(y.cpu(), torch.tanh(x.cpu() @ w.cpu()) * 2 + 1)
    c = ae.counters()
    assert c["graphs_unrepeated"], c
    assert not c["unrepeated_ops_small"], c


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_one_op_over_many_shapes_keeps_recording() -> None:
    """A test of one op over many sample shapes (an OpInfo sweep) launches graphs of one or two
    ops: they are not a loop's step, and do not count as regrown graphs. Those ops keep being
    recorded, so the recorder stays what such a sweep tests."""
    ae.clear_graph_cache()
    ae.reset_counters()
    for n in range(1, 21):
        x = torch.randn(n, 3, device="neuron")
        assert torch.equal(torch.tanh(x).cpu(), torch.tanh(x.cpu()))
    c = ae.counters()
    assert not c["graphs_unrepeated"] and c["ops_run_at_once"] == 0, c
    assert c["ops_recorded"] >= 20


def test_probes_grow_rarer_while_the_same_ops_keep_missing() -> None:
    """A probe records a graph that a program of growing shapes never uses again. Probes that
    miss with the same operators (new shapes) come at longer and longer intervals; the old
    fixed interval built a graph every 16 host waits for as long as the program ran."""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(8, 8, device="neuron")
    for n in range(1, 61):
        _step_of_length(n, w)
    before = ae.counters()
    for n in range(61, 301):
        _step_of_length(n, w)
    after = ae.counters()
    waits = sum(after["syncs"].values()) - sum(before["syncs"].values())
    built = after["graphs_built"] - before["graphs_built"]
    assert after["graphs_unrepeated"]
    # One probe per 64 host waits at most, each ending at its first (missed) graph.
    assert built <= waits // 64 + 2, f"{built} graphs built over {waits} host waits"


@pytest.mark.parametrize("runner", ["device_thread", "host"])
def test_a_probe_that_misses_ends_at_its_first_unheld_ops(runner: str) -> None:
    """While ops run at once, a probe records a stretch to see whether graphs repeat again. Once
    it has recorded idle_flush_ops ops that no cached graph holds, it will miss: it is launched
    there and ends, and the rest of the stretch runs at once (on the device thread an idle
    device's early launch ends it; where the host runs launches, a 'probe miss' cut). Before, the host runner recorded each probe's
    whole stretch, up to the program's next wait: generation spent 1.3x CPU eager instead of 1.06x."""
    w = torch.randn(8, 8, device="neuron")

    def long_step(n: int) -> None:
        y = torch.ones(n, 8, device="neuron") @ w
        for _ in range(150):
            y = y * 0.5 + 0.25
        y.sum().item()

    ae.clear_graph_cache()
    with launches_run_on(runner):
        for n in range(1, 61):
            long_step(n)
        before = ae.counters()
        for n in range(61, 301):
            long_step(n)
        after = ae.counters()
    assert after["graphs_unrepeated"]
    recorded = after["ops_recorded"] - before["ops_recorded"]
    probes = max(after["graphs_built"] - before["graphs_built"], 1)  # each probe misses once
    assert recorded <= 40 * probes, f"{recorded} ops recorded by {probes} probes"
    assert after["ops_run_at_once"] - before["ops_run_at_once"] > 200 * 300


def test_a_second_pass_over_growing_shapes_keeps_running_ops_at_once() -> None:
    """A notebook cell running generate() twice: the second call goes on running ops at once
    from its first step, and probes rarely (its stretches never repeat one another; the probe
    interval keeps doubling). The policy before probed every 16-64 waits, and a rule before
    that let the few probes that met the first call's graphs switch every length back to
    recording (a graph per step for the whole second call)."""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(8, 8, device="neuron")

    def one_pass() -> None:
        for n in range(1, 151):
            _step_of_length(n, w)

    one_pass()
    first = ae.counters()
    one_pass()
    second = ae.counters()
    assert second["graphs_unrepeated"]
    built = second["graphs_built"] - first["graphs_built"]
    assert built <= 4, f"the second pass built {built} graphs for 150 steps (probes only)"
    assert second["ops_run_at_once"] - first["ops_run_at_once"] > 5 * 150


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_recording_resumes_when_stretches_run_at_once_repeat() -> None:
    """Probes come rarely while shapes keep growing (the interval doubles, up to 1024 waits).
    A program that then repeats (a training loop after generate()) is seen without waiting for
    the next probe: four stretches in a row (ops and shapes between two host waits) that each
    repeat an earlier one begin a probe, and recording resumes a few steps later."""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(8, 8, device="neuron")
    for n in range(1, 151):  # growing shapes: at once, probes ever rarer
        _step_of_length(n, w)
    assert ae.counters()["graphs_unrepeated"]
    x = torch.randn(4, 8, device="neuron")
    for step in range(40):
        assert (torch.tanh(x @ w) * 2 + 1).sum().item() == pytest.approx(float((torch.tanh(x.cpu() @ w.cpu()) * 2 + 1).sum()))
        if not ae.counters()["graphs_unrepeated"]:
            break
    assert not ae.counters()["graphs_unrepeated"], "recording never resumed"
    assert step < 25, f"recording resumed after {step + 1} steps"


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_recording_resumes_for_a_program_whose_period_is_many_stretches() -> None:
    """A training loop over 12 bucketed batch sizes, cached in its first epochs, then a loop
    whose shapes grow (ops run at once), then the training loop again. Its stretches repeat
    with a period of 12: the runtime remembers the last 64 stretches, sees the repeats within
    the second pass over the buckets and probes; the probe meets the cached graphs and
    recording resumes. (Remembering 8 missed every repeat of a period of 12; only the
    fallback probe, after 256 host waits, would have found it.)"""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(64, 64, device="neuron")
    buckets = [torch.randn(100 + k, 64, device="neuron") for k in range(12)]
    expected = [float((torch.tanh(x.cpu() @ w.cpu()) * 2 + 1).sum()) for x in buckets]

    def train_step(x: torch.Tensor) -> float:  # ~25 KiB written per op: not small ops
        return (torch.tanh(x @ w) * 2 + 1).sum().item()

    for _ in range(3):
        for x in buckets:
            train_step(x)
    assert not ae.counters()["graphs_unrepeated"], "the bucketed loop stopped recording"
    small = torch.randn(8, 8, device="neuron")
    for n in range(1, 21):  # growing shapes: ops run at once (5 host waits a step)
        _step_of_length(n, small)
    assert ae.counters()["graphs_unrepeated"]
    built = ae.counters()["graphs_built"]
    for step in range(36):  # one host wait a step, the loss
        assert train_step(buckets[step % len(buckets)]) == pytest.approx(expected[step % len(buckets)])
        if not ae.counters()["graphs_unrepeated"]:
            break
    assert not ae.counters()["graphs_unrepeated"], "recording never resumed"
    assert step < 24, f"recording resumed after {step + 1} steps"
    assert ae.counters()["graphs_built"] == built, "the probes met graphs not cached before"


@pytest.mark.usefixtures("graphs_recorded_on_host")
@pytest.mark.parametrize("dropouts", [2, 5])
def test_probes_begin_at_the_loops_own_waits_not_at_a_random_ops(dropouts: int) -> None:
    """A notebook trains, generates (ops then run at once) and trains again. Running at once,
    each dropout waits so that it draws in order. A probe begun at such a wait starts in the
    middle of a step, where no cached graph starts: it misses, builds a graph nobody uses
    again, and the next probe comes later. Probes begin only at the loop's own waits
    (loss.item()), so none misses (the rule before built 1-2 such graphs here, and a notebook's
    training resumed recording after 6 to 12 steps instead of 3)."""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(8, 8, device="neuron")
    x = torch.randn(16, 8, device="neuron")

    def train_step() -> None:
        y = torch.tanh(x @ w)
        for _ in range(dropouts):
            y = torch.nn.functional.dropout(y, 0.1, training=True) * 1.5
        y.sum().item()

    for _ in range(10):  # recorded: the step's graphs are cached
        train_step()
    for n in range(1, 61):  # growing shapes: ops run at once
        _step_of_length(n, w)
    assert ae.counters()["graphs_unrepeated"]
    built = ae.counters()["graphs_built"]
    for _ in range(40):
        train_step()
        if not ae.counters()["graphs_unrepeated"]:
            break
    assert not ae.counters()["graphs_unrepeated"], "recording never resumed"
    assert ae.counters()["graphs_built"] == built, "a probe began in the middle of a step and missed"


def _decode_step(n: int, x: torch.Tensor, w: torch.Tensor) -> None:
    """A decode step: a fixed-shape prefix read back (its graph repeats), then ops whose shapes
    grow with n (a KV cache's), read back too; checked bit for bit."""
    h = torch.tanh(x @ w) * 2 + 1
    h.sum().item()  # one launch: the same graph every step
    kv = torch.randn(n, x.shape[1], device="neuron")
    y = (torch.softmax(h @ kv.T, dim=-1) @ kv).cpu()  # one launch: new shapes every step
    h, kv = h.cpu(), kv.cpu()  # computed already: no launch
    assert torch.equal(h, torch.tanh(x.cpu() @ w.cpu()) * 2 + 1)
    assert torch.equal(y, torch.softmax(h @ kv.T, dim=-1) @ kv)


def _decode_counters(x: torch.Tensor, w: torch.Tensor, steps: int) -> dict:
    """The runtime's counters after `steps` decode steps from an empty graph cache."""
    ae.clear_graph_cache()
    ae.reset_counters()
    for n in range(1, steps + 1):
        _decode_step(n, x, w)
    return ae.counters()


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_small_ops_run_at_once_when_only_a_fixed_shape_prefix_repeats() -> None:
    """A hand-written decoding loop: each step's fixed-shape prefix hits the cache, the rest
    grows, so half the graphs repeat. With ops this small the device has nothing to compute
    while the host records, and recording only adds to the work: ops run at once (the old
    rule, at most 4 of 32 hits, recorded a new graph every step)."""
    start = neuron_lab.observability.records.now_ns()
    c = _decode_counters(torch.randn(4, 8, device="neuron"), torch.randn(8, 8, device="neuron"), steps=80)
    assert c["graphs_unrepeated"] and c["ops_run_at_once"] > 0
    assert c["graphs_built"] < 50, c["graphs_built"]
    events = _policy_events(start)
    assert events and events[-1].what == "ops run at once", events
    assert "at most half of the last 32 graphs repeated and their ops are small" in events[-1].detail


@pytest.mark.usefixtures("graphs_recorded_on_host")
def test_big_ops_keep_being_recorded_when_only_a_fixed_shape_prefix_repeats() -> None:
    """The same loop with ops of 128 KiB: the device computes while the host records, even
    into new graphs, so the runtime keeps recording."""
    c = _decode_counters(torch.randn(128, 256, device="neuron"), torch.randn(256, 256, device="neuron"), steps=60)
    assert not c["graphs_unrepeated"] and c["ops_run_at_once"] == 0
    assert c["cache_hits"] >= 50  # the prefix's graph, every step


def _small_step(x: torch.Tensor, w: torch.Tensor) -> None:
    """A step of four ops read back, checked bit for bit."""
    y = torch.tanh(x @ w) * 2 + 1
    assert torch.equal(y.cpu(), torch.tanh(x.cpu() @ w.cpu()) * 2 + 1)


@pytest.mark.parametrize("runner, rows, knob, compiled, at_once", [
    ("host", 4, True, False, True),            # 4 KiB per op, no device thread: replay costs more
    ("host", 128, True, False, True),          # 128 KiB per op: the same
    ("device_thread", 4, True, False, False),  # the device thread computes while the host records (cost not weighed)
    ("host", 4, False, False, False),          # configure(run_at_once_on_host=False)
    ("host", 4, True, True, False),            # compile=True: a compiled graph is other kernels
], ids=["host-small", "host-big", "device_thread", "host-knob_off", "host-compiled"])
def test_ops_run_at_once_where_the_host_runs_launches(runner: str, rows: int, knob: bool, compiled: bool,
                                                      at_once: bool) -> None:
    """Where the host runs launches, a replay is the recorded kernels run later on the same
    thread: recording and replaying costs more than running them (tiny transformers steps and
    generate() about 3.6 us per op more; UNet, ResNet-18 and 6-layer 512-wide transformers
    steps 3-15% more). A repeating loop there runs at once after a window of 32 launches, with
    the same numbers, whatever its ops' size; a device thread, the compiled tier or the knob
    keep it recorded. (On the device thread the cost is not weighed here: the tests of
    run_at_once_if_cheaper below weigh it.)"""
    ae.clear_graph_cache()
    ae.reset_counters()
    start = neuron_lab.observability.records.now_ns()
    w = torch.randn(256, 256, device="neuron")
    x = torch.randn(rows, 256, device="neuron")
    with neuron_lab.configured(run_at_once_on_host=knob, run_at_once_if_cheaper=False, compile=compiled,
                               compile_after=10_000), launches_run_on(runner):
        for _ in range(40):
            _small_step(x, w)
        torch.neuron.synchronize()
        c = ae.counters()
        assert c["graphs_unrepeated"] == at_once, c
        assert (c["ops_run_at_once"] > 0) == at_once, c
        assert c["cache_hits"] > 0  # before the switch, every step hit its graph
        events = _policy_events(start)
        if at_once:
            assert [e.what for e in events] == ["ops run at once"], events
            assert "the host runs launches" in events[0].detail, events[0].detail
            assert re.search(r"\d+ bytes written per op", events[0].detail), events[0].detail
            before, launches = c["ops_run_at_once"], c["graph_launches"]
            for _ in range(40):  # the loop goes on repeating: it stays at once
                _small_step(x, w)
            assert ae.counters()["ops_run_at_once"] - before == 40 * 4
            # and no probe records a step: here it could not resume recording
            assert ae.counters()["graph_launches"] == launches
            assert [e.what for e in _policy_events(start)] == ["ops run at once"]
        else:
            assert not events, events


def _chain(y: torch.Tensor, w: torch.Tensor, steps: int) -> torch.Tensor:
    """`steps` steps of four ops, each reading the last: nothing is read back."""
    for _ in range(steps):
        y = torch.tanh(y @ w) * 0.5 + 0.25
    return y


def test_a_loop_that_never_waits_runs_at_once_from_the_op_after_the_switch() -> None:
    """A training loop that reads nothing back never waits on the host. Where the host runs
    launches, the policy's cuts wait for the next op, so such a loop met every op with records
    buffered and never ran one at once: it kept recording for as long as it ran (ResNet-18's
    first 20 steps: 144 graphs, each replayed on the host after its recording, 1.15x the CPU's
    time). After kHostRunsWindow (8) launches its next op launches the buffer and runs at once;
    no graph launches after that, and the numbers are the CPU's."""
    ae.clear_graph_cache()
    ae.reset_counters()
    w = torch.randn(32, 32) / 4
    x = torch.randn(4, 32)
    with neuron_lab.configured(max_ops=16), launches_run_on("host"):  # a graph every four steps
        wn, xn = w.to("neuron"), x.to("neuron")
        y = _chain(xn, wn, 40)  # 160 ops: up to ten graphs of 16 ops
        c = ae.counters()
        assert c["graphs_unrepeated"], c
        assert 8 <= c["graph_launches"] <= 9, c
        y = _chain(y, wn, 40)
        after = ae.counters()
        assert after["graph_launches"] == c["graph_launches"], after
        assert after["ops_run_at_once"] - c["ops_run_at_once"] >= 4 * 40, after
    assert torch.equal(y.cpu(), _chain(x, w, 80))


@pytest.mark.parametrize("runner", ["device_thread", "host"])
def test_a_probe_that_finds_graphs_repeating_resumes_recording_only_on_the_device_thread(runner: str) -> None:
    """generate() runs at once while its shapes grow; called again with the same prompt, its
    probes find every graph cached. With a device thread recording resumes; where the host
    runs launches, replaying those small graphs costs more than running them, so ops stay at
    once (tiny Llama's generate() took 24 ms recorded against 15 ms at once, the CPU's 14).
    (The device thread's cost is not weighed here: see the tests of run_at_once_if_cheaper.)"""
    ae.clear_graph_cache()
    ae.reset_counters()
    start = neuron_lab.observability.records.now_ns()
    with neuron_lab.configured(run_at_once_if_cheaper=False), launches_run_on(runner):
        w = torch.randn(8, 8, device="neuron")
        for n in range(1, 61):  # growing shapes: ops run at once
            _step_of_length(n, w)
        assert ae.counters()["graphs_unrepeated"]
        x = torch.randn(4, 8, device="neuron")
        for _ in range(80):  # the same step every time: probes hit
            _small_step(x, w)
        c = ae.counters()
    switches = [e.what for e in _policy_events(start)]
    if runner == "device_thread":
        assert not c["graphs_unrepeated"] and switches[-1] == "ops recorded again", switches
    else:
        assert c["graphs_unrepeated"] and "ops recorded again" not in switches, switches



_COST_SWITCH = re.compile(r"recording the last 16 graphs cost the host (\d+(?:\.\d+)?) ms \((\d+(?:\.\d+)?) recording, "
                          r"(\d+(?:\.\d+)?) waiting for the device\) while their kernels kept the device thread busy "
                          r"(\d+(?:\.\d+)?) ms")


@pytest.mark.parametrize("knob", [True, False])
def test_on_the_device_thread_ops_run_at_once_where_recording_costs_the_host_more(knob: bool) -> None:
    """With a device thread (torch.get_num_threads() below the usable CPUs: SMT, torchrun's one
    thread per process), a loop of small ops that reads back every step recorded graphs whose
    kernels took less time than the host spent recording and waiting for them (tiny
    transformers steps 1.25-1.45x CPU eager recorded, 1.04-1.16x at once). Each 16 launches
    weigh the two; where the host spent more, ops run at once, with the same numbers, and the
    event says by how much. Probes that find the graphs repeating weigh them again and keep
    ops at once. configure(run_at_once_if_cheaper=False) keeps them recorded."""
    ae.clear_graph_cache()
    start = neuron_lab.observability.records.now_ns()
    w = torch.randn(64, 64, device="neuron")
    x = torch.randn(4, 64, device="neuron")
    with neuron_lab.configured(run_at_once_if_cheaper=knob), launches_run_on("device_thread"):
        for _ in range(40):
            _small_step(x, w)  # each step's read: its launch, run by the waiting host
        # Each 16 launches weigh measured times: on a loaded machine (or in validate mode, where
        # each fast kernel's launch also runs ATen's) one weighing may fall short; a few more
        # give the switch its chance, and without the knob none may come.
        for _ in range(48):
            if ae.counters()["graphs_unrepeated"]:
                break
            _small_step(x, w)
        c = ae.counters()
        assert c["cache_hits"] > 0  # before any switch, every step hit its graph
        assert c["graphs_unrepeated"] == knob, c
        assert (c["ops_run_at_once"] > 0) == knob, c
        events = _policy_events(start)
        if not knob:
            assert not events, events
            return
        assert [e.what for e in events] == ["ops run at once"], events
        match = _COST_SWITCH.search(events[0].detail)
        assert match, events[0].detail
        host, recording, waiting, busy = (float(v) for v in match.groups())
        assert host > busy and abs(host - recording - waiting) < 0.02, events[0].detail
        launches = c["graph_launches"]
        for _ in range(80):  # the loop repeats: probes record a stretch and weigh it again
            _small_step(x, w)
        after = ae.counters()
        assert after["graphs_unrepeated"], after
        assert 1 <= after["graph_launches"] - launches <= 16, after  # a few probes' stretches
        assert "ops recorded again" not in [e.what for e in _policy_events(start)]


def test_on_the_device_thread_recording_stays_where_the_device_computes_while_the_host_works() -> None:
    """Where the device thread's kernels take longer than the host spends recording and waiting
    for them (big matmuls, computed while the host runs Python: a data pipeline, a logger),
    recording pays, and graphs stay recorded: no switch, no op run at once."""
    ae.clear_graph_cache()
    start = neuron_lab.observability.records.now_ns()
    w = torch.randn(512, 512, device="neuron") / 23
    x = torch.randn(512, 512, device="neuron")
    expected = x.cpu()
    with launches_run_on("device_thread"):
        y = x
        for _ in range(12):
            y = torch.tanh(y @ w)  # 1 MiB results: the idle device gets each launch at once
            y = torch.tanh(y @ w)
            ae.flush()  # the rest of the step goes to the device thread too
            sum(i * i for i in range(200_000))  # the host's own work meanwhile
            y.sum().item()
        c = ae.counters()
    assert not c["graphs_unrepeated"] and c["ops_run_at_once"] == 0, c
    assert c["graph_launches"] > 16  # the cost was weighed at least once
    assert not _policy_events(start)
    wc = w.cpu()
    for _ in range(12):
        expected = torch.tanh(torch.tanh(expected @ wc) @ wc)
    assert torch.equal(y.cpu(), expected)


# ---- tiled replay -------------------------------------------------------------------------


def _elementwise_program(x: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> list[torch.Tensor]:
    """Elementwise ops of many kinds (vectorized math with scalar tails, VML-style math,
    scalars, in-place and out=, comparisons, casts, integers, half precision)."""
    y = torch.sin(x) * 1.01 + torch.cos(x) * 0.5
    y = torch.nn.functional.gelu(y) + torch.sigmoid(w) - torch.tanh(y).exp() / 3
    y = torch.where(y > 0, y, w * 0.25).clamp(-2.0, 2.0).pow(2)
    y.add_(w, alpha=0.5).mul_(0.75)
    z = torch.empty_like(y)
    torch.lerp(y, w, 0.3, out=z)
    halves = (z.to(torch.bfloat16) * 1.5 + 1).sqrt()
    doubles = (z.double().log1p() + x.double()).reciprocal()
    ints = (k * 3 + 7).remainder(11) - k
    return [y, z, halves, doubles, ints, (z > w).logical_xor(y < 0)]


@pytest.mark.usefixtures("replay_tier")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [1 << 18, (1 << 18) + 37])
def test_tiled_replay_of_elementwise_runs_gives_eager_bits(threads: int, n: int) -> None:
    """Large elementwise runs replay tile by tile, in cache, with eager mode's bits
    (tails, thread splits and all); where the thread split would move a vector tail,
    they replay whole instead."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x, w = torch.randn(n, device="neuron"), torch.randn(n, device="neuron")
        k = torch.randint(-50, 50, (n,), device="neuron")
        with neuron_lab.mode("eager"):
            expected = [t.cpu() for t in _elementwise_program(x, w, k)]
        ae.reset_counters()
        got = [t.cpu() for t in _elementwise_program(x, w, k)]
        counters = ae.counters()
    finally:
        torch.set_num_threads(previous)
    for g, e in zip(got, expected):
        assert same_bits(g, e), (g.dtype, (g.double() - e.double()).abs().nan_to_num().max())
    split_moves_a_tail = threads > 1 and ((n + 1) // 2) % 256 != 0
    if split_moves_a_tail:
        assert counters["tiled_ops"] == 0, counters
    else:
        assert counters["tiled_runs"] >= 1 and counters["tiled_ops"] >= 20, counters


def test_clearing_the_graph_cache_forgets_finished_launches_but_not_poison() -> None:
    native = neuron_lab.device._C.adaptive
    x = torch.randn(64, device="neuron")
    kept = [(x * i).sin() for i in range(50)]  # 50 results, each used by a launch
    torch.neuron.synchronize()
    assert native.tracked_storages()[0] >= 1
    bad = torch.tensor([0, 700], device="neuron")
    never_computed = x[bad] + 1  # index out of range: raised at the next wait
    with pytest.raises(IndexError):
        torch.neuron.synchronize()
    ae.clear_graph_cache()
    accesses, poisoned = native.tracked_storages()
    assert accesses == 0 and poisoned >= 1  # every launch finished; the unread result stays marked
    with pytest.raises(RuntimeError, match="never computed"):
        never_computed.cpu()
    assert torch.equal(kept[3].cpu(), (x.cpu() * 3).sin())  # what was computed is intact
