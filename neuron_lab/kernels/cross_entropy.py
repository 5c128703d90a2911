"""A numerically safe fused softmax + cross-entropy with integer class targets and mean
reduction: ``mean_i(logsumexp(logits_i) - logits_i[target_i])``.

The forward subtracts each row's maximum before exponentiating (the log-sum-exp trick), so
logits of any magnitude give a finite loss; it computes in float32 (float64 stays float64)
and saves the log-sum-exp per row, as its two parts (row maximum and log of the shifted
sum: 2N values, not the N x C softmax). The backward recomputes the softmax from them and
returns ``(softmax - onehot(target)) * grad / N``. Each is one kernel (one launch over device
memory).
"""

from __future__ import annotations

import torch
from torch import Tensor

from neuron_lab.kernels._kernel import kernel

__all__ = ["softmax_cross_entropy", "softmax_cross_entropy_forward", "softmax_cross_entropy_backward"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _check(logits: Tensor, target: Tensor) -> None:
    torch._check(logits.dim() == 2, lambda: f"softmax_cross_entropy: logits must be (N, C), got shape "
                                            f"{list(logits.shape)}")
    torch._check(logits.is_floating_point(), lambda: f"softmax_cross_entropy: logits must be floating point, "
                                                     f"got {logits.dtype}")
    torch._check(target.dim() == 1 and target.shape[0] == logits.shape[0],
                 lambda: f"softmax_cross_entropy: target must be (N,) = ({logits.shape[0]},) class indices, got "
                         f"shape {list(target.shape)}")
    torch._check(not target.is_floating_point() and not target.is_complex() and target.dtype != torch.bool,
                 lambda: f"softmax_cross_entropy: target must hold integer class indices, got {target.dtype}")


def _check_classes(target: Tensor, classes: int) -> None:
    if target.numel() and (int(target.min()) < 0 or int(target.max()) >= classes):
        bad = target[(target < 0) | (target >= classes)][0].item()
        raise IndexError(f"softmax_cross_entropy: target {bad} is out of range for {classes} classes")


@kernel("softmax_cross_entropy")
def softmax_cross_entropy_forward(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (loss, row_max, log_sum): the mean loss (0-dim, logits' dtype) and, per row, the
    maximum and log(sum(exp(logits - max))) (their sum is the row's logsumexp, kept apart so
    that the backward's softmax stays exact for logits of any magnitude)."""
    _check_classes(target, logits.shape[1])
    z = logits.to(_compute_dtype(logits.dtype))
    top = z.amax(1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # rows of -inf/inf: no nan from inf-inf
    shifted = z - top  # <= 0: exp cannot overflow
    log_sum = shifted.exp().sum(1).log_()
    picked = shifted.gather(1, target.long().unsqueeze(1)).squeeze(1)
    loss = (log_sum - picked).mean()
    return loss.to(logits.dtype), top.squeeze(1), log_sum


@softmax_cross_entropy_forward.register_fake
def _(logits, target):
    _check(logits, target)
    stats = _compute_dtype(logits.dtype)
    return (logits.new_empty(()), logits.new_empty(logits.shape[:1], dtype=stats),
            logits.new_empty(logits.shape[:1], dtype=stats))


@kernel("softmax_cross_entropy_backward")
def softmax_cross_entropy_backward(grad_loss: Tensor, logits: Tensor, target: Tensor, row_max: Tensor,
                                   log_sum: Tensor) -> Tensor:
    """Returns d loss / d logits = (softmax(logits) - onehot(target)) * grad_loss / N."""
    n = logits.shape[0]
    p = (logits.to(log_sum.dtype) - row_max.unsqueeze(1)).sub_(log_sum.unsqueeze(1)).exp_()  # the softmax
    index = target.long().unsqueeze(1)
    p.scatter_(1, index, p.gather(1, index).sub_(1))
    p.mul_(grad_loss.to(log_sum.dtype) / n)
    return p.to(logits.dtype)


@softmax_cross_entropy_backward.register_fake
def _(grad_loss, logits, target, row_max, log_sum):
    return logits.new_empty(logits.shape)


def _setup_context(ctx, inputs, output) -> None:
    logits, target = inputs
    _, row_max, log_sum = output
    ctx.mark_non_differentiable(row_max, log_sum)
    ctx.save_for_backward(logits, target, row_max, log_sum)


def _backward(ctx, grad_loss, _grad_max, _grad_log_sum):
    logits, target, row_max, log_sum = ctx.saved_tensors
    return softmax_cross_entropy_backward(grad_loss, logits, target, row_max, log_sum), None


softmax_cross_entropy_forward.register_autograd(_backward, setup_context=_setup_context)


def softmax_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """``F.cross_entropy(logits, target)`` for (N, C) logits and (N,) integer targets (mean
    reduction; no class weights, ignore_index or label smoothing), as one fused kernel forward
    and one backward."""
    return softmax_cross_entropy_forward(logits, target)[0]
