"""What code written for CUDA relies on, and the CPU kernels alone would not give.

neuron computes with the CPU's kernels, but code moved from CUDA takes CUDA's behaviour
for granted wherever the device is not the CPU (Hugging Face's mixture-of-experts layers
count tokens per expert with ``torch.histc`` on int32 ids "off the CPU", since the CPU
kernel supports floating dtypes only).
"""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int16, torch.uint8])
@pytest.mark.parametrize("bounds", [(0, 3), (0, 0), (1, 6)], ids=["min-max", "data-range", "clipped"])
def test_histc_of_integers_counts_like_cuda(dtype: torch.dtype, bounds: tuple) -> None:
    values = torch.tensor([0, 1, 1, 3, 3, 3, 7, 2, 5, 6], dtype=dtype)
    low, high = bounds
    counts = torch.histc(values.to("neuron"), bins=4, min=low, max=high)
    expected = torch.histc(values.double(), bins=4, min=low, max=high).to(dtype)  # CUDA: exact integer counts
    assert counts.dtype == dtype and counts.device.type == "neuron"
    assert torch.equal(counts.cpu(), expected)


def test_histc_out_of_integers_and_floats() -> None:
    values = torch.tensor([0, 2, 2, 3], dtype=torch.int32, device="neuron")
    out = torch.empty(0, dtype=torch.int32, device="neuron")
    torch.histc(values, bins=3, min=0, max=2, out=out)
    assert torch.equal(out.cpu(), torch.tensor([1, 0, 2], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.histc(values, bins=3, out=torch.empty(0, device="neuron"))
    floats = torch.randn(100)
    assert torch.equal(torch.histc(floats.to("neuron"), bins=7).cpu(), torch.histc(floats, bins=7))
