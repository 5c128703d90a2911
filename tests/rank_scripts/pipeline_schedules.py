"""Pipeline parallelism on neuron: a small sequential model split into one stage per
rank, trained a few steps with a pipeline schedule over several microbatches, next to
the whole model on one process (CPU). Each rank reports, per case, the per-microbatch
losses (last stage) and its stage's parameters and gradients, named as in the whole
model, beside the reference's; ``tests/distributed/test_distributed_ddp_pipeline.py`` compares.

Cases (``PIPELINE_CASES``, comma separated; all by default): ``gpipe`` and ``1f1b``
on stages split by hand (``PipelineStage``, shapes inferred at the first step through
object send/recv), ``1f1b_static_shapes`` (the stage is told its input and output
shapes), ``gpipe_traced`` (``pipeline()`` splits the traced model at a ``SplitPoint``).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from ranks import report
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    SplitPoint,
    pipeline,
)

FEATURES, HIDDEN, OUTPUTS = 8, 16, 4
BLOCKS = 4                 # Linear-tanh blocks before the head
MICROBATCHES, MICROBATCH = 4, 2
STEPS = 2
LR = 0.1

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "1f1b_static_shapes": Schedule1F1B,
             "gpipe_traced": ScheduleGPipe}


def whole_model() -> nn.Sequential:
    """The model every case splits: ``BLOCKS`` (Linear, Tanh) pairs, then a Linear head."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    width = FEATURES
    for _ in range(BLOCKS):
        layers += [nn.Linear(width, HIDDEN), nn.Tanh()]
        width = HIDDEN
    layers.append(nn.Linear(HIDDEN, OUTPUTS))
    return nn.Sequential(*layers)


def stage_layers(stage: int, stages: int) -> range:
    """The whole model's layer indices that ``stage`` holds: the blocks split evenly, the
    head with the last stage."""
    per_stage = 2 * BLOCKS // stages
    end = 2 * BLOCKS + 1 if stage == stages - 1 else (stage + 1) * per_stage
    return range(stage * per_stage, end)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    n = MICROBATCHES * MICROBATCH
    return torch.randn(n, FEATURES, generator=g), torch.randn(n, OUTPUTS, generator=g)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def reference() -> dict[str, Any]:
    """The whole model on one process: per step, each microbatch's loss, and the
    gradient of their mean (what a schedule with ``scale_grads=True`` accumulates)."""
    model = whole_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(step)
        micro = [loss_fn(model(xm), ym) for xm, ym in zip(x.chunk(MICROBATCHES), y.chunk(MICROBATCHES), strict=True)]
        torch.stack(micro).mean().backward()
        losses.append([m.item() for m in micro])
        optimizer.step()
    return {"losses": losses, **named_state(range(len(model)), list(model))}


def named_state(indices: range, layers: list[nn.Module]) -> dict[str, Any]:
    """Parameters and gradients of ``layers`` (the whole model's layers ``indices``), named
    as in the whole model, on CPU."""
    params, grads = {}, {}
    for index, layer in zip(indices, layers, strict=True):
        for name, p in layer.named_parameters():
            params[f"{index}.{name}"] = p.detach().cpu().flatten().tolist()
            grads[f"{index}.{name}"] = None if p.grad is None else p.grad.cpu().flatten().tolist()
    return {"params": params, "grads": grads}


def build_stage(case: str, rank: int, stages: int, device: torch.device) -> tuple[Any, list[nn.Module], range]:
    """This rank's stage: split by hand, or by ``pipeline()`` from the traced model."""
    model = whole_model()
    indices = stage_layers(rank, stages)
    if case == "gpipe_traced":
        if stages != 2:
            raise ValueError("gpipe_traced splits the model in two")
        second_stage = str(stage_layers(1, stages).start)  # the layer the second stage begins with
        pipe = pipeline(model, mb_args=(torch.randn(MICROBATCH, FEATURES),),
                        split_spec={second_stage: SplitPoint.BEGINNING})
        stage = pipe.build_stage(rank, device)
        module = stage.submod
        # The traced stage module keeps the whole model's layer names ("0", "2", ...).
        layers = [module.get_submodule(str(i)) for i in indices]
        return stage, layers, indices
    module = nn.Sequential(*[model[i] for i in indices]).to(device)
    layers = list(module)
    if case == "1f1b_static_shapes":
        width_in = FEATURES if rank == 0 else HIDDEN
        width_out = OUTPUTS if rank == stages - 1 else HIDDEN
        # The examples carry requires_grad too: an output example that does not require grad
        # tells the stage to expect no gradient for it from the next stage.
        stage = PipelineStage(module, rank, stages, device,
                              input_args=torch.empty(MICROBATCH, width_in, device=device, requires_grad=rank > 0),
                              output_args=torch.empty(MICROBATCH, width_out, device=device, requires_grad=True))
    else:
        stage = PipelineStage(module, rank, stages, device)
    return stage, layers, indices


def distributed(case: str, rank: int, stages: int, device: torch.device) -> dict[str, Any]:
    stage, layers, indices = build_stage(case, rank, stages, device)
    schedule = SCHEDULES[case](stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    parameters = [p for layer in layers for p in layer.parameters()]
    optimizer = torch.optim.SGD(parameters, lr=LR)
    last = rank == stages - 1
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(step)
        step_losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x.to(device))
        elif last:
            schedule.step(target=y.to(device), losses=step_losses)
        else:
            schedule.step()
        losses.append([loss.item() for loss in step_losses] if last else None)
        optimizer.step()
    return {"losses": losses, "layers": list(indices), **named_state(indices, layers)}


def main() -> None:
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    cases = [c for c in os.environ.get("PIPELINE_CASES", ",".join(SCHEDULES)).split(",") if c]
    expected = reference()
    # A case that raises ends this rank (no per-case error report): its peer would wait in
    # a receive for as long as the group's timeout, while torchrun stops every rank at once.
    results = {case: distributed(case, rank, world, device) for case in cases}
    report({"world": world, "device": str(device), "reference": expected, "cases": results})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
