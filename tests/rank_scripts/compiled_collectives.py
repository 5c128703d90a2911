"""Functional collectives (what DTensor, FSDP2 and compiled code use) inside torch.compile,
with the neuron backend and with TorchInductor's default, against eager."""

import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ranks import report

dist.init_process_group("neuron")
rank = dist.get_rank()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
torch.neuron.set_device(device)
group = dist.group.WORLD


def step(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2
    total = funcol.all_reduce(y, "sum", group)
    gathered = funcol.all_gather_tensor(total * 0.5, 0, group)
    scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, group)
    return scattered + 1


x = torch.linspace(-1, 1, 8, device=device) + rank
results = {"eager": step(x).cpu().tolist()}
for backend in ("neuron", "inductor"):
    torch._dynamo.reset()
    results[backend] = torch.compile(step, backend=backend)(x).cpu().tolist()
report(results)
dist.destroy_process_group()
