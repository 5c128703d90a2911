"""Device management for ``torch.neuron``: which cores exist and which one is current."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from neuron_lab.device import _C

__all__ = [
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "device_of",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "synchronize",
    "is_bf16_supported",
]

DEVICE_NAME = "NeuronCore-v2 (emulated)"


def device_index(device: Any = None, *, optional: bool = True) -> int:
    """Turns ``None``, ``3``, ``"neuron"``, ``"neuron:1"`` or a ``torch.device`` into a core index."""
    if device is None:
        if not optional:
            raise ValueError("expected a neuron device, got None")
        return _C.current_device()
    if isinstance(device, bool):
        raise TypeError(f"expected a neuron device or index, got {device!r}")
    if isinstance(device, int):
        index = device
    else:
        dev = torch.device(device)
        if dev.type != "neuron":
            raise ValueError(f"expected a neuron device, got {str(dev)!r}; use 'neuron' or 'neuron:<index>'")
        index = _C.current_device() if dev.index is None else dev.index
    count = _C.device_count()
    if not 0 <= index < count:
        raise ValueError(
            f"neuron:{index} does not exist: this machine emulates {count} NeuronCore(s), "
            f"neuron:0 to neuron:{count - 1}; set NEURON_LAB_NUM_CORES before importing torch for more"
        )
    return index


def is_available() -> bool:
    """True: the emulated cores are always present."""
    return _C.device_count() > 0


def is_initialized() -> bool:
    """Whether the device runtime has been set up (it is, once ``torch.neuron`` exists), and
    not in a child forked after it started (as ``torch.cuda.is_initialized``)."""
    from neuron_lab.device.registration import is_registered

    return is_registered() and not _C.in_bad_fork()


def device_count() -> int:
    """Number of emulated NeuronCores (``NEURON_LAB_NUM_CORES``)."""
    return _C.device_count()


def current_device() -> int:
    """Index of the current core of this thread."""
    return _C.current_device()


def set_device(device: Any) -> None:
    """Makes ``device`` the current core of this thread."""
    _C.set_device(device_index(device, optional=False))


class device:
    """Context manager that makes a core current, like ``torch.cuda.device``.

    ``with torch.neuron.device(1): x = torch.empty(3, device="neuron")`` puts ``x`` on ``neuron:1``.
    """

    def __init__(self, device: Any) -> None:
        self.index = -1 if device is None or device == -1 else device_index(device)
        self.previous = -1

    def __enter__(self) -> None:
        if self.index >= 0:
            self.previous = _C.current_device()
            _C.set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        if self.index >= 0:
            _C.set_device(self.previous)


class device_of(device):
    """Context manager that makes the core of a tensor current (CPU tensors change nothing)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "neuron" else None)


@dataclass(frozen=True)
class NeuronDeviceProperties:
    """What ``torch.neuron.get_device_properties`` reports about one core."""

    name: str
    index: int
    total_memory: int
    major: int = 2
    minor: int = 0
    is_emulated: bool = True

    def __repr__(self) -> str:
        return (
            f"NeuronDeviceProperties(name={self.name!r}, index={self.index}, "
            f"total_memory={self.total_memory // 2**20}MB, is_emulated={self.is_emulated})"
        )


def get_device_name(device: Any = None) -> str:
    """Name of a core: ``"NeuronCore-v2 (emulated)"``."""
    device_index(device)
    return DEVICE_NAME


def get_device_properties(device: Any = None) -> NeuronDeviceProperties:
    """Name, index and memory capacity of a core."""
    return NeuronDeviceProperties(
        name=DEVICE_NAME, index=device_index(device), total_memory=_C.core_capacity()
    )


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """(major, minor) generation of the emulated core."""
    props = get_device_properties(device)
    return props.major, props.minor


# Modules whose torch.neuron.synchronize() is a profiler finishing its region (torch.profiler's
# exit calls it): their waits are the profiler's own, never the user's (Event.by_profiler).
_PROFILER_CALLERS = frozenset({"torch.autograd.profiler", "torch.profiler.profiler"})


def synchronize(device: Any = None) -> None:
    """Waits until every stream of a core has finished its work."""
    # torch.accelerator.synchronize does nothing in a child forked after the device started;
    # torch.neuron.synchronize raises there, as torch.cuda.synchronize does.
    _C.check_not_forked()
    if sys._getframe(1).f_globals.get("__name__") in _PROFILER_CALLERS:
        _C.trace.enter_profiler_waits()
        try:
            torch.accelerator.synchronize(device_index(device))
        finally:
            _C.trace.exit_profiler_waits()
        return
    torch.accelerator.synchronize(device_index(device))


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """NeuronCores compute natively in bfloat16."""
    return True
