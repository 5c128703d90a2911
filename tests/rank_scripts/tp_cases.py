"""Tensor parallelism (``parallelize_module``) on two neuron ranks against the same module
on the CPU in one process: outputs, losses and every parameter's gradient (gathered with
``full_tensor()``) at each of a few SGD steps, and the parameters after them.

Cases: an MLP block with ColwiseParallel/RowwiseParallel; the same block with its norm
(LayerNorm, RMSNorm) under SequenceParallel and the sequence dimension sharded between
the projections; a tiny random Llama with attention and MLP projections colwise/rowwise.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from fsdp_tp_common import Block, chunk, max_diff, param_diffs, run_cases, setup, tiny_llama, token_batches

DEVICE = setup()
RANK, WORLD = dist.get_rank(), dist.get_world_size()
MESH = init_device_mesh("neuron", (WORLD,), mesh_dim_names=("tp",))
STEPS = 3
LR = 0.1


def compare(reference: nn.Module, plan: dict[str, Any], inputs: list[torch.Tensor],
            run: Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
            local_output: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
            local_input: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> dict[str, Any]:
    """Parallelizes a device copy of ``reference`` with ``plan`` and runs both on each of
    ``inputs`` (``run`` gives output and loss); each step's outputs, losses and gradients
    are compared (the largest difference over the steps), then the final parameters.
    ``local_input``/``local_output`` pick this rank's part of a sequence-sharded tensor."""
    model = copy.deepcopy(reference).to(DEVICE)
    parallelize_module(model, MESH, plan)
    # SGD: its update is linear in the gradient, so the parameters compare as closely as
    # the gradients (AdamW's first steps divide by |g|, magnifying rounding-level
    # differences of near-zero gradients). One tensor at a time: torch's multi-tensor
    # optimizers cannot mix the DTensor parameters with the plain ones no plan
    # parallelizes (on any device).
    opt = torch.optim.SGD(model.parameters(), lr=LR, foreach=False)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, foreach=False)
    result: dict[str, Any] = {"losses": [], "ref_losses": []}
    for step, x in enumerate(inputs):
        out, loss = run(model, local_input(x).to(DEVICE))
        ref_out, ref_loss = run(reference, x)
        loss.backward()
        ref_loss.backward()
        result.setdefault("output_diffs", []).append(max_diff(out, local_output(ref_out)))
        grads = param_diffs(model, reference, grads=True)
        result["grad_diffs"] = {k: max(v, result.get("grad_diffs", {}).get(k, 0.0)) for k, v in grads.items()}
        if step == 0:
            result["sharded"] = sorted(n for n, p in model.named_parameters() if hasattr(p, "placements")
                                       and any(pl.is_shard() for pl in p.placements))
        opt.step()
        opt.zero_grad()
        ref_opt.step()
        ref_opt.zero_grad()
        result["losses"].append(loss.item())
        result["ref_losses"].append(ref_loss.item())
    result["param_diffs"] = param_diffs(model, reference)
    return result


def block_run(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = model(x)
    return out, (out**2).mean() if out.shape == x.shape else out.sum()


def sequence_inputs(seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 6, 16, generator=g) for _ in range(STEPS)]


def case_mlp() -> dict[str, Any]:
    torch.manual_seed(0)
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    return compare(Block(), plan, sequence_inputs(), block_run)


def case_sequence_parallel(norm: type[nn.Module]) -> Callable[[], dict[str, Any]]:
    """The norm runs on this rank's part of the sequence; ``up`` gathers the sequence,
    ``down`` reduce-scatters back to it. The loss is the mean over the whole sequence:
    the local output as a Shard(1) DTensor, its mean gathered with ``full_tensor()``."""

    def run() -> dict[str, Any]:
        torch.manual_seed(0)
        reference = Block()
        reference.norm = norm(16)
        plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1))}

        def sp_run(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = model(x)
            if x.device.type == "cpu":
                return out, (out**2).mean()
            return out, (DTensor.from_local(out, MESH, [Shard(1)]) ** 2).mean().full_tensor()

        result = compare(reference, plan, sequence_inputs(), sp_run,
                         local_output=lambda t: chunk(t, WORLD, RANK, dim=1),
                         local_input=lambda t: chunk(t, WORLD, RANK, dim=1))
        return {**result, "norm": norm.__name__}

    return run


def llama_plan(model: nn.Module) -> dict[str, Any]:
    plan: dict[str, Any] = {}
    for i in range(len(model.model.layers)):
        prefix = f"model.layers.{i}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"{prefix}.{name}"] = RowwiseParallel()
    return plan


def case_llama() -> dict[str, Any]:
    reference = tiny_llama()

    def lm_run(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(input_ids=ids, labels=ids)
        return out.logits, out.loss

    return compare(reference, llama_plan(reference), token_batches(STEPS, 2), lm_run)


if __name__ == "__main__":
    run_cases({
        "mlp_colwise_rowwise": case_mlp,
        "sequence_parallel_layernorm": case_sequence_parallel(nn.LayerNorm),
        "sequence_parallel_rmsnorm": case_sequence_parallel(nn.RMSNorm),
        "tiny_llama_attention_mlp": case_llama,
    })
