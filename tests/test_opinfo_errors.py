"""Every OpInfo error input that fails on the CPU fails on neuron too, and the process survives.

PyTorch's op_db lists, per op, inputs that must fail (``op.error_inputs``): wrong
shapes, out-of-range indices, out= tensors that overlap an input, bad dtypes.
Each runs on neuron with the same storage sharing as on the CPU. Where the CPU
raises, neuron must raise an exception too (the type may differ where PyTorch
gives PrivateUse1 a generic kernel: ``narrow_copy`` raises IndexError instead of
RuntimeError for a bad dim); an input the CPU accepts is device-specific and is
skipped, as are inputs whose error is about mixing devices.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.utils._pytree import tree_map

OPS = [op for op in op_db if op.error_inputs_func is not None]


class SharingMover:
    """Moves CPU tensors to neuron keeping which of them share storage (views stay views)."""

    def __init__(self) -> None:
        self.bases: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def __call__(self, x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return x
        key = (x.untyped_storage().data_ptr(), x.dtype)
        if key not in self.bases:
            flat = torch.empty(0, dtype=x.dtype).set_(x.untyped_storage())
            self.bases[key] = flat.to("neuron")
        return torch.as_strided(self.bases[key], x.size(), x.stride(), x.storage_offset())


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name + (f".{op.variant_test_name}" if op.variant_test_name else ""))
def test_error_inputs_raise_like_the_cpu(op) -> None:
    for error_input in op.error_inputs("cpu"):
        if "device" in error_input.error_regex:
            continue
        sample = error_input.sample_input
        move = SharingMover()
        args = tree_map(move, sample.args)
        kwargs = tree_map(move, sample.kwargs)
        inp = move(sample.input)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                op(sample.input, *sample.args, **sample.kwargs)
                continue  # the CPU accepts it: an error input for another device
            except Exception:
                pass
            with pytest.raises(Exception) as raised:
                op(inp, *args, **kwargs)
                # In the asynchronous modes a kernel's error is raised at the next wait.
                torch.neuron.synchronize()
        assert str(raised.value), "the error must say what is wrong"
    assert torch.ones(2, device="neuron").sum().item() == 2.0  # the device still works
