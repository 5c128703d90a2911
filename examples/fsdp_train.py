"""Train a tiny transformer-style MLP model with FSDP2 (``fully_shard``) on neuron ranks.

    torchrun --standalone --nproc-per-node 2 examples/fsdp_train.py

Each block and then the whole model are sharded across the ranks; every rank trains on
its own part of each batch, and rank 0 prints the loss of the whole batch per step.
Running the model on one CPU process with the whole batches gives the same losses.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard

import neuron_lab  # noqa: F401 - registers the neuron device and its "neuron" c10d backend

STEPS = 5
BATCH = 8  # the whole batch, split between the ranks
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
    """Three blocks and a linear head, initialised on the CPU from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(Block(), Block(), Block(), nn.Linear(DIM, OUT))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of ``step`` (the same on every rank): inputs and regression targets."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, OUT, generator=g)


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


def main() -> None:
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)

    model = build_model().to(device)
    for block in list(model)[:-1]:
        fully_shard(block)  # each block's parameters are gathered only while it runs
    fully_shard(model)
    optimizer = make_optimizer(model)  # it updates this rank's shards only

    for step in range(STEPS):
        x, y = batch(step)
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        loss = F.mse_loss(model(x), y)
        loss.backward()  # gradients are reduce-scattered: each rank keeps its shard's
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)  # the loss of the whole batch
        if rank == 0:
            print(f"step {step} loss {mean.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
