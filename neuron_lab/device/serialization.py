"""Neuron storages in torch's legacy serialization format.

``pickle.dumps(tensor)``, ``copy.deepcopy`` through pickle, ``torch.save(...,
_use_new_zipfile_serialization=False)`` and torch.distributed's object collectives write
a storage with ``UntypedStorage._write_file``, which reads the storage's raw memory
directly, past the device's dispatch. A neuron storage whose values a runtime above
still owes (recorded ops, work queued on a stream) was then written as the memory was
at that moment: zeros, silently. Installed when the device is first used (a neuron
storage cannot exist before), ``_write_file`` of a neuron storage first launches and
waits for the work that writes it, as any read from the host does; ``torch.load`` of that
format fills a fresh neuron storage with ``_set_from_file``, through a copy the device
cannot attribute to the storage, so that copy is waited for and the storage counted as
computed afterwards.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from neuron_lab.device import _C
from neuron_lab.device.core import synchronize

__all__ = ["install"]

_DEVICE_TYPE = "neuron"


def install() -> None:
    """Makes ``UntypedStorage._write_file`` wait for a neuron storage's values and
    ``_set_from_file`` (torch.load of the legacy format) mark them computed (once)."""
    if getattr(torch.UntypedStorage._write_file, "_waits_for_neuron", False):
        return
    write_file, set_from_file = torch.UntypedStorage._write_file, torch.UntypedStorage._set_from_file

    @functools.wraps(write_file)
    def write_file_when_ready(self: torch.UntypedStorage, *args: Any, **kwargs: Any) -> Any:
        if self.device.type == _DEVICE_TYPE:
            _C.kernels.prepare_storage_access(self, "serialize", write=False)
        return write_file(self, *args, **kwargs)

    @functools.wraps(set_from_file)
    def set_from_file_as_computed(self: torch.UntypedStorage, *args: Any, **kwargs: Any) -> Any:
        if self.device.type != _DEVICE_TYPE:
            return set_from_file(self, *args, **kwargs)
        _C.kernels.prepare_storage_access(self, "deserialize", write=True)
        result = set_from_file(self, *args, **kwargs)
        # torch copies the bytes in through a tensor made over the storage's raw pointer,
        # which the device cannot tell apart from other memory: wait for that copy here.
        synchronize(self.device)
        _C.kernels.note_storage_written(self)
        return result

    write_file_when_ready._waits_for_neuron = True  # type: ignore[attr-defined]
    torch.UntypedStorage._write_file = write_file_when_ready
    torch.UntypedStorage._set_from_file = set_from_file_as_computed
