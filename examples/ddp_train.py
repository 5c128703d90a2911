"""Data-parallel training on neuron with DistributedDataParallel.

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py

Every rank holds a copy of a small MLP and trains it on its own slice of each batch; DDP
averages the gradients across ranks during backward, so every rank takes the step that
one process would take on the whole batch. Rank 0 prints each step's loss (the mean of
the ranks' losses, which is the whole batch's loss).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import neuron_lab  # noqa: F401 - the neuron device and its "neuron" c10d backend

STEPS = 8
BATCH = 32  # the whole batch of a step, split evenly across the ranks
FEATURES = 16


def make_model() -> nn.Module:
    """The same initial model on every rank (DDP would broadcast rank 0's anyway)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole batch: a smooth function of the inputs to regress."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.sin(x[:, :4]).sum(dim=1, keepdim=True) + 0.1 * x[:, 4:].sum(dim=1, keepdim=True)
    return x, y


def make_optimizer(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameters, lr=1e-2)


def main() -> None:
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    if BATCH % world:
        raise SystemExit(f"ddp_train.py: the batch of {BATCH} does not split evenly across {world} ranks")
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)

    model = DDP(make_model().to(device), device_ids=[device])
    optimizer = make_optimizer(model.parameters())
    for step in range(STEPS):
        x, y = make_batch(step)
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients, bucket by bucket, as they are ready
        optimizer.step()

        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step} loss {mean_loss.item():.8g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
