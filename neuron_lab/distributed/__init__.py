"""Distributed training on ``neuron``: the ``"neuron"`` c10d backend.

``torch.distributed.init_process_group("neuron")`` (or with no backend at all, on a
machine whose accelerator is neuron) makes a ``NeuronProcessGroup``; DDP, FSDP2,
DTensor/DeviceMesh, tensor and pipeline parallelism use it through their usual APIs.
Under ``torchrun`` rank r uses ``neuron:LOCAL_RANK % device_count()``. See
``process_group.py`` for the transport and ``docs/distributed.md`` for the design.

A layer above the device: it uses the device's host-kernel interface for collectives
(one launch of the current stream, a typed ``Reason.COLLECTIVE`` flush) and nothing of
the runtime above it.

To run a notebook cell on N ranks, see ``neuron_lab.launch`` (``%%neuron_distributed``).
"""

from __future__ import annotations

import torch.distributed as dist

from neuron_lab.distributed.agreement import CollectiveMismatchError
from neuron_lab.distributed.records import CollectiveRecord, collective_records, collective_totals

__all__ = ["BACKEND", "CollectiveMismatchError", "CollectiveRecord", "collective_records", "collective_totals",
           "register_backend"]

BACKEND = "neuron"


def register_backend() -> None:
    """Registers the ``"neuron"`` c10d backend for the neuron device (once; cheap: no
    thread, no patch, nothing imported beyond torch.distributed)."""
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return

    def create(store: dist.Store, rank: int, size: int, timeout):  # noqa: ANN001, ANN202 - c10d's signature
        from neuron_lab.distributed.process_group import NeuronProcessGroup

        return NeuronProcessGroup(store, rank, size, timeout)

    dist.Backend.register_backend(BACKEND, create, devices=["neuron"])

