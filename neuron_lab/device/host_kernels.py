"""Host kernels over device memory: code that runs on the host CPU directly over neuron
tensors' memory, as one inline launch of the current stream.

The device's face for the layers that run such code (``neuron_lab.kernels`` custom ops,
the ``neuron`` torch.compile backend's inline graphs): a thin, typed wrapper of the
native ``_C.kernels`` submodule, with the same behaviour. A kernel call goes:

    prepare_host_access(reads, writes, name)        # launch what is buffered, wait for its users
    with InlineLaunch(device, name):                # the block is one launch
        out = body(*[host_alias(t) for t in reads])  # CPU tensors over device memory
    note_written(writes)                            # or adopt(...) for results made inside
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from neuron_lab.device import _C
from neuron_lab.device.trace import Reason

__all__ = ["InlineLaunch", "adopt", "host_alias", "host_allocations_device", "note_written", "prepare_host_access"]

_native = _C.kernels

InlineLaunch = _native.InlineLaunch
"""``with InlineLaunch(device, name, device_memory=False):`` the block is one launch of the
current stream of core ``device``, named ``name`` in the profiler; with
``device_memory=True`` the CPU allocations made inside take device memory (``adopt``
keeps them without copies)."""


def prepare_host_access(reads: Sequence[torch.Tensor], writes: Sequence[torch.Tensor], what: str,
                        reason: Reason = Reason.CUSTOM_KERNEL) -> None:
    """Launches what is buffered and waits for every launch that uses these neuron tensors
    (a wait for ``reason``, by kernel ``what``); raises if a tensor in ``reads`` was never computed."""
    _native.prepare_host_access(reads, writes, what, reason)


def host_alias(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same memory as a neuron tensor (call ``prepare_host_access`` first)."""
    return _native.host_alias(tensor)


def host_allocations_device() -> int | None:
    """The core whose memory this thread's CPU allocations take now, or None: inside
    ``InlineLaunch(..., device_memory=True)`` (a compiled graph run on the host), the
    launch's CPU tensors are device memory that it already prepared."""
    device = int(_native.host_allocations_device())
    return None if device < 0 else device


def note_written(tensors: Sequence[torch.Tensor]) -> None:
    """Marks neuron tensors as computed after a host kernel wrote them."""
    _native.note_written(tensors)


def adopt(values: Sequence[Any], device: int, host_inputs: Sequence[torch.Tensor] = (),
          inputs: Sequence[torch.Tensor] = ()) -> list[Any]:
    """A host kernel's results as neuron tensors on core ``device``, without copies where
    possible: CPU tensors allocated inside ``InlineLaunch(..., device_memory=True)`` keep
    their memory, views of ``host_inputs[i]`` become views of ``inputs[i]``; other tensors
    are copied and other values pass as they are."""
    return _native.adopt(values, int(device), host_inputs, inputs)
