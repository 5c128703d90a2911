"""nn.LSTM / nn.GRU and their cells on neuron, and the fused cell ops (test_recurrent_bits.py: bit for bit)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn


@pytest.mark.parametrize("kind", [nn.LSTM, nn.GRU, nn.LSTMCell, nn.GRUCell], ids=lambda k: k.__name__)
@pytest.mark.parametrize("bias", [True, False])
def test_recurrent_layers_match_cpu(kind, bias: bool) -> None:
    torch.manual_seed(0)
    cell = kind in (nn.LSTMCell, nn.GRUCell)
    ref = kind(6, 5, bias=bias) if cell else kind(6, 5, num_layers=2, batch_first=True, bias=bias)
    dev = copy.deepcopy(ref).neuron()
    x = torch.randn(3, 6) if cell else torch.randn(3, 4, 6)
    xn = x.clone().neuron().requires_grad_()
    x.requires_grad_()
    out_ref = ref(x)
    out_dev = dev(xn)
    first_ref = out_ref[0] if isinstance(out_ref, tuple) else out_ref
    first_dev = out_dev[0] if isinstance(out_dev, tuple) else out_dev
    assert first_dev.device.type == "neuron"
    torch.testing.assert_close(first_dev.cpu(), first_ref, rtol=1e-5, atol=1e-6)
    (first_ref.square().sum()).backward()
    (first_dev.square().sum()).backward()
    torch.testing.assert_close(xn.grad.cpu(), x.grad, rtol=1e-4, atol=1e-6)
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad, rtol=1e-4, atol=1e-6)


def test_lstm_trains_with_gradcheck_precision() -> None:
    torch.manual_seed(0)
    cell = nn.LSTMCell(3, 2).double().neuron()
    x = torch.randn(2, 3, dtype=torch.float64, device="neuron", requires_grad=True)
    h = torch.randn(2, 2, dtype=torch.float64, device="neuron", requires_grad=True)
    c = torch.randn(2, 2, dtype=torch.float64, device="neuron", requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, h, c: cell(x, (h, c)), (x, h, c))
    gru = nn.GRUCell(3, 2).double().neuron()
    assert torch.autograd.gradcheck(lambda x, h: gru(x, h), (x, h))
