"""Shared by the ``fsdp_*``, ``dtensor_*`` and ``tp_*`` rank scripts: rank setup, a runner
that reports many cases from one torchrun launch, tiny models and comparisons with a
single-process reference.

Each case is a function returning a JSON-able dict; an exception becomes that case's
``{"error": traceback}``, so one broken case shows up as one failed test, not a lost launch.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ranks import report

__all__ = ["Block", "batches", "blocks_model", "chunk", "floats", "full", "max_diff", "param_diffs", "run_cases",
           "setup", "tiny_llama", "tiny_llama_config", "token_batches"]

# A hung peer should fail the launch in minutes, not gloo's default half hour.
_TIMEOUT = timedelta(seconds=180)


def setup() -> torch.device:
    """Initialises the ``neuron`` process group; returns this rank's core, made current."""
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]) % torch.neuron.device_count())
    torch.neuron.set_device(device)
    dist.init_process_group("neuron", timeout=_TIMEOUT)
    return device


def run_cases(cases: dict[str, Callable[[], dict[str, Any]]]) -> None:
    """Runs every case in order, then reports ``{case: result}`` and tears the group down."""
    results: dict[str, Any] = {}
    for name, case in cases.items():
        try:
            results[name] = case()
        except Exception:  # noqa: BLE001 - reported per case, the test shows the traceback
            results[name] = {"error": traceback.format_exc()}
        dist.barrier()
    report(results)
    dist.destroy_process_group()


# ---- comparisons ----------------------------------------------------------------------------
def full(t: torch.Tensor) -> torch.Tensor:
    """A (D)Tensor's whole value on the CPU, in float32."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu().float()


def max_diff(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference (shapes must agree)."""
    actual, expected = full(actual), full(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"shapes differ: {tuple(actual.shape)} vs {tuple(expected.shape)}")
    return float((actual - expected).abs().max()) if actual.numel() else 0.0


def param_diffs(model: nn.Module, reference: nn.Module, grads: bool = False) -> dict[str, float]:
    """Per parameter name: the largest difference of the (gathered) parameter, or of its
    gradient, from the reference module's."""
    ref = dict(reference.named_parameters())
    out = {}
    for name, p in model.named_parameters():
        a, b = (p.grad, ref[name].grad) if grads else (p, ref[name])
        out[name] = max_diff(a, b)
    return out


# ---- models and data ----------------------------------------------------------------------------
class Block(nn.Module):
    """A tiny pre-norm MLP block with a residual: what a transformer layer's MLP half does."""

    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def blocks_model(seed: int = 0, layers: int = 2, dim: int = 16, out: int = 4) -> nn.Sequential:
    """``layers`` blocks and a head, freshly initialised from ``seed`` (on the CPU)."""
    torch.manual_seed(seed)
    return nn.Sequential(*[Block(dim) for _ in range(layers)], nn.Linear(dim, out))


def batches(steps: int, batch: int, dim: int = 16, out: int = 4, seed: int = 1) -> list[tuple[torch.Tensor, ...]]:
    """``steps`` global (input, target) batches on the CPU; rank r trains on chunk r."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, dim, generator=g), torch.randn(batch, out, generator=g)) for _ in range(steps)]


def tiny_llama_config() -> Any:
    """A random Llama config small enough for a test: hidden 32, 2 layers, vocabulary 128."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       attention_dropout=0.0, tie_word_embeddings=False)


def tiny_llama(seed: int = 0) -> nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` (no download), on the CPU, float32."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config()).float()


def token_batches(steps: int, batch: int, tokens: int = 8, seed: int = 2) -> list[torch.Tensor]:
    """``steps`` global batches of token ids for the tiny Llama."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (batch, tokens), generator=g) for _ in range(steps)]


def chunk(t: torch.Tensor, parts: int, index: int, dim: int = 0) -> torch.Tensor:
    """Chunk ``index`` of ``parts`` along ``dim``."""
    return t.chunk(parts, dim=dim)[index]


def floats(values: Iterable[float]) -> list[float]:
    """Floats as plain JSON numbers."""
    return [float(v) for v in values]
