"""Neuron tensors between processes, shared as ``torch.multiprocessing`` shares CUDA tensors.

A Queue, ``mp.spawn``'s arguments, DataLoader workers started with
``multiprocessing_context="spawn"`` or ``"forkserver"``: ``torch.multiprocessing`` pickles a
tensor through its storage. Installed when the device is first used, the reduction of a
neuron storage sends no bytes. Device memory is one memory file per core
(``csrc/runtime/segment_memory.cpp``); the receiver maps the same pages, on the same core index,
through the file's descriptor, which multiprocessing passes on with ``DupFd`` as torch's
``file_descriptor`` strategy passes CPU storages (``csrc/python/ipc.cpp``). The two processes then
share the memory: a write on one side is seen by the other once it has synchronized.
Views, offsets, strides, dtypes and ``requires_grad`` travel as torch sends them for CUDA
(a non-leaf tensor that requires grad is refused, as for CUDA); values still being computed
are waited for before the storage is sent.

Lifetime, as for CUDA (torch's "Multiprocessing best practices"): receivers' references are
counted in a small shared counter file, and the sender keeps a shared storage allocated
while any is left, even after its own tensors are gone; every share and
``torch.neuron.ipc_collect()`` let go of the storages no one references any more. A receiver
that dies without freeing its tensors keeps theirs until the sender exits. The sender must
be alive when the receiver unpickles (the descriptor comes from it); the memory itself stays
valid in a receiver that maps it after the sender has exited.

Memory statistics: the sender counts a shared block as allocated while it or a receiver
holds it (until the next share or ``ipc_collect()`` after the last receiver let go); the
receiver's allocator neither owns nor counts memory it received (its ``memory_allocated()``
and ``memory_reserved()`` do not change), as CUDA does not count opened IPC memory. Received
storages are not resizable.

Sharing strategies: ``torch.multiprocessing.set_sharing_strategy`` chooses how CPU storages
are shared; neuron storages are shared the same way under ``file_descriptor`` and
``file_system`` (CUDA's ignore it too), and hold only one descriptor per core and sender.

Forked children: a process forked after the device started cannot use it (the device's
error, naming the fix). A neuron tensor it puts on a queue arrives as that error, raised
where it is received (a DataLoader re-raises it in the main process), rather than failing
unseen in the queue's feeder thread while the receiver waits.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, Callable

import torch

from neuron_lab.device import _C

__all__ = ["install", "ipc_collect"]

_DEVICE_TYPE = "neuron"


def install() -> None:
    """Makes ``torch.multiprocessing`` share neuron storages (once); other storages go
    through torch's own reduction."""
    import torch.multiprocessing  # noqa: F401 - torch's reductions are registered first; ours wraps them

    torch_reduce = ForkingPickler._extra_reducers.get(torch.UntypedStorage)  # type: ignore[attr-defined]
    if getattr(torch_reduce, "_shares_neuron", False):
        return
    if torch_reduce is None:
        torch_reduce = torch.multiprocessing.reductions.reduce_storage

    def reduce_storage(storage: torch.UntypedStorage) -> tuple[Callable[..., Any], tuple]:
        if storage.device.type == _DEVICE_TYPE:
            return _reduce_neuron_storage(storage)
        return torch_reduce(storage)

    reduce_storage._shares_neuron = True  # type: ignore[attr-defined]
    ForkingPickler.register(torch.UntypedStorage, reduce_storage)


def ipc_collect() -> None:
    """Frees the shared neuron memory that no other process references any more
    (``torch.neuron.ipc_collect``, as ``torch.cuda.ipc_collect``)."""
    _C.ipc.collect()


def _reduce_neuron_storage(storage: torch.UntypedStorage) -> tuple[Callable[..., Any], tuple]:
    if _C.in_bad_fork():
        # Pickling runs in a Queue's feeder thread, where an error is printed and the item
        # dropped: the receiver would wait for ever. The error travels instead.
        return (_raise_sent_from_forked_child, (os.getpid(), _forked_child_error()))
    device = storage.device.index
    if storage.nbytes() == 0:
        return (_rebuild_empty, (device,))
    _C.kernels.prepare_storage_access(storage, "share with another process", write=False)
    device, memory_fd, base_offset, length, offset, nbytes, counter_fd, slot = _C.ipc.share(storage)
    return (_rebuild_storage, (device, DupFd(memory_fd), base_offset, length, offset, nbytes, DupFd(counter_fd), slot))


def _rebuild_storage(
    device: int, memory: Any, base_offset: int, length: int, offset: int, nbytes: int, counters: Any, slot: int
) -> torch.UntypedStorage:
    memory_fd, counter_fd = memory.detach(), counters.detach()  # always: the sender holds them until then
    try:
        from neuron_lab.device import api

        api._lazy_init()  # raises in a forked child
        return _C.ipc.open(device, memory_fd, base_offset, length, offset, nbytes, counter_fd, slot)
    finally:
        os.close(memory_fd)
        os.close(counter_fd)


def _rebuild_empty(device: int) -> torch.UntypedStorage:
    return torch.UntypedStorage(0, device=torch.device(_DEVICE_TYPE, device))


def _forked_child_error() -> str:
    try:
        _C.check_not_forked()
    except RuntimeError as e:
        return str(e)
    return "neuron: this process was forked after its parent started the device"


def _raise_sent_from_forked_child(pid: int, message: str) -> None:
    raise RuntimeError(f"a neuron tensor sent by process {pid}: {message}")
