"""Printing a neuron tensor whose values raise an error leaves functorch working.

torch's ``Tensor.__repr__`` (``torch._tensor_str._str``) turns functorch off for the
calling thread with a guard held in a local variable, not a ``with`` block. A neuron
tensor's printing reads its values, and that read is where an error of the launch that
computed them is raised (an index out of range in a fused graph). The exception's
traceback then keeps ``_str``'s frame, and with it the guard, alive: as long as the
exception is held (IPython keeps the last one, ``pytest.raises`` its info), functorch
stays off on that thread, and ``torch.func.vmap`` and FlexAttention's
``create_block_mask`` fail with "NYI: querying is_contiguous inside of vmap". Installed
when the device is first used, ``_str`` of a neuron tensor that raises clears the local
variables of the frames below it (the guard's among them) before the error propagates;
the traceback keeps every frame's file and line.
"""

from __future__ import annotations

import functools
import traceback
from typing import Any

import torch

__all__ = ["install"]

_DEVICE_TYPE = "neuron"


def install() -> None:
    """Wraps ``torch._tensor_str._str`` (once)."""
    tensor_str = torch._tensor_str
    if getattr(tensor_str._str, "_releases_guards_on_error", False):
        return
    original = tensor_str._str

    @functools.wraps(original)
    def str_releasing_guards_on_error(self: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        try:
            return original(self, *args, **kwargs)
        except BaseException as e:
            if self.device.type == _DEVICE_TYPE and e.__traceback__ is not None:
                traceback.clear_frames(e.__traceback__.tb_next)
            raise

    str_releasing_guards_on_error._releases_guards_on_error = True  # type: ignore[attr-defined]
    tensor_str._str = str_releasing_guards_on_error
