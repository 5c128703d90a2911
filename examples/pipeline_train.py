"""Pipeline-parallel training on neuron with torch.distributed.pipelining.

    torchrun --standalone --nproc-per-node 2 examples/pipeline_train.py

A small sequential model is split by hand into one stage per rank. Each step the 1F1B
schedule cuts the batch into microbatches: stage 0 feeds them in, the stages pass
activations forward and gradients back (point-to-point sends and receives), and the last
stage computes the loss of each microbatch. The last stage sends the step's loss (the
mean over its microbatches) to rank 0, which prints it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import neuron_lab  # noqa: F401 - the neuron device and its "neuron" c10d backend

STEPS = 8
BATCH, MICROBATCHES = 32, 4
FEATURES, HIDDEN = 16, 64
BLOCKS = 4  # (Linear, Tanh) blocks, split evenly across the stages; the head joins the last


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    width = FEATURES
    for _ in range(BLOCKS):
        layers += [nn.Linear(width, HIDDEN), nn.Tanh()]
        width = HIDDEN
    layers.append(nn.Linear(HIDDEN, 1))
    return nn.Sequential(*layers)


def make_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=g)
    y = torch.sin(x[:, :4]).sum(dim=1, keepdim=True) + 0.1 * x[:, 4:].sum(dim=1, keepdim=True)
    return x, y


def make_optimizer(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05, momentum=0.9)


def stage_module(model: nn.Sequential, stage: int, stages: int) -> nn.Sequential:
    """The layers of ``model`` that ``stage`` runs."""
    per_stage = 2 * BLOCKS // stages
    end = len(model) if stage == stages - 1 else (stage + 1) * per_stage
    return model[stage * per_stage:end]


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def main() -> None:
    dist.init_process_group("neuron")
    rank, stages = dist.get_rank(), dist.get_world_size()
    if BLOCKS * 2 % stages or BATCH % MICROBATCHES:
        raise SystemExit(f"pipeline_train.py: {BLOCKS} blocks do not split evenly into {stages} stages")
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)

    module = stage_module(make_model(), rank, stages).to(device)
    stage = PipelineStage(module, rank, stages, device)  # shapes are inferred at the first step
    # scale_grads=True (the default): the gradients are those of the microbatches' mean loss.
    schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    optimizer = make_optimizer(module.parameters())
    last = rank == stages - 1
    for step in range(STEPS):
        x, y = make_batch(step)
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x.to(device), target=y.to(device) if last else None, losses=losses)
        elif last:
            schedule.step(target=y.to(device), losses=losses)
        else:
            schedule.step()
        optimizer.step()

        step_loss = torch.stack(losses).mean().detach() if last else torch.zeros((), device=device)
        dist.broadcast(step_loss, src=stages - 1)
        if rank == 0:
            print(f"step {step} loss {step_loss.item():.8g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
