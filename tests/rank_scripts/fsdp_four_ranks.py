"""The two FSDP cases that need four neuron ranks on a 2 x 2 device mesh, each against a
single-process CPU reference trained on the concatenated batch:

- HSDP: ``fully_shard(..., mesh=mesh)`` on a ("replicate", "shard") mesh, parameters
  sharded within a pair of ranks and replicated across the pairs; all four ranks get
  different data.
- 2-D FSDP + TP: each block's MLP tensor-parallel (colwise up, rowwise down) over the
  "tp" dimension, then ``fully_shard`` over the "dp" dimension; the two ranks of a tp
  group see the same data.

And random ops on a DTensor replicated over one mesh dimension and sharded over the
other (the generators in the offset form that DTensor's RNG tracker needs).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from fsdp_tp_common import batches, blocks_model, chunk, max_diff, param_diffs, run_cases, setup

DEVICE = setup()
STEPS = 3
LR = 1e-2


def train(reference: nn.Module, model: nn.Module, parts: int, part: int) -> dict[str, Any]:
    """AdamW steps of ``model`` on chunk ``part`` of ``parts`` of each batch and of the
    CPU ``reference`` on the whole batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    losses, ref_losses = [], []
    for x, y in batches(STEPS, 4 * parts):
        loss = F.mse_loss(model(chunk(x, parts, part).to(DEVICE)), chunk(y, parts, part).to(DEVICE))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = F.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        value = loss.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.AVG)  # tp ranks hold equal losses: the dp mean
        losses.append(value.item())
        ref_losses.append(ref_loss.item())
    return {"losses": losses, "ref_losses": ref_losses, "param_diffs": param_diffs(model, reference)}


def placements(model: nn.Module) -> dict[str, str]:
    return {name: str(tuple(p.placements)) for name, p in model.named_parameters()}


def case_hsdp() -> dict[str, Any]:
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("replicate", "shard"))
    reference = blocks_model()
    model = copy.deepcopy(reference).to(DEVICE)
    for block in list(model)[:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    result = train(reference, model, parts=4, part=dist.get_rank())
    return {**result, "placements": placements(model), "mesh": mesh.mesh.tolist()}


def case_fsdp_tp() -> dict[str, Any]:
    mesh = init_device_mesh("neuron", (2, 2), mesh_dim_names=("dp", "tp"))
    reference = blocks_model()
    model = copy.deepcopy(reference).to(DEVICE)
    for block in list(model)[:-1]:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    result = train(reference, model, parts=2, part=mesh.get_local_rank("dp"))
    return {**result, "placements": placements(model), "coordinate": mesh.get_coordinate()}


def case_random_2d() -> dict[str, Any]:
    """normal_ on (Replicate(), Shard(0)): each shard is what a generator at that shard's
    offset (its index times its size) draws, on both of its replicas."""
    mesh = init_device_mesh("neuron", (2, 2))
    seed = 7
    torch.neuron.set_rng_state(torch.neuron.offset_rng_state(seed))
    d = distribute_tensor(torch.zeros(8, 4, device=DEVICE), mesh, [Replicate(), Shard(0)])
    torch.nn.init.normal_(d)
    local = d.to_local()
    g = torch.Generator(DEVICE)
    g.set_state(torch.neuron.offset_rng_state(seed, mesh.get_local_rank(1) * local.numel()))
    expected = torch.empty(local.shape, device=DEVICE).normal_(generator=g)
    return {"local": local.cpu().flatten().tolist(), "local_diff": max_diff(local, expected),
            "state_after": torch.neuron.get_rng_state().view(torch.int64).tolist()}


if __name__ == "__main__":
    run_cases({"hsdp_2x2": case_hsdp, "fsdp_tp_2d": case_fsdp_tp, "random_2d": case_random_2d})
