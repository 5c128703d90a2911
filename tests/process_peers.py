"""The other side of tests/device/test_multiprocessing.py: functions that run in other processes.

A peer process (started with the "spawn" method) serves requests from a queue: each names
a function of this module and its arguments, which may hold neuron tensors that arrive
shared; its answer may hold neuron tensors too. Also the datasets and functions that
DataLoader workers and ``mp.spawn`` run.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch

_kept: dict[str, torch.Tensor] = {}


def serve(requests: Any, responses: Any) -> None:
    """Answers ``(function name, args)`` requests until it gets None."""
    while True:
        request = requests.get()
        if request is None:
            return
        name, args = request
        try:
            answer: tuple = ("ok", globals()[name](*args))
        except BaseException:  # noqa: BLE001 - the test shows the peer's traceback
            answer = ("error", traceback.format_exc())
        del request, args  # received tensors are let go of now, not at the next request
        responses.put(answer)
        del answer


def describe(t: torch.Tensor) -> dict:
    """What a received tensor looks like here, its values copied to the CPU."""
    return {
        "type": type(t).__name__,
        "device": str(t.device),
        "dtype": t.dtype,
        "shape": tuple(t.shape),
        "stride": t.stride(),
        "offset": t.storage_offset(),
        "requires_grad": t.requires_grad,
        "values": t.detach().cpu(),
    }


def describe_all(tensors: list[torch.Tensor]) -> list[dict]:
    return [describe(t) for t in tensors]


def raw_bytes(tensors: list[torch.Tensor]) -> list[bytes]:
    """Each tensor's bytes as this process reads them."""
    return [t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes() for t in tensors]


def keep(key: str, tensor: torch.Tensor) -> dict:
    """Keeps a received tensor for later requests; what it looks like, with this process's
    device memory statistics of its core."""
    _kept[key] = tensor
    return {**describe(tensor), **memory(tensor.device.index)}


def memory(index: int) -> dict:
    return {
        "allocated": torch.neuron.memory_allocated(index),
        "reserved": torch.neuron.memory_reserved(index),
    }


def kept_values(key: str) -> torch.Tensor:
    return _kept[key].cpu()


def add_in_place(key: str, value: float) -> bool:
    """Writes a kept tensor here and waits until the write is done."""
    _kept[key].add_(value)
    torch.neuron.synchronize(_kept[key].device)
    return True


def record_stream(key: str) -> bool:
    """record_stream on a received tensor (its memory is not this process's allocator's)."""
    t = _kept[key]
    t.record_stream(torch.neuron.Stream(t.device))
    return True


def make(key: str, values: list, device: str) -> torch.Tensor:
    """A new tensor made here, kept here and sent back."""
    _kept[key] = torch.tensor(values, device=device)
    return _kept[key]


def forget(key: str) -> int:
    """Lets go of a kept tensor; how many this process still maps from others."""
    del _kept[key]
    import gc

    gc.collect()
    from neuron_lab.device import _C

    return _C.ipc.mapped()


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def echo(value: Any) -> Any:
    """Sends what it got straight back."""
    return value


# ---- mp.spawn ----------------------------------------------------------------------------


def spawned_rank(rank: int, results: Any, received: Any, shared: torch.Tensor) -> None:
    """An mp.spawn process: writes its element of a tensor the parent passed, and sends back
    a result on its own core; waits until the parent got it (the parent maps it through a
    descriptor this process hands out)."""
    shared[rank] = rank + 1
    device = torch.device("neuron", rank % torch.neuron.device_count())
    result = torch.arange(4, dtype=torch.float32, device=device) * (rank + 1)
    torch.neuron.synchronize(shared.device)
    results.put((rank, result))
    received.wait(60)


# ---- DataLoader workers -----------------------------------------------------------------


class NeuronItems(torch.utils.data.Dataset):
    """Items made on the neuron device by the worker that loads them."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i), device="neuron") * 2


class CpuItems(torch.utils.data.Dataset):
    """Items that stay on the CPU (the main process moves them to the device)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i))


class InheritedNeuronItems(torch.utils.data.Dataset):
    """Views of a neuron tensor the main process made (a forked worker inherits it)."""

    def __init__(self) -> None:
        self.data = torch.arange(8.0, device="neuron")

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]
