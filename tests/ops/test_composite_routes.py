"""Ops with both a CPU kernel and a composite decomposition run the CPU kernel on neuron.

The dispatcher gives a backend without a kernel of its own an op's
CompositeImplicitAutograd decomposition (at its autograd key at least), while the
CPU runs its fused kernel: ``silu_backward`` and ``mish_backward`` rounded
differently on neuron (about half of 16,384 elements, up to 4.8e-7), so a diffusers
UNet training step drifted from the CPU. The device routes every such op to its CPU
kernel when it loads (composite_routes.cpp); the class is recomputed here from the
dispatcher, so an op a new torch adds to it fails this test if it is not routed.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from neuron_lab.device import _C


def cpu_kernel_and_composite() -> list[str]:
    """Every op with a CPU kernel and a CompositeImplicitAutograd kernel, now."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return sorted(
        name for name in torch._C._dispatch_get_all_op_names()
        if has(name, "CPU") and has(name, "CompositeImplicitAutograd")
    )


def autograd_entry(name: str) -> str:
    """What the dispatcher runs for the op at AutogradPrivateUse1 ("autograd kernel", "math kernel", ...)."""
    for line in torch._C._dispatch_dump_table(name).splitlines():
        if line.startswith("AutogradPrivateUse1:"):
            return line.rsplit("[", 1)[1].rstrip("]")
    return "none"


def test_every_op_with_a_cpu_kernel_and_a_decomposition_runs_its_cpu_kernel() -> None:
    routed, kept = _C.cpu_kernel_routes()
    members = cpu_kernel_and_composite()
    assert "aten::silu_backward" in members and "aten::mish_backward" in members
    unrouted = [
        name for name in members
        if name not in kept and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
    ]
    assert not unrouted, f"ops that decompose on neuron but run a CPU kernel on the CPU: {unrouted}"
    for name in members:
        if name in kept:
            continue
        # Autograd's entry is the op's derivative formula, as on the CPU, not the decomposition.
        assert autograd_entry(name) == "autograd kernel", (name, autograd_entry(name))
    assert set(routed) <= set(members)
    stale = sorted(set(kept) - set(members))
    assert not stale, f"kept-composite entries no longer in the class (remove them): {stale}"
    assert all(reason for reason in kept.values())


@pytest.mark.parametrize("activation", [F.silu, F.mish], ids=["silu", "mish"])
def test_activation_gradients_are_the_cpus_bits(activation, mode: str) -> None:
    x = torch.randn(16384)
    grad = torch.randn(16384)
    ref = x.clone().requires_grad_()
    activation(ref).backward(grad)
    dev = x.to("neuron").requires_grad_()
    activation(dev).backward(grad.to("neuron"))
    assert torch.equal(dev.grad.cpu().view(torch.int32), ref.grad.view(torch.int32))
    # The op itself, called directly with inputs that require grad (autograd's entry).
    op = torch.ops.aten.silu_backward if activation is F.silu else torch.ops.aten.mish_backward
    direct = op(grad.to("neuron"), x.to("neuron").requires_grad_())
    assert torch.equal(direct.cpu().view(torch.int32), op(grad, x).view(torch.int32))


def test_double_backward_still_works_through_the_formula() -> None:
    x = torch.randn(6, dtype=torch.float64, device="neuron", requires_grad=True)
    assert torch.autograd.gradgradcheck(F.silu, (x,))
    assert torch.autograd.gradgradcheck(F.mish, (x,))
