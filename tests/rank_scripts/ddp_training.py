"""DDP and ZeroRedundancyOptimizer on neuron: every case trains a tiny model on 2 ranks
with different data per rank, and a single-process CPU reference of the same model on
the concatenated batch. Each rank reports, per case, its losses and final parameters and
gradients next to the reference's; ``tests/distributed/test_distributed_ddp_pipeline.py`` compares.

One launch covers every case (each launch costs seconds of process start). A case that
raises is reported with its error, so that the others still run and report. No
``from __future__ import annotations`` here: DDP checks a comm hook's annotations as objects.
"""

import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from ranks import report
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from neuron_lab.distributed.held_tensors import wait_until_released

LOCAL_BATCH = 4
FEATURES, HIDDEN, OUTPUTS = 8, 16, 4
STEPS = 3
# DDP's runtime statistics of its sampled iterations (its logging data), in nanoseconds.
TIMES = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
         "avg_backward_compute_comm_overlap_time")


class MLP(nn.Module):
    """Linear-tanh-linear-tanh-linear: five parameter tensors of different sizes, so that a
    small bucket cap splits them into several buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                                    nn.Linear(HIDDEN, OUTPUTS))
        # Different on each rank at first, as the parameters: DDP broadcasts rank 0's buffers too.
        self.register_buffer("offset", 0.1 * torch.randn(OUTPUTS))

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        return self.layers(x) + self.offset


class WithUnused(nn.Module):
    """An MLP with a branch that only some ranks use on a step (``use_extra``) and a layer
    that no forward ever uses: DDP needs ``find_unused_parameters=True`` for both."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh())
        self.extra = nn.Linear(HIDDEN, HIDDEN)
        self.never = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, OUTPUTS)

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        h = self.body(x)
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.head(h)


@dataclass
class Case:
    """One training run: the model, its optimizer, DDP's options and how a step goes."""

    model: Callable[[], nn.Module] = MLP
    optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer] = \
        lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9)
    ddp: dict[str, Any] = field(default_factory=dict)
    hook: str | None = None              # "fp16" or "custom"
    accumulate: int = 1                  # microbatches per step; all but the last under no_sync()
    branch_on_one_rank: bool = False     # rank (step % world) alone uses the model's extra branch
    zero: dict[str, Any] | None = None   # the optimizer is ZeroRedundancyOptimizer(AdamW) with these options
    input_device: str = "local"          # "local", "cpu" or "other core" (DDP copies on a side stream)


def adamw(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1)


CASES: dict[str, Case] = {
    "sgd_several_buckets": Case(ddp={"bucket_cap_mb": 0.0001}),
    "adamw_default_buckets": Case(optimizer=adamw),
    "adamw_grads_as_bucket_views": Case(optimizer=adamw, ddp={"gradient_as_bucket_view": True, "bucket_cap_mb": 0.0001}),
    "no_sync_accumulation": Case(accumulate=3, ddp={"bucket_cap_mb": 0.0001}),
    "find_unused_parameters": Case(model=WithUnused, branch_on_one_rank=True,
                                   ddp={"find_unused_parameters": True, "bucket_cap_mb": 0.0001}),
    "fp16_compress_hook": Case(hook="fp16", ddp={"bucket_cap_mb": 0.0001}),
    "custom_all_reduce_hook": Case(hook="custom", ddp={"bucket_cap_mb": 0.0001}),
    "device_ids_cpu_inputs": Case(input_device="cpu", ddp={"device_ids": ["local"]}),
    "device_ids_inputs_on_other_core": Case(input_device="other core", ddp={"device_ids": ["local"]}),
    "static_graph": Case(optimizer=adamw, ddp={"static_graph": True, "bucket_cap_mb": 0.0001}),
    "zero_adamw": Case(zero={}),
    "zero_adamw_bucket_view": Case(zero={"parameters_as_bucket_view": True}, ddp={"bucket_cap_mb": 0.0001}),
}


def batch(step: int, micro: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one (micro)step, the same on every rank; rank r trains on rows
    ``r * LOCAL_BATCH ..``."""
    g = torch.Generator().manual_seed(1000 + 17 * step + micro)
    return torch.randn(world * LOCAL_BATCH, FEATURES, generator=g), torch.randn(world * LOCAL_BATCH, OUTPUTS, generator=g)


def uses_extra(case: Case, step: int, rank: int, world: int) -> bool:
    return case.branch_on_one_rank and rank == step % world


def reference(case: Case, world: int) -> dict[str, Any]:
    """The case on one process, on CPU: each step trains on the concatenated batch (the
    mean of the ranks' losses, one chunk per rank, where ranks run different branches)."""
    torch.manual_seed(0)  # rank 0's initial model, which DDP broadcasts
    model = case.model()
    optimizer = adamw(list(model.parameters())) if case.zero is not None else case.optimizer(list(model.parameters()))
    losses = []
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        step_loss = 0.0
        for micro in range(case.accumulate):
            x, y = batch(step, micro, world)
            if case.branch_on_one_rank:
                chunks = [nn.functional.mse_loss(model(xc, uses_extra(case, step, r, world)), yc)
                          for r, (xc, yc) in enumerate(zip(x.chunk(world), y.chunk(world), strict=True))]
                loss = torch.stack(chunks).mean()
            else:
                loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            step_loss += loss.item()
        optimizer.step()
        losses.append(step_loss)
    result = {"losses": losses, **final_state(model)}
    if case.zero is not None:
        result["zero_state"] = adam_state(optimizer.state_dict()["state"])
    return result


class HookState:
    """The state of our own communication hook: its group, and how often it ran."""

    def __init__(self, group: dist.ProcessGroup) -> None:
        self.group = group
        self.calls = 0  # this step's


def all_reduce_mean_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A communication hook of our own: divides the bucket by the world size and returns
    (the first tensor of) the future of an asynchronous all_reduce of it."""
    state.calls += 1
    buffer = bucket.buffer().div_(state.group.size())
    work = dist.all_reduce(buffer, group=state.group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def distributed(case: Case, rank: int, world: int, device: torch.device) -> dict[str, Any]:
    """The case under DDP on this rank. Each rank starts from a different initialization:
    DDP's construction broadcasts rank 0's."""
    torch.manual_seed(rank)
    model = case.model().to(device)
    options = dict(case.ddp)
    if options.get("device_ids") == ["local"]:
        options["device_ids"] = [device]
    ddp = DDP(model, **options)
    custom = HookState(dist.group.WORLD) if case.hook == "custom" else None
    if case.hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif custom is not None:
        ddp.register_comm_hook(custom, all_reduce_mean_hook)
    if case.zero is not None:
        optimizer: torch.optim.Optimizer = ZeroRedundancyOptimizer(
            list(ddp.parameters()), optimizer_class=torch.optim.AdamW, lr=0.01, weight_decay=0.1, **case.zero)
    else:
        optimizer = case.optimizer(list(ddp.parameters()))
    input_device = {"local": device, "cpu": torch.device("cpu"),
                    "other core": torch.device("neuron", (device.index + 1) % torch.neuron.device_count())}[case.input_device]
    losses, hook_calls = [], []
    rows = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        if custom is not None:
            custom.calls = 0
        step_loss = 0.0
        for micro in range(case.accumulate):
            x, y = batch(step, micro, world)
            x, y = x[rows].to(input_device), y[rows].to(device)
            last = micro == case.accumulate - 1
            with ddp.no_sync() if not last else contextlib.nullcontext():
                loss = nn.functional.mse_loss(ddp(x, uses_extra(case, step, rank, world)), y)
                loss.backward()
            step_loss += loss.item()
        optimizer.step()
        losses.append(step_loss)
        if custom is not None:
            hook_calls.append(custom.calls)
    result: dict[str, Any] = {"losses": losses, **final_state(model)}
    data = ddp._get_ddp_logging_data()
    result["buckets"] = len(data.get("rebuilt_bucket_sizes", data.get("bucket_sizes", "")).split(", "))
    if custom is not None:
        result["hook_calls"] = hook_calls
    if case.input_device == "other core":
        result["side_stream_launches"] = side_stream_launches(device)
    if case.zero is not None:
        optimizer.consolidate_state_dict(to=0)  # an object broadcast from each rank
        result["zero_state"] = adam_state(optimizer.state_dict()["state"]) if rank == 0 else None
    result["timing_ns"] = {key: data.get(key, 0) for key in TIMES}
    return result


def side_stream_launches(device: torch.device) -> int:
    """Launches enqueued on the stream DDP keeps for copying inputs to ``device`` (0 when
    it made none)."""
    from torch.nn.parallel import _functions

    from neuron_lab.device.streams import stream_launches

    streams = _functions._streams
    stream = streams[device.index] if streams is not None else None
    return 0 if stream is None else stream_launches(device.index, stream.stream_id)[0]


def final_state(model: nn.Module) -> dict[str, Any]:
    """Parameters, gradients (None where a parameter never got one) and buffers, on CPU."""
    return {
        "params": {n: p.detach().cpu().flatten().tolist() for n, p in model.named_parameters()},
        "grads": {n: None if p.grad is None else p.grad.cpu().flatten().tolist() for n, p in model.named_parameters()},
        "buffers": {n: b.cpu().flatten().tolist() for n, b in model.named_buffers()},
    }


def adam_state(state: dict[int, dict[str, torch.Tensor]]) -> dict[str, list[float]]:
    """AdamW's ``exp_avg`` and ``exp_avg_sq`` of every parameter (by index), on CPU."""
    return {f"{i}.{key}": state[i][key].cpu().flatten().tolist() for i in sorted(state)
            for key in ("exp_avg", "exp_avg_sq")}


def main() -> None:
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    only = set(os.environ.get("DDP_CASES", "").split(",")) - {""}
    results: dict[str, Any] = {}
    for name, case in CASES.items():
        if only and name not in only:
            continue
        try:
            results[name] = {"ddp": distributed(case, rank, world, device), "reference": reference(case, world)}
        except Exception as e:  # noqa: BLE001 - reported per case; the test shows it
            results[name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
            print(f"rank {rank}, case {name}:\n{results[name]['error']}", file=sys.stderr, flush=True)
        dist.barrier()
    # The last collective is a large all_reduce of a temporary, right before the process
    # exits: gloo's worker thread must not be the one to free its tensors (held_tensors.py).
    dist.all_reduce(torch.ones(4096, device=device))
    released = wait_until_released()
    report({"world": world, "device": str(device), "cases": results, "released_at_exit": released})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
