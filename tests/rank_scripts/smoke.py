"""Two ranks all-reduce a tensor computed lazily on the device (the harness's own check)."""

import os

import torch
import torch.distributed as dist

from ranks import report

dist.init_process_group("neuron")
rank = dist.get_rank()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
x = (torch.arange(4.0, device=device) + 1) * (rank + 1)  # pending in adaptive eager
dist.all_reduce(x)
report({"backend": dist.get_backend(), "sum": x.cpu().tolist(), "device": str(x.device)})
dist.destroy_process_group()
