"""Every reduce op through both paths of all_reduce (a small tensor finishes in the ranks'
meeting, a large one goes through gloo) and broadcast / all_gather, against gloo on the
same values as CPU tensors."""

import os

import torch
import torch.distributed as dist

from neuron_lab.distributed.agreement import INLINE_BYTES
from ranks import report

dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
gloo = dist.new_group(backend="gloo")
ops = {"SUM": dist.ReduceOp.SUM, "AVG": dist.ReduceOp.AVG, "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX,
       "PRODUCT": dist.ReduceOp.PRODUCT, "PREMUL_SUM": dist._make_nccl_premul_sum(0.25)}
sizes = {"small": 6, "large": INLINE_BYTES // 4 + 1000}
results = {}
for dtype in (torch.float32, torch.bfloat16, torch.int64):
    for size_name, numel in sizes.items():
        generator = torch.Generator().manual_seed(1000 * rank + numel)
        base = (torch.rand(numel, generator=generator) * 4 + 0.5)
        values = base.to(dtype) if dtype.is_floating_point else (base * 10).to(dtype)
        for name, op in ops.items():
            if dtype == torch.int64 and name in ("AVG", "PREMUL_SUM"):
                continue
            case = f"all_reduce {name} {dtype} {size_name}"
            on_device = values.to(device)
            dist.all_reduce(on_device, op=op)
            reference = values.clone()
            if name == "PREMUL_SUM":  # gloo has no PREMUL_SUM: scale, then sum
                reference.mul_(0.25)
                dist.all_reduce(reference, op=dist.ReduceOp.SUM, group=gloo)
            else:
                dist.all_reduce(reference, op=op, group=gloo)
            got = on_device.cpu()
            results[case] = [bool(torch.equal(got, reference)),
                             float((got.double() - reference.double()).abs().max())]
        case = f"broadcast {dtype} {size_name}"
        on_device = values.to(device)
        reference = values.clone()
        dist.broadcast(on_device, src=world - 1)
        dist.broadcast(reference, src=world - 1, group=gloo)
        results[case] = [bool(torch.equal(on_device.cpu(), reference)), 0.0]
        case = f"all_gather_into_tensor {dtype} {size_name}"
        gathered = torch.empty(world * numel, dtype=dtype, device=device)
        dist.all_gather_into_tensor(gathered, values.to(device))
        reference = torch.empty(world * numel, dtype=dtype)
        dist.all_gather_into_tensor(reference, values, group=gloo)
        results[case] = [bool(torch.equal(gathered.cpu(), reference)), 0.0]
report({"results": results})
dist.destroy_process_group()
