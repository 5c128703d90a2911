"""Compiled FlexAttention under activation checkpointing, sharded with FSDP2 on 2 ranks,
as TorchTitan's Llama runs it: ``torch.compile(flex_attention)`` with a causal block mask,
each block wrapped in ``checkpoint_wrapper`` (non-reentrant: its forward runs again in the
backward), ``fully_shard`` per block and at the root, SGD. Every step's loss and the
final parameters are compared with the same model trained on the CPU, sharded the same
way over gloo. The CPU reference attends with ``scaled_dot_product_attention(is_causal=True)``
(FlexAttention has no CPU backward in torch 2.13): the same function, summed in another
order, hence a float32 tolerance. Both ranks train on the same batches.

The compiled graphs run as inline launches whose results are adopted as neuron tensors
(``host_kernels.adopt``); a CPU tensor over adopted memory that outlived its launch was
left over no memory, and reading it (or adopting it again) crashed the process.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from fsdp_tp_common import full, max_diff, run_cases, setup

DEVICE = setup()
STEPS, BATCH, SEQ, DIM, HEADS = 3, 2, 256, 32, 2
_compiled_flex = torch.compile(flex_attention)


def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
    return q >= kv


class Block(nn.Module):
    """Pre-norm attention and MLP; ``flex`` says which attention (neuron: compiled
    FlexAttention with a block mask; CPU: causal SDPA)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.qkv, self.out = nn.RMSNorm(DIM), nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.mlp = nn.Sequential(nn.RMSNorm(DIM), nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))

    def forward(self, x: torch.Tensor, mask: Any) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).view(BATCH, SEQ, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = _compiled_flex(q, k, v, block_mask=mask)
        x = x + self.out(y.transpose(1, 2).reshape(BATCH, SEQ, DIM))
        return x + self.mlp(x)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(DIM, 1)

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, mask)
        return self.head(x).squeeze(-1)


def shard(model: Model, mesh: DeviceMesh) -> Model:
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block)
        fully_shard(model.blocks[i], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train(model: Model, device: torch.device, mask: Any) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # AdamW would blow up the noise of
    # the key bias's gradient (exactly 0 in exact arithmetic: softmax ignores it) to lr-sized steps
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(BATCH, SEQ, DIM, generator=g), torch.randn(BATCH, SEQ, generator=g)
        loss = F.mse_loss(model(x.to(device), mask), y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def case_compiled_flex_under_checkpointing() -> dict[str, Any]:
    torch.manual_seed(0)
    base = Model()
    on_cpu = shard(copy.deepcopy(base), DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu"))
    ref_losses = train(on_cpu, torch.device("cpu"), None)
    on_neuron = shard(copy.deepcopy(base).to(DEVICE), DeviceMesh("neuron", list(range(dist.get_world_size()))))
    mask = create_block_mask(causal, None, None, SEQ, SEQ, device=DEVICE)
    losses = train(on_neuron, DEVICE, mask)
    reference = dict(on_cpu.named_parameters())
    return {"losses": losses, "ref_losses": ref_losses,
            "param_diffs": {n: max_diff(full(p), full(reference[n])) for n, p in on_neuron.named_parameters()},
            "sharded": all(type(p).__name__ == "DTensor" for p in on_neuron.parameters())}


if __name__ == "__main__":
    run_cases({"compiled_flex_under_checkpointing": case_compiled_flex_under_checkpointing})
