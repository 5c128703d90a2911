"""Dynamo's device interface for ``neuron``: what torch.compile asks a device
(current device, streams, synchronize, capabilities) while tracing and guarding."""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

__all__ = ["NeuronInterface", "register"]


class NeuronInterface(DeviceInterface):
    """torch.neuron seen through Dynamo's DeviceInterface (as CudaInterface does for CUDA)."""

    device = torch.neuron.device  # type: ignore[assignment]
    Event = torch.neuron.Event  # type: ignore[assignment]
    Stream = torch.neuron.Stream  # type: ignore[assignment]

    class Worker:
        """Device queries from Inductor's compile workers (no device state is needed there)."""

        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            return torch.neuron.get_device_properties(device)

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    is_available = staticmethod(torch.neuron.is_available)
    stream = staticmethod(torch.neuron.stream)
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)
    synchronize = staticmethod(torch.neuron.synchronize)
    get_device_properties = staticmethod(torch.neuron.get_device_properties)  # type: ignore[assignment]
    memory_allocated = staticmethod(torch.neuron.memory_allocated)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        previous = torch.neuron.current_device()
        if device >= 0 and device != previous:
            torch.neuron.set_device(device)
        return previous

    exchange_device = maybe_exchange_device

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.neuron.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                             device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return torch.neuron.current_stream(device_idx).stream_id

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> Any:
        return "neuron-emulated"

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.neuron.is_bf16_supported()

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False


def register() -> None:
    """Registers the interface once (torch.compile looks it up by device type)."""
    register_interface_for_device("neuron", NeuronInterface)
