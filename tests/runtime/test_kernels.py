"""Custom kernels (neuron_lab.kernels): the kernel() API, the fused RMSNorm and softmax-cross-entropy
examples against PyTorch's reference in every mode, gradcheck, the fusion boundary in adaptive mode,
errors, and torch.compile without graph breaks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

import neuron_lab
from neuron_lab import adaptive_eager
from neuron_lab import kernels as nk
from neuron_lab.kernels import kernel

def leaf(t: Tensor) -> Tensor:
    return t.detach().clone().requires_grad_()


@pytest.fixture(autouse=True, scope="module")
def no_background_compiles():
    """Adaptive eager's background compiler traces with torch.fx, whose "tracing" flag is
    process-wide: a torch.compile (or make_fx) on this thread while it compiles fails with
    "Detected that you are using FX to symbolically trace a dynamo-optimized function".
    Let pending compiles finish and request none in this module (graphs around the kernels
    run in the replay tier; it also keeps Inductor off the CPUs)."""
    compile_before = adaptive_eager.policy()["compile"]
    neuron_lab.configure(compile=False)
    assert adaptive_eager.wait_for_compiles(timeout=120)
    yield
    neuron_lab.configure(compile=compile_before)


# ---- kernels defined by the tests (names are process-wide: defined once, here) ---------------

@kernel("test_scale_shift")
def scale_shift(x: Tensor, shift: Tensor, alpha: float) -> Tensor:
    """alpha * x + shift, shift broadcast over the rows (shift may be a 0-dim host scalar)."""
    return x * alpha + shift


@scale_shift.register_fake
def _(x, shift, alpha):
    return torch.empty_like(x)


@kernel("test_accumulate", mutates_args=("acc",))
def accumulate(acc: Tensor, x: Tensor) -> None:
    """acc += x * x, written straight into acc's device memory."""
    acc.add_(x * x)


# ---- the examples against PyTorch, in every mode -------------------------------------------

def test_rms_norm_matches_pytorch_forward_and_backward(mode):
    x_cpu, w_cpu = torch.randn(4, 6, 32), torch.randn(32)
    g_cpu = torch.randn(4, 6, 32)
    x, w = leaf(x_cpu.to("neuron")), leaf(w_cpu.to("neuron"))
    y = nk.rms_norm(x * 1.5, w, 1e-5)  # its input is a pending result in adaptive mode
    out = (y * 2).tanh()  # its output feeds recorded ops
    out.backward(g_cpu.to("neuron"))

    xr, wr = leaf(x_cpu), leaf(w_cpu)
    yr = F.rms_norm(xr * 1.5, (32,), wr, 1e-5)
    outr = (yr * 2).tanh()
    outr.backward(g_cpu)
    torch.testing.assert_close(y.cpu(), yr.detach())
    torch.testing.assert_close(out.cpu(), outr.detach())
    torch.testing.assert_close(x.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.cpu(), wr.grad, rtol=1e-4, atol=1e-5)


def test_rms_norm_without_weight_and_default_eps(mode):
    x_cpu = torch.randn(8, 16)
    x = leaf(x_cpu.to("neuron"))
    y = nk.rms_norm(x)
    y.square().sum().backward()
    xr = leaf(x_cpu)
    F.rms_norm(xr, (16,)).square().sum().backward()
    torch.testing.assert_close(y.cpu(), F.rms_norm(x_cpu, (16,)))
    torch.testing.assert_close(x.grad.cpu(), xr.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_low_precision_computes_in_float32(dtype):
    x_cpu, w_cpu = torch.randn(8, 64).to(dtype), torch.randn(64).to(dtype)
    y = nk.rms_norm(x_cpu.to("neuron"), w_cpu.to("neuron"))
    assert y.dtype == dtype
    torch.testing.assert_close(y.cpu(), F.rms_norm(x_cpu, (64,), w_cpu))
    _, rstd = nk.rms_norm_forward(x_cpu.to("neuron"), None, 1e-6)
    assert rstd.dtype == torch.float32 and rstd.shape == (8,)
    torch.testing.assert_close(rstd.cpu(), x_cpu.float().square().mean(-1).add(1e-6).rsqrt())


def test_softmax_cross_entropy_matches_pytorch_forward_and_backward(mode):
    logits_cpu, target_cpu = torch.randn(12, 10), torch.randint(0, 10, (12,))
    logits = leaf(logits_cpu.to("neuron"))
    loss = nk.softmax_cross_entropy(logits * 3 - 1, target_cpu.to("neuron"))
    (loss * 2).backward()

    lr = leaf(logits_cpu)
    ref = F.cross_entropy(lr * 3 - 1, target_cpu)
    (ref * 2).backward()
    assert loss.shape == () and loss.dtype == torch.float32
    torch.testing.assert_close(loss.cpu(), ref.detach())
    torch.testing.assert_close(logits.grad.cpu(), lr.grad)


def test_kernels_on_cpu_tensors_run_the_body():
    x, w = leaf(torch.randn(3, 8)), leaf(torch.randn(8))
    nk.rms_norm(x, w, 1e-6).sum().backward()
    xr, wr = leaf(x.detach()), leaf(w.detach())
    F.rms_norm(xr, (8,), wr, 1e-6).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad, wr.grad, rtol=1e-4, atol=1e-5)
    logits, target = torch.randn(5, 4), torch.tensor([0, 3, 1, 2, 3])
    torch.testing.assert_close(nk.softmax_cross_entropy(logits, target), F.cross_entropy(logits, target))


def test_gradcheck_float64_on_neuron():
    x = torch.randn(3, 5, dtype=torch.float64, device="neuron", requires_grad=True)
    w = torch.randn(5, dtype=torch.float64, device="neuron", requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: nk.rms_norm(a, b, 1e-5), (x, w))
    logits = torch.randn(4, 6, dtype=torch.float64, device="neuron", requires_grad=True)
    target = torch.tensor([5, 0, 2, 2], device="neuron")
    assert torch.autograd.gradcheck(lambda z: nk.softmax_cross_entropy(z, target), (logits,))


def test_softmax_cross_entropy_is_numerically_safe(mode):
    logits_cpu = torch.randn(6, 5) * 1e4
    logits_cpu[0] = torch.tensor([1e4, -1e4, 1e4, 0.0, 5e3])
    target_cpu = torch.tensor([1, 0, 4, 3, 2, 1])
    logits = leaf(logits_cpu.to("neuron"))
    loss = nk.softmax_cross_entropy(logits, target_cpu.to("neuron"))
    loss.backward()
    naive = (logits_cpu.exp() / logits_cpu.exp().sum(1, keepdim=True)).log()  # what the trick avoids
    assert not torch.isfinite(naive).all()
    lr = leaf(logits_cpu)
    ref = F.cross_entropy(lr, target_cpu)
    ref.backward()
    assert torch.isfinite(loss.cpu()) and torch.isfinite(logits.grad.cpu()).all()
    torch.testing.assert_close(loss.cpu(), ref.detach())
    torch.testing.assert_close(logits.grad.cpu(), lr.grad)


# ---- a user-defined kernel: pending inputs, outputs feeding recorded ops, mutation ---------

def test_user_kernel_with_pending_inputs_and_outputs(mode):
    x_cpu, s_cpu = torch.randn(16, 8), torch.randn(8)
    x, s = x_cpu.to("neuron"), s_cpu.to("neuron")
    y = scale_shift(x.exp(), s + 1, 0.5)
    z = (y * y).sum(0)
    ref = ((x_cpu.exp() * 0.5 + (s_cpu + 1)) ** 2).sum(0)
    torch.testing.assert_close(z.cpu(), ref)
    # A 0-dim host tensor mixes with device tensors, as with CUDA.
    torch.testing.assert_close(scale_shift(x, torch.tensor(2.0), 3.0).cpu(), x_cpu * 3 + 2)


def test_user_kernel_that_mutates_an_argument(mode):
    x_cpu = torch.randn(4, 4)
    acc = torch.zeros(4, 4, device="neuron")
    x = x_cpu.to("neuron")
    acc.add_(1)  # pending write before the kernel
    accumulate(acc, x + 1)
    accumulate(acc, x + 1)
    after = acc * 2  # recorded op reading what the kernel wrote
    torch.testing.assert_close(after.cpu(), (1 + 2 * (x_cpu + 1) ** 2) * 2)


def test_kernel_runs_on_the_inputs_core():
    x = torch.randn(4, 8, device="neuron:1")
    y = scale_shift(x, torch.ones(8, device="neuron:1"), 2.0)
    assert y.device == torch.device("neuron:1")
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)


# ---- the fusion boundary in adaptive mode ---------------------------------------------------

def test_kernel_is_one_inline_launch_between_fused_graphs():
    x = torch.randn(16, 32, device="neuron", requires_grad=True)
    w = torch.randn(32, device="neuron", requires_grad=True)
    torch.neuron.synchronize()
    with neuron_lab.mode("adaptive"):
        adaptive_eager.reset_counters()
        with neuron_lab.profiler.profile() as prof:
            h = (x * 2 + 1).tanh()
            y = nk.rms_norm(h, w)
            loss = (y.exp() * 3).sum()
            value = loss.item()
        counters = adaptive_eager.counters()
        launches = [(l.kind, l.name) for l in prof.launches]
        assert launches[1] == ("inline", "neuron_lab::rms_norm"), launches
        before, after = prof.launches[0], prof.launches[2]
        assert before.kind == "graph" and [o.name for o in before.ops] == ["aten::mul", "aten::add", "aten::tanh"]
        assert after.kind == "graph" and [o.name for o in after.ops] == ["aten::exp", "aten::mul", "aten::sum"]
        assert counters["inline_by_op"].get("neuron_lab::rms_norm") == 1
        assert counters["graph_launches"] == 2

        with neuron_lab.profiler.profile() as prof:
            loss.backward()
            torch.neuron.synchronize()
        backward = [l for l in prof.launches if "rms_norm" in l.name]
        assert [(l.kind, l.name) for l in backward] == [("inline", "neuron_lab::rms_norm_backward")]
        assert any(l.kind == "graph" for l in prof.launches)
    ref = (F.rms_norm((x.detach().cpu() * 2 + 1).tanh(), (32,), w.detach().cpu()).exp() * 3).sum()
    assert value == pytest.approx(ref.item(), rel=1e-5)
    assert x.grad is not None and w.grad is not None


def test_explain_shows_the_kernel_as_an_inline_launch():
    x = torch.randn(8, 4, device="neuron")
    torch.neuron.synchronize()
    with neuron_lab.mode("adaptive"), neuron_lab.explain_scope() as e:
        y = scale_shift(x + 1, x[0], 2.0)
        (y - 1).sum().item()
    assert [ev.what for ev in e.inline_events] == ["neuron_lab::test_scale_shift"]
    assert e.inline_events[0].source.file == __file__
    assert "neuron_lab::test_scale_shift" in str(e)


# ---- errors ---------------------------------------------------------------------------------

def test_tensors_on_two_devices_raise_naming_both():
    x0 = torch.randn(2, 3, device="neuron:0")
    with pytest.raises(RuntimeError, match=r"'x' is on neuron:0 and 'shift' is on neuron:1"):
        scale_shift(x0, torch.randn(3, device="neuron:1"), 1.0)
    with pytest.raises(RuntimeError, match=r"'x' is on neuron:0 and 'shift' is on cpu"):
        scale_shift(x0, torch.randn(3), 1.0)
    with pytest.raises(RuntimeError, match=r"'x' is on neuron:0 and 'weight' is on cpu"):
        nk.rms_norm(x0, torch.ones(3))


def test_a_missing_fake_implementation_is_reported_with_the_fix():
    @kernel("test_no_fake")
    def no_fake(x: Tensor) -> Tensor:
        return x + 1

    for device in ("cpu", "neuron"):
        with pytest.raises(RuntimeError, match=r"(?s)test_no_fake has no fake implementation.*register_fake"):
            no_fake(torch.ones(2, device=device))
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match=r"(?s)test_no_fake has no fake implementation.*register_fake"):
        torch.compile(no_fake, backend="eager", fullgraph=True)(torch.ones(2))
    no_fake.register_fake(lambda x: torch.empty_like(x))
    torch.testing.assert_close(no_fake(torch.ones(2, device="neuron")).cpu(), torch.full((2,), 2.0))


def test_a_body_that_disagrees_with_its_fake_is_reported():
    @kernel("test_wrong_shape", fake=lambda x: x.new_empty(x.shape[0]))
    def wrong_shape(x: Tensor) -> Tensor:
        return x.sum(0)

    with pytest.raises(RuntimeError, match=r"test_wrong_shape: output 0 .* shape \[3\] .* shape \[2\]"):
        wrong_shape(torch.ones(2, 3, device="neuron"))


def test_definition_errors():
    with pytest.raises(ValueError, match="not arguments"):
        kernel("test_bad_mutates", mutates_args=("y",))(accumulate.body)
    with pytest.raises(ValueError, match="type annotation"):
        kernel("test_unannotated")(lambda x: x)


def test_redefining_a_kernel_replaces_it():
    """Re-running a notebook cell that defines a kernel replaces the earlier definition."""
    for factor in (2.0, 3.0):
        @kernel("test_redefined", fake=lambda x: torch.empty_like(x))
        def redefined(x: Tensor) -> Tensor:
            return x * factor

        for device in ("cpu", "neuron"):
            torch.testing.assert_close(redefined(torch.ones(3, device=device)).cpu(), torch.full((3,), factor))


def test_an_error_in_the_kernel_raises_at_the_call_and_the_device_stays_usable(mode):
    logits = torch.randn(3, 4, device="neuron")
    with pytest.raises(IndexError, match="target 7 is out of range for 4 classes"):
        nk.softmax_cross_entropy(logits + 1, torch.tensor([0, 7, 1], device="neuron"))
    loss = nk.softmax_cross_entropy(logits + 1, torch.tensor([0, 3, 1], device="neuron"))
    torch.testing.assert_close(loss.cpu(), F.cross_entropy(logits.cpu() + 1, torch.tensor([0, 3, 1])))


def test_shape_errors_come_from_the_fake_implementation():
    with pytest.raises(RuntimeError, match=r"weight must have shape \[8\]"):
        nk.rms_norm(torch.randn(2, 8, device="neuron"), torch.ones(4, device="neuron"))
    with pytest.raises(RuntimeError, match=r"logits must be \(N, C\)"):
        nk.softmax_cross_entropy(torch.randn(2, 3, 4, device="neuron"), torch.zeros(2, dtype=torch.long,
                                                                                  device="neuron"))


# ---- fake implementations and torch.compile --------------------------------------------------

def test_opcheck_fake_implementations_and_autograd_registration():
    from torch.library import opcheck

    cases = [
        (nk.rms_norm_forward, (torch.randn(3, 8, requires_grad=True), torch.randn(8, requires_grad=True), 1e-6)),
        (nk.rms_norm_backward, (torch.randn(3, 8), torch.randn(3, 8), torch.randn(8), torch.rand(3) + 1, True)),
        (nk.softmax_cross_entropy_forward, (torch.randn(4, 5, requires_grad=True), torch.tensor([0, 4, 2, 1]))),
        (nk.softmax_cross_entropy_backward,
         (torch.tensor(1.0), torch.randn(4, 5), torch.tensor([0, 4, 2, 1]), torch.randn(4), torch.rand(4) + 1)),
    ]
    for k, args in cases:
        opcheck(k.opoverload, args)  # CPU: schema, autograd registration, fake vs real, AOT dispatch
        on_neuron = [a.detach().to("neuron").requires_grad_(a.requires_grad) if isinstance(a, Tensor) else a
                     for a in args]
        opcheck(k.opoverload, on_neuron, test_utils=("test_schema", "test_faketensor"))


def compiled_step(x, w, proj, target):
    y = nk.rms_norm(x, w, 1e-6)
    return nk.softmax_cross_entropy(y @ proj, target)


def step_inputs(device: str):
    gen = torch.Generator().manual_seed(1)
    x, w, proj = torch.randn(6, 8, generator=gen), torch.randn(8, generator=gen), torch.randn(8, 5, generator=gen)
    target = torch.randint(0, 5, (6,), generator=gen)
    return [leaf(x.to(device)), leaf(w.to(device)), leaf(proj.to(device)), target.to(device)]


def check_compiled_step(backend: str, device: str, options: dict | None = None) -> None:
    torch._dynamo.reset()
    ref_args, args = step_inputs(device), step_inputs(device)
    ref = compiled_step(*ref_args)
    ref.backward()
    compiled = torch.compile(compiled_step, backend=backend, fullgraph=True, options=options)  # no graph breaks
    loss = compiled(*args)
    loss.backward()
    torch.testing.assert_close(loss.detach().cpu(), ref.detach().cpu())
    for a, r in zip(args[:3], ref_args[:3]):
        torch.testing.assert_close(a.grad.cpu(), r.grad.cpu(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_on_neuron_without_graph_breaks(backend):
    check_compiled_step(backend, "neuron")


def test_compile_with_inductor_on_cpu_without_graph_breaks():
    check_compiled_step("inductor", "cpu")


@pytest.mark.parametrize("launch", ["async", "inline"])
def test_compile_with_the_neuron_backend(launch):
    from neuron_lab.compile import compiled_graphs

    before = len(compiled_graphs())
    check_compiled_step("neuron", "neuron", {"neuron.launch": launch})
    assert [g["tier"] for g in compiled_graphs()[before:]] == [launch, launch]  # forward and backward
