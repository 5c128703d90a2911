"""A fused RMSNorm: ``y = x / sqrt(mean(x**2, -1) + eps) * weight`` over the last dimension.

Forward and backward are each one kernel (one launch over device memory). The forward
computes in float32 (float64 stays float64) whatever the input dtype, and saves the
reciprocal RMS (one value per row) for the backward.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from neuron_lab.kernels._kernel import kernel

__all__ = ["rms_norm", "rms_norm_forward", "rms_norm_backward"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _check(x: Tensor, weight: Optional[Tensor]) -> None:
    torch._check(x.dim() >= 1, lambda: "rms_norm: x needs at least one dimension")
    torch._check(x.is_floating_point(), lambda: f"rms_norm: x must be floating point, got {x.dtype}")
    if weight is not None:
        torch._check(weight.shape == x.shape[-1:],
                     lambda: f"rms_norm: weight must have shape {list(x.shape[-1:])} (the last dimension of "
                             f"x), got {list(weight.shape)}")


@kernel("rms_norm")
def rms_norm_forward(x: Tensor, weight: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    """Returns (y, rstd): y like x, rstd = 1/RMS per row (shape x.shape[:-1], float32 or float64)."""
    compute = _compute_dtype(x.dtype)
    rows = x.reshape(-1, x.shape[-1]).to(compute)
    rstd = rows.square().mean(-1, keepdim=True).add_(eps).rsqrt_()
    y = rows * rstd
    if weight is not None:
        y.mul_(weight.to(compute))
    return y.to(x.dtype).reshape(x.shape), rstd.reshape(x.shape[:-1])


@rms_norm_forward.register_fake
def _(x, weight, eps):
    _check(x, weight)
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=_compute_dtype(x.dtype))


@kernel("rms_norm_backward")
def rms_norm_backward(grad_y: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor,
                      weight_grad: bool) -> list[Tensor]:
    """Returns [grad_x] or, with weight_grad, [grad_x, grad_weight]."""
    compute = rstd.dtype
    d = x.shape[-1]
    rows = x.reshape(-1, d).to(compute)
    g = grad_y.reshape(-1, d).to(compute)
    r = rstd.reshape(-1, 1)
    gw = g * weight.to(compute) if weight is not None else g
    # d/dx_j of x_i * r * w_i  =  r * (gw_j - x_j * r^2 * mean(gw * x))
    dot = (gw * rows).mean(-1, keepdim=True)
    grad_x = (gw - rows * (r * r * dot)) * r
    grads = [grad_x.to(x.dtype).reshape(x.shape)]
    if weight_grad:
        grads.append((g * rows * r).sum(0).to(weight.dtype))
    return grads


@rms_norm_backward.register_fake
def _(grad_y, x, weight, rstd, weight_grad):
    torch._check(not weight_grad or weight is not None, lambda: "rms_norm_backward: weight_grad needs a weight")
    grads = [x.new_empty(x.shape)]
    if weight_grad:
        grads.append(weight.new_empty(weight.shape))
    return grads


def _setup_context(ctx, inputs, output) -> None:
    x, weight, _ = inputs
    _, rstd = output
    ctx.mark_non_differentiable(rstd)
    ctx.has_weight = weight is not None
    ctx.save_for_backward(x, weight, rstd)


def _backward(ctx, grad_y, _grad_rstd):
    x, weight, rstd = ctx.saved_tensors
    weight_grad = ctx.has_weight and ctx.needs_input_grad[1]
    grads = rms_norm_backward(grad_y, x, weight, rstd, weight_grad)
    grad_x = grads[0] if ctx.needs_input_grad[0] else None
    return grad_x, (grads[1] if weight_grad else None), None


rms_norm_forward.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: Tensor, weight: Optional[Tensor] = None, eps: Optional[float] = None) -> Tensor:
    """RMSNorm over the last dimension, as ``F.rms_norm(x, x.shape[-1:], weight, eps)``: one fused
    kernel forward, one backward. ``eps`` defaults, as in ``F.rms_norm``, to the machine epsilon
    of the compute dtype (float32's for float16, bfloat16 and float32 inputs)."""
    if eps is None:
        eps = torch.finfo(_compute_dtype(x.dtype)).eps
    return rms_norm_forward(x, weight, float(eps))[0]
