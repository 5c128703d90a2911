"""``torch.neuron``: the CUDA-like module of the neuron device.

Everything a ``torch.cuda`` user reaches for, with the same names and semantics:
devices, streams and events, random number generators, memory statistics.
"""

from __future__ import annotations

from neuron_lab.device import memory
from neuron_lab.device.core import (
    current_device,
    device,
    device_count,
    device_of,
    get_device_capability,
    get_device_name,
    get_device_properties,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    synchronize,
)
from neuron_lab.device.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from neuron_lab.device.rng import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    offset_rng_state,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from neuron_lab.device.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

__all__ = [
    "is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
    "device_of", "get_device_name", "get_device_properties", "get_device_capability", "synchronize",
    "is_bf16_supported",
    "Stream", "Event", "StreamContext", "stream", "current_stream", "default_stream", "set_stream",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
    "set_rng_state", "get_rng_state_all", "set_rng_state_all", "default_generators", "offset_rng_state",
    "memory", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "reset_peak_memory_stats", "reset_max_memory_allocated",
    "reset_accumulated_memory_stats", "memory_stats", "memory_summary", "mem_get_info", "empty_cache",
    "get_amp_supported_dtype", "ipc_collect",
]


def __getattr__(name: str):
    if name == "default_generators":
        from neuron_lab.device import rng

        return rng.default_generators
    raise AttributeError(f"module 'torch.neuron' has no attribute {name!r}")


def is_built() -> bool:
    """The native runtime is part of every neuron_lab install."""
    return True


def get_amp_supported_dtype() -> list:
    """Low-precision dtypes torch.autocast may use on neuron (asked by torch.amp and checkpointing)."""
    import torch

    return [torch.bfloat16, torch.float16]


def _is_in_bad_fork() -> bool:
    """Whether this process was forked after its parent started the device, which it then
    cannot use (torch.manual_seed consults this before seeding custom devices)."""
    from neuron_lab.device import _C

    return _C.in_bad_fork()


def _lazy_init() -> None:
    """PyTorch calls this when the first neuron tensor is made (as ``torch.cuda._lazy_init``):
    what was registered with ``registration.on_first_use`` starts now. In a child forked
    after the device started, torch calls it again, and it raises the device's error."""
    from neuron_lab.device import _C
    from neuron_lab.device.registration import first_use

    _C.check_not_forked()
    first_use()


def ipc_collect() -> None:
    """Frees shared memory no other process references any more (as ``torch.cuda.ipc_collect``)."""
    from neuron_lab.device.sharing import ipc_collect as collect

    collect()
