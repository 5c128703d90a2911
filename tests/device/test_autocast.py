"""torch.autocast(device_type="neuron") follows CUDA's op lists, op by op."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(4, 4, device="neuron")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_matmuls_and_convolutions_run_in_low_precision(x: torch.Tensor, dtype: torch.dtype) -> None:
    with torch.autocast("neuron", dtype=dtype):
        assert (x @ x).dtype == dtype
        assert torch.mm(x, x).dtype == dtype
        assert F.linear(x, x).dtype == dtype
        assert torch.bmm(x[None], x[None]).dtype == dtype
        assert torch.addmm(x, x, x).dtype == dtype
        conv = F.conv2d(torch.randn(1, 2, 5, 5, device="neuron"), torch.randn(3, 2, 3, 3, device="neuron"))
        assert conv.dtype == dtype
        out, _ = torch.nn.LSTM(4, 4).neuron()(torch.randn(2, 3, 4, device="neuron"))
        assert out.dtype == dtype


def test_reductions_norms_and_losses_run_in_float32(x: torch.Tensor) -> None:
    with torch.autocast("neuron", dtype=torch.bfloat16):
        low = x @ x
        assert low.dtype == torch.bfloat16
        assert low.sum().dtype == torch.float32
        assert F.softmax(low, dim=0).dtype == torch.float32
        assert F.log_softmax(low, dim=0).dtype == torch.float32
        assert F.layer_norm(low, (4,)).dtype == torch.float32
        assert torch.exp(low).dtype == torch.float32
        assert F.mse_loss(low, low).dtype == torch.float32
        assert low.norm().dtype == torch.float32


def test_mixed_inputs_promote_and_other_ops_keep_their_dtype(x: torch.Tensor) -> None:
    with torch.autocast("neuron", dtype=torch.bfloat16):
        low = x @ x
        assert torch.addcmul(x, low, low).dtype == torch.float32  # promote to the widest
        assert torch.relu(low).dtype == torch.bfloat16  # not listed: unchanged
        assert (x + 1).dtype == torch.float32
    assert (x @ x).dtype == torch.float32  # outside the region: nothing changes


def test_binary_cross_entropy_is_refused_with_the_fix(x: torch.Tensor) -> None:
    p = torch.rand(3, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)
        assert F.binary_cross_entropy_with_logits(p, p).dtype == torch.float32


def test_mixed_precision_training_with_grad_scaler() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).neuron()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("neuron")
    x, y = torch.randn(32, 8, device="neuron"), torch.randn(32, 1, device="neuron")
    losses = []
    for _ in range(20):
        with torch.autocast("neuron", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < losses[0]
    assert scaler.get_scale() > 0
