"""Tiny, randomly initialised Hugging Face models (no downloads) and their inputs, shared by
the transformers tests, the notebook and the benchmarks.

Each entry builds a model whose every size is small (hidden 32, two layers, a vocabulary
of 99) but whose code path is the real one: GPT-2 and BERT and T5 tie their output layer
to the input embedding, Llama and Mixtral and Qwen2-MoE use grouped-query attention,
rotary embeddings and (the last two) mixture-of-experts routing, T5 and Whisper are
encoder-decoders, ViT takes images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ModelSpec", "MODELS", "GENERATIVE", "TIED", "make_batch", "generation_inputs"]

VOCAB = 99
BOS, EOS, PAD = 0, 1, 1


@dataclass(frozen=True)
class ModelSpec:
    """One tiny model: its transformers classes, its config and what inputs it takes."""

    model_class: str
    config_class: str
    config: dict
    kind: str  # causal | mlm | seq2seq | image | audio

    def build(self, **overrides: Any) -> Any:
        """The model, freshly initialised (seed first for a reproducible one); ``overrides``
        change config fields (``attention_dropout=0.0``)."""
        import transformers as hf

        config = getattr(hf, self.config_class)(**{**self.config, **overrides})
        return getattr(hf, self.model_class)(config)


_TOKENS = {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD}

MODELS: dict[str, ModelSpec] = {
    "gpt2": ModelSpec("GPT2LMHeadModel", "GPT2Config", dict(
        vocab_size=VOCAB, n_positions=128, n_embd=32, n_layer=2, n_head=4, **_TOKENS), "causal"),
    "llama": ModelSpec("LlamaForCausalLM", "LlamaConfig", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.1, **_TOKENS), "causal"),
    "bert": ModelSpec("BertForMaskedLM", "BertConfig", dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128), "mlm"),
    "t5": ModelSpec("T5ForConditionalGeneration", "T5Config", dict(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=EOS), "seq2seq"),
    "vit": ModelSpec("ViTForImageClassification", "ViTConfig", dict(
        image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, num_labels=5, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1), "image"),
    "whisper": ModelSpec("WhisperForConditionalGeneration", "WhisperConfig", dict(
        vocab_size=VOCAB, num_mel_bins=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
        max_target_positions=32, decoder_start_token_id=2, dropout=0.1, begin_suppress_tokens=None,
        suppress_tokens=None, **_TOKENS), "audio"),
    "mixtral": ModelSpec("MixtralForCausalLM", "MixtralConfig", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
        **_TOKENS), "causal"),
    "qwen2_moe": ModelSpec("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, max_position_embeddings=128, **_TOKENS), "causal"),
}
GENERATIVE = [name for name, spec in MODELS.items() if spec.kind in ("causal", "seq2seq", "audio")]
TIED = ["gpt2", "bert", "t5"]  # output layer tied to the input embedding


def make_batch(kind: str, generator: torch.Generator, batch: int = 2, tokens: int = 12) -> dict[str, torch.Tensor]:
    """One training batch (on the CPU) for a model of this kind."""
    ids = torch.randint(2, VOCAB, (batch, tokens), generator=generator)
    if kind == "causal":
        return {"input_ids": ids, "labels": ids}
    if kind == "mlm":
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    if kind == "seq2seq":
        return {"input_ids": ids, "labels": torch.randint(2, VOCAB, (batch, tokens // 2 + 1), generator=generator)}
    if kind == "image":
        return {"pixel_values": torch.randn(batch, 3, 16, 16, generator=generator),
                "labels": torch.randint(0, 5, (batch,), generator=generator)}
    if kind == "audio":
        return {"input_features": torch.randn(batch, 8, 32, generator=generator),
                "labels": torch.randint(2, VOCAB, (batch, 6), generator=generator)}
    raise ValueError(f"unknown model kind {kind!r}")


def generation_inputs(kind: str, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The prompt of a greedy generate() call (on the CPU)."""
    if kind == "audio":
        return {"input_features": torch.randn(2, 8, 32, generator=generator)}
    ids = torch.randint(2, VOCAB, (2, 5), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
