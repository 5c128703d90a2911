"""FSDP2 (``fully_shard``) on two neuron ranks against a single-process CPU reference.

Every case trains a few AdamW steps with different data on each rank; the reference
trains a CPU copy of the same model on the concatenated batch. Reported per case: the
losses of both, the largest difference of each gathered (``full_tensor()``) parameter,
and what the case adds (gradients for the divide factors, the resharded storage size,
the checkpoint's round trip). Argument: a directory for the distributed checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from neuron_lab.distributed.process_group import NeuronProcessGroup

from fsdp_tp_common import (batches, blocks_model, chunk, max_diff, param_diffs, run_cases, setup, tiny_llama,
                            token_batches)

DEVICE = setup()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
STEPS = 3
LR = 1e-2


def mse(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x).float(), y)


def causal_lm(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss


def shard_blocks(model: nn.Module, **kwargs: Any) -> None:
    """``fully_shard`` on each block, then on the root (the usual transformer wrapping)."""
    layers = model.model.layers if hasattr(model, "model") else list(model)[:-1]
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def local(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(chunk(t, WORLD, RANK).to(DEVICE) for t in batch)


def global_loss(loss: torch.Tensor) -> float:
    """The mean of the ranks' losses: the loss of the concatenated batch."""
    value = loss.detach().float().clone()
    dist.all_reduce(value, op=dist.ReduceOp.AVG)
    return value.item()


def train(reference: nn.Module, shard: Callable[[nn.Module], None], data: list[tuple[torch.Tensor, ...]],
          loss_fn: Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor], *,
          reference_scale: float = 1.0, divide: Callable[[nn.Module], None] | None = None) -> dict[str, Any]:
    """Trains an FSDP copy of ``reference`` on this rank's chunks and ``reference`` on the
    whole batches (its loss times ``reference_scale``, which is what a custom gradient
    divide factor does to the gradients); returns losses, first-step gradient and final
    parameter differences."""
    model = copy.deepcopy(reference).to(DEVICE)
    shard(model)
    if divide is not None:
        divide(model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    losses, ref_losses, grad_diffs = [], [], {}
    for step, batch in enumerate(data):
        loss = loss_fn(model, local(batch))
        loss.backward()
        ref_loss = loss_fn(reference, batch)
        (ref_loss * reference_scale).backward()
        if step == 0:
            grad_diffs = param_diffs(model, reference, grads=True)
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(global_loss(loss))
        ref_losses.append(ref_loss.item())
    return {"losses": losses, "ref_losses": ref_losses, "grad_diffs": grad_diffs,
            "param_diffs": param_diffs(model, reference), "model": model, "opt": opt}


def public(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("model", "opt")}


def resharded_storage_bytes(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """After a forward: whether the blocks' registered parameters are the sharded DTensors
    again, and the bytes the unsharded parameters' storages still hold (0 once FSDP has
    freed them with ``untyped_storage().resize_(0)``)."""
    model(local(batch)[0])
    block = next(iter(model))
    group = block._get_fsdp_state()._fsdp_param_group
    held = sum(t.untyped_storage().nbytes() for fp in group.fsdp_params for t in fp.all_gather_outputs)
    return {"registered_sharded": isinstance(block.up.weight, DTensor), "unsharded_bytes": held}


def case_reshard(after_forward: bool) -> Callable[[], dict[str, Any]]:
    def run() -> dict[str, Any]:
        data = batches(STEPS, 4 * WORLD)
        result = train(blocks_model(), lambda m: shard_blocks(m, reshard_after_forward=after_forward), data, mse)
        # One more forward of the trained model, then the state FSDP left the blocks in.
        with torch.no_grad():
            result["after_forward"] = resharded_storage_bytes(result["model"], data[0])
        return public(result)

    return run


def case_bf16() -> dict[str, Any]:
    """bf16 parameters for compute, float32 gradient reduction. The reference emulates it on
    the CPU: each rank's half batch through a bf16 copy, its gradients cast to float32 and
    averaged, a float32 AdamW step on the float32 master parameters."""
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    reference = blocks_model()
    model = copy.deepcopy(reference).to(DEVICE)
    shard_blocks(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=LR)
    losses, ref_losses, grad_diffs, fp32_grad_diffs = [], [], {}, {}
    for step, batch in enumerate(batches(STEPS, 4 * WORLD)):
        loss = mse(model, local(batch))
        loss.backward()
        grads = [torch.zeros_like(p) for p in reference.parameters()]
        rank_losses = []
        for r in range(WORLD):
            low = copy.deepcopy(reference).to(torch.bfloat16)
            x, y = (chunk(t, WORLD, r) for t in batch)
            rank_loss = F.mse_loss(low(x.to(torch.bfloat16)).float(), y)
            rank_loss.backward()
            rank_losses.append(rank_loss.item())
            for g, p in zip(grads, low.parameters(), strict=True):
                g += p.grad.float() / WORLD
        if step == 0:
            exact = copy.deepcopy(reference)
            F.mse_loss(exact(batch[0]), batch[1]).backward()
            fp32_grad_diffs = param_diffs(model, exact, grads=True)
        for p, g in zip(reference.parameters(), grads, strict=True):
            p.grad = g
        if step == 0:
            grad_diffs = param_diffs(model, reference, grads=True)
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        losses.append(global_loss(loss))
        ref_losses.append(sum(rank_losses) / WORLD)
    return {"losses": losses, "ref_losses": ref_losses, "grad_diffs": grad_diffs,
            "fp32_grad_diffs": fp32_grad_diffs, "param_diffs": param_diffs(model, reference),
            "sharded_param_dtypes": sorted({str(p.dtype) for p in model.parameters()})}


def case_divide_factor(factor: float | None, force_sum: bool) -> Callable[[], dict[str, Any]]:
    """``set_gradient_divide_factor(factor)`` sums the ranks' gradients divided by ``factor``
    (PREMUL_SUM(1/factor), or SUM then a division when sum reductions are forced): the
    reference's loss is scaled by world / factor to give the same gradients."""

    def divide(model: nn.Module) -> None:
        for module in model.modules():
            if isinstance(module, FSDPModule):
                if factor is not None:
                    module.set_gradient_divide_factor(factor)
                module.set_force_sum_reduction_for_comms(force_sum)

    def run() -> dict[str, Any]:
        scale = WORLD / factor if factor is not None else 1.0
        with reduce_ops_seen() as seen:
            result = public(train(blocks_model(), shard_blocks, batches(STEPS, 4 * WORLD), mse,
                                  reference_scale=scale, divide=divide))
        return {**result, "reduce_ops": sorted(seen)}

    return run


@contextlib.contextmanager
def reduce_ops_seen() -> Iterator[set[str]]:
    """The ``collective:reduce op`` pairs the neuron process group was asked for meanwhile
    (an observation: the group's own op translation runs unchanged)."""
    seen: set[str] = set()
    original = NeuronProcessGroup._reduce_op

    def observed(self: NeuronProcessGroup, collective: str, op: Any) -> Any:
        kind = op.op if hasattr(op, "op") else op
        seen.add(f"{collective}:{str(kind).split('.')[-1]}")
        return original(self, collective, op)

    NeuronProcessGroup._reduce_op = observed
    try:
        yield seen
    finally:
        NeuronProcessGroup._reduce_op = original


def case_llama() -> dict[str, Any]:
    data = [(ids,) for ids in token_batches(STEPS, 2 * WORLD)]
    return public(train(tiny_llama(), shard_blocks, data, causal_lm))


def case_checkpoint() -> dict[str, Any]:
    """Trains, saves model and optimizer with ``torch.distributed.checkpoint``, loads them
    into a freshly initialised FSDP model, and compares the states, then one more step."""
    data = batches(STEPS + 1, 4 * WORLD)
    trained = train(blocks_model(), shard_blocks, data[:STEPS], mse)
    model, opt = trained["model"], trained["opt"]
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=CHECKPOINT)

    fresh = blocks_model(seed=123).to(DEVICE)
    shard_blocks(fresh)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=LR)
    fresh_model_sd, fresh_optim_sd = get_state_dict(fresh, fresh_opt)
    before = max(param_diffs(fresh, model).values())
    state = {"model": fresh_model_sd, "optim": fresh_optim_sd}
    dcp.load(state, checkpoint_id=CHECKPOINT)
    set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    model_diff = max(param_diffs(fresh, model).values())
    optim_diffs = {}
    for key, value in flatten(get_state_dict(model, opt)[1]).items():
        other = flatten(get_state_dict(fresh, fresh_opt)[1])[key]
        optim_diffs[key] = max_diff(value, other) if isinstance(value, torch.Tensor) else float(value != other)
    # Both take the next step on the same data.
    next_losses = []
    for m, o in ((model, opt), (fresh, fresh_opt)):
        loss = mse(m, local(data[STEPS]))
        loss.backward()
        o.step()
        o.zero_grad()
        next_losses.append(global_loss(loss))
    return {"diff_before_load": before, "model_diff": model_diff, "optim_diffs": optim_diffs,
            "optim_entries": len(optim_diffs), "next_losses": next_losses,
            "after_step_diff": max(param_diffs(fresh, model).values())}


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(tree, (list, tuple)):
        return flatten(dict(enumerate(tree)), prefix)
    return {prefix.rstrip("."): tree}


CHECKPOINT = sys.argv[1]
CASES = {
    "reshard_after_forward": case_reshard(True),
    "keep_unsharded_after_forward": case_reshard(False),
    "bf16_mixed_precision": case_bf16,
    "divide_factor_premul_sum": case_divide_factor(4.0, force_sum=False),
    "divide_factor_forced_sum": case_divide_factor(4.0, force_sum=True),
    "forced_sum_default_factor": case_divide_factor(None, force_sum=True),
    "tiny_llama": case_llama,
    "distributed_checkpoint": case_checkpoint,
}

if __name__ == "__main__":
    run_cases(CASES)
