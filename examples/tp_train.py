"""Train a tiny transformer-style MLP model with tensor and sequence parallelism on
neuron ranks.

    torchrun --standalone --nproc-per-node 2 examples/tp_train.py

In every block the norm runs on this rank's part of the sequence (SequenceParallel),
the up projection is split by columns and the down projection by rows (each rank holds
half of the hidden units), and the head gathers the output. All ranks train on the same
data; rank 0 prints the loss per step. One CPU process with the whole model gives the
same losses.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

import neuron_lab  # noqa: F401 - registers the neuron device and its "neuron" c10d backend

STEPS = 5
BATCH, SEQUENCE = 2, 8
DIM, HIDDEN, OUT = 16, 64, 4


class Block(nn.Module):
    """Pre-norm MLP with a residual, the MLP half of a transformer layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.up = nn.Linear(DIM, HIDDEN)
        self.down = nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def build_model(seed: int = 0) -> nn.Sequential:
    """Two blocks and a linear head, initialised on the CPU from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(Block(), Block(), nn.Linear(DIM, OUT))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of ``step``: inputs (batch, sequence, dim) and targets (batch, sequence, out)."""
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randn(BATCH, SEQUENCE, DIM, generator=g), torch.randn(BATCH, SEQUENCE, OUT, generator=g)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def tensor_parallel_plan(model: nn.Sequential) -> dict[str, object]:
    """Megatron-style: sequence-sharded activations between the blocks' projections."""
    plan: dict[str, object] = {}
    for i in range(len(model) - 1):
        plan[f"{i}.norm"] = SequenceParallel()
        plan[f"{i}.up"] = ColwiseParallel(input_layouts=Shard(1))
        plan[f"{i}.down"] = RowwiseParallel(output_layouts=Shard(1))
    plan[f"{len(model) - 1}"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    return plan


def main() -> None:
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    mesh = init_device_mesh("neuron", (int(os.environ["WORLD_SIZE"]),), mesh_dim_names=("tp",))
    rank, world = mesh.get_local_rank(), mesh.size()

    model = build_model().to(device)
    parallelize_module(model, mesh, tensor_parallel_plan(model))
    optimizer = make_optimizer(model)  # every parameter is a DTensor: one foreach update

    for step in range(STEPS):
        x, y = batch(step)
        local_sequence = x.chunk(world, dim=1)[rank].to(device)  # the first norm takes this rank's part
        loss = F.mse_loss(model(local_sequence), y.to(device))  # the head's output is whole on every rank
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
