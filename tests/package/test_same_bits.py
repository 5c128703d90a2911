"""The tests' one bit-equality check (``parity.same_bits``): the sign of zero, NaN payloads,
dtypes and shapes count, devices do not."""

from __future__ import annotations

import torch

from parity import same_bits


def test_same_bits_sees_what_torch_equal_misses() -> None:
    zero, negative_zero = torch.tensor([0.0]), torch.tensor([-0.0])
    assert torch.equal(zero, negative_zero) and not same_bits(zero, negative_zero)
    nan = torch.tensor([float("nan")])
    other_payload = (nan.view(torch.int32) ^ 1).view(torch.float32)
    assert same_bits(nan, nan.clone()) and not same_bits(nan, other_payload)
    assert not same_bits(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not same_bits(torch.ones(2), torch.ones(1, 2))
    z = torch.tensor([1 + 2j])
    assert same_bits(z, z.clone()) and not same_bits(z, z.conj())
    assert same_bits(torch.arange(4.0).t(), torch.arange(4.0))
    assert same_bits(torch.arange(4.0, device="neuron") * 2, torch.arange(4.0) * 2)
    assert not same_bits(torch.arange(4.0, device="neuron") * 2, torch.arange(4.0) * 3)
