"""The named workloads of issue 47's speed targets, built on any device: each builder returns
``step()``, one unit of work (a training step, or one 24-token generation).

Shared by ``bench_training.py`` (the device against CPU eager) and ``bench_fastpath.py`` (fast
host kernels on against off). Every device gets the same weights and inputs: they are made on
the CPU from fixed seeds, then moved with ``.to(device)``.

ResNet-18 is transformers' ``ResNetForImageClassification`` with basic blocks 2-2-2-2 and
BatchNorm (torchvision's network; torchvision's wheel here is a CUDA build and does not import).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

__all__ = ["WORKLOADS", "UNNAMED", "build", "compiles"]

Step = Callable[[], None]


def _causal_lm(kind: str, device: str, compile_model: bool, wide: bool) -> Step:
    """A transformers causal LM's AdamW step in train mode: tiny (tests' hf_models, batch 2 x 32)
    or ``wide`` (6 layers, 512 wide, batch 2 x 128)."""
    from hf_models import MODELS

    overrides = {}
    if wide:
        if kind == "gpt2":
            overrides = dict(n_embd=512, n_layer=6, n_head=8, vocab_size=1000, n_positions=256)
        else:
            overrides = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8,
                             num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256)
    torch.manual_seed(0)
    model = MODELS[kind].build(**overrides).train().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    g = torch.Generator().manual_seed(0)
    batch, tokens, vocab = (2, 128, 1000) if wide else (2, 32, 99)
    ids = torch.randint(2, vocab, (batch, tokens), generator=g).to(device)
    forward = torch.compile(model) if compile_model else model

    def step() -> None:
        opt.zero_grad()
        forward(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    return step


def _generate(device: str, compile_model: bool) -> Step:
    """Greedy generation of 24 new tokens by the tiny Llama, from a 4-token prompt."""
    from hf_models import MODELS

    torch.manual_seed(0)
    model = MODELS["llama"].build().eval().to(device)
    ids = torch.tensor([[5, 7, 9, 11]]).to(device)

    def step() -> None:
        with torch.no_grad():
            model.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=1)

    return step


def _resnet18(device: str, compile_model: bool) -> Step:
    """ResNet-18 (BatchNorm, train mode), batch 8 x 3x64x64, SGD with momentum."""
    import transformers as hf

    torch.manual_seed(0)
    config = hf.ResNetConfig(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512],
                             embedding_size=64, num_labels=10)
    model = hf.ResNetForImageClassification(config).train().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 3, 64, 64, generator=g).to(device)
    y = torch.randint(0, 10, (8,), generator=g).to(device)
    forward = torch.compile(model) if compile_model else model

    def step() -> None:
        opt.zero_grad()
        forward(pixel_values=x, labels=y).loss.backward()
        opt.step()

    return step


def _unet(device: str, compile_model: bool) -> Step:
    """diffusers' UNet2DConditionModel (tiny: 2 levels, 32/64 channels, cross-attention), AdamW."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8).train().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 16, 16, generator=g).to(device)
    t = torch.tensor([10, 500]).to(device)
    ctx = torch.randn(2, 8, 32, generator=g).to(device)
    forward = torch.compile(model) if compile_model else model

    def step() -> None:
        opt.zero_grad()
        forward(x, t, encoder_hidden_states=ctx).sample.square().mean().backward()
        opt.step()

    return step


def _hf_tiny(name: str, device: str, compile_model: bool) -> Step:
    """A tiny model of the tests' ``hf_models`` (batch 2 x 12 tokens, or its kind's batch), AdamW as
    torch picks it: ``foreach`` on the neuron device, the for-loop on the CPU. The models the
    targets do not name: the issue asks that they be checked too."""
    from hf_models import MODELS, make_batch

    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.build().train().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: v.to(device) for k, v in make_batch(spec.kind, torch.Generator().manual_seed(0)).items()}
    forward = torch.compile(model) if compile_model else model

    def step() -> None:
        opt.zero_grad()
        forward(**batch).loss.backward()
        opt.step()

    return step


_BUILDERS: dict[str, Callable[[str, bool], Step]] = {
    "gpt2_tiny": lambda d, c: _causal_lm("gpt2", d, c, wide=False),
    "llama_tiny": lambda d, c: _causal_lm("llama", d, c, wide=False),
    "gpt2_6x512": lambda d, c: _causal_lm("gpt2", d, c, wide=True),
    "llama_6x512": lambda d, c: _causal_lm("llama", d, c, wide=True),
    "resnet18": _resnet18,
    "unet": _unet,
    "llama_generate": _generate,
}
WORKLOADS = list(_BUILDERS)
"""Workload names, in table order."""

_UNNAMED_MODELS = ("bert", "vit", "t5", "whisper", "mixtral", "qwen2_moe")
UNNAMED = [f"tiny_{name}" for name in _UNNAMED_MODELS]
"""Workloads the targets do not name (``--workloads tiny_mixtral ...``; not in the default run)."""
for _name in _UNNAMED_MODELS:
    _BUILDERS[f"tiny_{_name}"] = lambda d, c, name=_name: _hf_tiny(name, d, c)

_NOT_COMPILED = {"llama_generate"}  # generate() recompiles per length: not a cheap comparison


def compiles(workload: str) -> bool:
    """Whether CPU torch.compile is a cheap, meaningful comparison for ``workload``."""
    return workload not in _NOT_COMPILED


def build(workload: str, device: str, compile_model: bool = False) -> Step:
    """``step()`` of ``workload`` on ``device`` (``compile_model``: the model under torch.compile,
    the optimizer eager)."""
    if workload not in _BUILDERS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS + UNNAMED)}")
    return _BUILDERS[workload](device, compile_model)
