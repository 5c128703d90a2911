"""FlexAttention on neuron: ``score_mod``, block masks made on neuron (causal, sliding
window, documents), GQA and the log-sum-exp, forward and backward, in eager code and
compiled (the neuron backend's two launch kinds, and torch.compile's default backend).

The reference is the attention written out densely on the CPU: PyTorch's own CPU
FlexAttention refuses to run backward, and its forward is compared too.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

from neuron_lab.compile import compiled_graphs

pytestmark = [pytest.mark.usefixtures("replay_tier"),
              pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")]

B, HQ, HKV, L, E = 2, 4, 2, 128, 16
SLIDING_WINDOW = 24


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def sliding_window(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx <= SLIDING_WINDOW)


def documents_on(device: str):
    """Three packed documents per batch row: attention stays inside each (and causal)."""
    boundaries = torch.tensor([[0] * 40 + [1] * 50 + [2] * 38, [0] * 70 + [1] * 30 + [2] * 28], device=device)

    def document(b, h, q_idx, kv_idx):
        return (boundaries[b, q_idx] == boundaries[b, kv_idx]) & (q_idx >= kv_idx)

    return document


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx).float() * 0.02 - h * 0.1


MASKS = {"causal": lambda device: causal, "sliding_window": lambda device: sliding_window,
         "documents": documents_on}


def dense_reference(q, k, v, score_mod, mask_mod, gqa: bool):
    """Attention written out on the CPU: scores, score_mod, mask, softmax, values, lse."""
    if gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    b = torch.arange(q.shape[0]).view(-1, 1, 1, 1)
    h = torch.arange(q.shape[1]).view(1, -1, 1, 1)
    q_idx = torch.arange(q.shape[2]).view(1, 1, -1, 1)
    kv_idx = torch.arange(k.shape[2]).view(1, 1, 1, -1)
    if score_mod is not None:
        scores = score_mod(scores, b, h, q_idx, kv_idx)
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(b, h, q_idx, kv_idx), float("-inf"))
    lse = scores.logsumexp(-1)
    return scores.softmax(-1) @ v, lse


def inputs(gqa: bool):
    torch.manual_seed(0)
    q = torch.randn(B, HQ, L, E)
    k = torch.randn(B, HKV if gqa else HQ, L, E)
    v = torch.randn(B, HKV if gqa else HQ, L, E)
    return q, k, v


def leaves(tensors, device: str):
    return [t.to(device).requires_grad_(True) for t in tensors]


def run(fn, q, k, v, mask_name, score_mod, gqa):
    device = q.device.type
    mask_mod = MASKS[mask_name](device)
    block_mask = create_block_mask(mask_mod, B, None, L, L, device=device)
    out, aux = fn(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa,
                  return_aux=AuxRequest(lse=True))
    return out, aux.lse


def check_against_reference(fn, mask_name: str, score_mod, gqa: bool) -> None:
    cpu = leaves(inputs(gqa), "cpu")
    expected_out, expected_lse = dense_reference(*cpu, score_mod, MASKS[mask_name]("cpu"), gqa)
    (expected_out.sum() + expected_lse.sum()).backward()

    dev = leaves(inputs(gqa), "neuron")
    out, lse = run(fn, *dev, mask_name, score_mod, gqa)
    assert out.device.type == "neuron" and lse.device.type == "neuron"
    (out.sum() + lse.sum()).backward()
    torch.testing.assert_close(out.detach().cpu(), expected_out.detach())
    torch.testing.assert_close(lse.detach().cpu(), expected_lse.detach())
    for name, a, b in zip("qkv", dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, msg=lambda m, name=name: f"grad of {name}: {m}")


CASES = [("causal", None, False), ("sliding_window", relative_bias, False), ("documents", None, False),
         ("causal", relative_bias, True), ("documents", relative_bias, True)]
CASE_IDS = [f"{m}-{'score_mod' if s else 'plain'}-{'gqa' if g else 'mha'}" for m, s, g in CASES]


@pytest.mark.parametrize(("mask_name", "score_mod", "gqa"), CASES, ids=CASE_IDS)
def test_eager_flex_attention_equals_the_reference(mask_name, score_mod, gqa) -> None:
    check_against_reference(flex_attention, mask_name, score_mod, gqa)


@pytest.mark.parametrize("launch", ["async", "inline"])
@pytest.mark.parametrize(("mask_name", "score_mod", "gqa"), [CASES[1], CASES[4]], ids=[CASE_IDS[1], CASE_IDS[4]])
def test_compiled_flex_attention_equals_the_reference(launch, mask_name, score_mod, gqa) -> None:
    torch._dynamo.reset()  # compile afresh: another test may have compiled flex_attention with other options
    before = len(compiled_graphs())
    compiled = torch.compile(flex_attention, backend="neuron", fullgraph=True, options={"neuron.launch": launch})
    check_against_reference(compiled, mask_name, score_mod, gqa)
    graphs = compiled_graphs()[before:]
    assert {g["kind"] for g in graphs} >= {"forward", "backward"}
    # Never Triton: inline graphs are TorchInductor's C++ code for the host.
    assert all(g["tier"] == launch for g in graphs), graphs


def test_default_torch_compile_runs_flex_attention_on_neuron() -> None:
    """torch.compile's default backend (TorchInductor) on neuron tensors: what Hugging Face
    does with FlexAttention (the block mask is compiled too, from a graph with no tensor
    inputs, only device="neuron" factory calls)."""
    torch._dynamo.reset()  # compile afresh: another test may have compiled flex_attention for the neuron backend
    before = len(compiled_graphs())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        block_mask = create_block_mask(causal, B, None, L, L, device="neuron", _compile=True)
    assert block_mask.kv_num_blocks.device.type == "neuron"
    q, k, v = (t.to("neuron") for t in inputs(gqa=False))
    out = torch.compile(flex_attention)(q, k, v, block_mask=block_mask)
    expected, _ = dense_reference(*inputs(gqa=False), None, causal, gqa=False)
    torch.testing.assert_close(out.cpu(), expected)
    assert all(g["tier"] == "inline" for g in compiled_graphs()[before:])


def test_flex_attention_on_the_cpu_is_unchanged() -> None:
    """The neuron adapter leaves PyTorch's own checks for other devices as they were."""
    q, k, v = leaves(inputs(gqa=False), "cpu")
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, k, v)
    q, k, v = inputs(gqa=False)
    out = flex_attention(q, k, v, block_mask=create_block_mask(causal, B, None, L, L, device="cpu"))
    torch.testing.assert_close(out, dense_reference(q, k, v, None, causal, gqa=False)[0])
