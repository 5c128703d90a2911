"""Deterministic mode fills new memory as the CPU does (NaN, or an integer type's maximum).

With ``torch.use_deterministic_algorithms(True)`` and
``torch.utils.deterministic.fill_uninitialized_memory`` (on by default), the CPU's and
CUDA's ``empty`` kernels fill what they allocate, and ``resize_`` fills what it grows, so
that a read of uninitialised memory is reproducible. Every mode, pending (lazily
allocated) tensors of the default mode included.
"""

from __future__ import annotations

import pytest
import torch
from parity import same_bits

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64,
          torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


@pytest.fixture
def fill_uninitialized():
    was = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
           torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(was[0], warn_only=was[1])
    torch.utils.deterministic.fill_uninitialized_memory = was[2]


def _in_inference_mode(make):
    with torch.inference_mode():
        return make().clone()


CREATORS = {
    "empty": lambda device, dtype: torch.empty(2, 3, dtype=dtype, device=device),
    "empty_strided": lambda device, dtype: torch.empty_strided((2, 3), (1, 2), dtype=dtype, device=device),
    "empty_like": lambda device, dtype: torch.empty_like(torch.zeros(4, dtype=dtype, device=device)),
    "new_empty": lambda device, dtype: torch.zeros(1, dtype=dtype, device=device).new_empty((5,)),
    "new_empty_strided": lambda device, dtype: torch.zeros(1, dtype=dtype, device=device).new_empty_strided(
        (2, 2), (1, 2)),
    "empty_permuted": lambda device, dtype: torch.empty_permuted((2, 3, 2), (2, 0, 1), dtype=dtype, device=device),
    "empty_like in inference mode": lambda device, dtype: _in_inference_mode(
        lambda: torch.empty_like(torch.zeros(4, dtype=dtype, device=device))),
    "empty_channels_last": lambda device, dtype: torch.empty(
        1, 2, 2, 2, dtype=dtype, device=device, memory_format=torch.channels_last),
}


@pytest.mark.parametrize("creator", list(CREATORS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_new_memory_is_filled_as_on_the_cpu(creator: str, dtype, mode: str, fill_uninitialized) -> None:
    make = CREATORS[creator]
    expected = make("cpu", dtype)
    got = make("neuron", dtype)
    assert same_bits(got, expected), f"{creator} {dtype} in {mode} mode: {got.cpu()} != {expected}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool], ids=str)
def test_resize_fills_the_memory_it_grows(dtype, mode: str, fill_uninitialized) -> None:
    expected = torch.zeros(2, dtype=dtype)
    expected.resize_(7)
    got = torch.zeros(2, dtype=dtype, device="neuron")
    got.resize_(7)
    assert same_bits(got, expected)
    # Memory the tensor already had keeps its values.
    assert not got[:2].cpu().any()


