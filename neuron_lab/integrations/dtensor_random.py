"""DTensor's random ops on neuron meshes, with no opt-in.

DTensor's RNG tracker (``torch.distributed.tensor._random.OffsetBasedRNGTracker``) reads
the device generator's state as CUDA's philox state, 16 bytes of seed and offset, and
moves the offset so that each shard draws its own numbers and replicas draw the same. A
neuron generator is by default in its CPU form (the 5056-byte mt19937 state, so that
seeded programs draw the CPU's numbers), which the tracker cannot read: ``torch.nn.init``
of sharded parameters, dropout on DTensors and ``torch.rand_like`` of a DTensor failed
with a bare ``AssertionError`` inside torch.

So when the tracker starts on a neuron mesh, and whenever it opens a random region, a
neuron generator still in the CPU form (the current core's default one, or the one the
user passed) is put into the offset form, seeded with its current seed at offset 0
(``torch.neuron.offset_rng_state``): every rank that seeded alike starts at the same
state. From then on that generator draws as CUDA's philox does (its numbers depend on
(seed, offset) only, and are not the CPU's); ``manual_seed`` keeps the form, and
``set_rng_state`` with a CPU-form state returns to the CPU form. A program that never
runs a DTensor random op keeps the CPU form.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import torch

__all__ = ["OFFSET_STATE_BYTES", "draw_as_philox", "to_offset_form"]

OFFSET_STATE_BYTES = 16  # seed u64, offset u64: CUDA's philox layout
_DEVICE_TYPE = "neuron"


def to_offset_form(generator: torch.Generator) -> bool:
    """Puts a neuron generator in the CPU form into the offset form, at (its current
    seed, offset 0); True if it changed it."""
    if generator.device.type != _DEVICE_TYPE or generator.get_state().numel() == OFFSET_STATE_BYTES:
        return False
    generator.set_state(torch.neuron.offset_rng_state(generator.initial_seed()))
    return True


def _default_generator() -> torch.Generator:
    """The generator DTensor's tracker reads: ``torch.neuron.get_rng_state()``'s, the
    current core's."""
    from neuron_lab.device import rng

    return rng.default_generator()


def draw_as_philox(module: ModuleType) -> None:
    """Makes ``module`` (``torch.distributed.tensor._random``)'s offset tracker put neuron
    generators into the offset form first (see the module docstring)."""
    tracker = module.OffsetBasedRNGTracker
    if getattr(tracker.__init__, "_neuron_lab", False):
        return
    original_init, original_region = tracker.__init__, tracker._distribute_region

    @functools.wraps(original_init)
    def __init__(self: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        if device_mesh.device_type == _DEVICE_TYPE:  # before it syncs rank 0's state
            to_offset_form(_default_generator())
        original_init(self, device_mesh, *args, **kwargs)

    @functools.wraps(original_region)
    def _distribute_region(self: Any, spec: Any, generator: torch.Generator | None = None) -> Any:
        if self._device.type == _DEVICE_TYPE:
            to_offset_form(generator if generator is not None else _default_generator())
        return original_region(self, spec, generator)

    __init__._neuron_lab = True  # type: ignore[attr-defined]
    tracker.__init__, tracker._distribute_region = __init__, _distribute_region
